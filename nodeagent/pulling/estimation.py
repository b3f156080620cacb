"""What a link can do: request latency and rate, from a probe and then from every transfer.
Pure.

The probe is two timed range requests on the same connection: a tiny one (its time is the
latency: time to first byte) and a small one (its time beyond the first byte gives the rate).
Every shard then gives a fresh sample (time to first byte; bytes over the time after it), folded
in with an exponentially weighted mean so the plan follows a link that speeds up or slows down.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MIN_RATE = 1e3  # bytes/s: a floor so that a stalled sample cannot zero a link
_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class LinkEstimate:
    latency_s: float
    rate: float  # bytes per second
    samples: int = 1

    def observe(
        self, nbytes: int, first_byte_s: float, total_s: float, *, weight: float = 0.5
    ) -> LinkEstimate:
        """Fold in one transfer of ``nbytes`` whose first byte came after ``first_byte_s`` and
        whose last after ``total_s``."""
        latency = max(0.0, first_byte_s)
        rate = max(MIN_RATE, nbytes / max(total_s - latency, _EPS))
        return replace(
            self,
            latency_s=(1 - weight) * self.latency_s + weight * latency,
            rate=(1 - weight) * self.rate + weight * rate,
            samples=self.samples + 1,
        )


def from_probe(
    *, tiny_s: float, small_bytes: int, small_first_byte_s: float, small_total_s: float
) -> LinkEstimate:
    """An estimate from the probe: a tiny range (its time is all latency) and a small range."""
    latency = max(0.0, min(tiny_s, small_first_byte_s))
    rate = max(MIN_RATE, small_bytes / max(small_total_s - small_first_byte_s, _EPS))
    return LinkEstimate(latency_s=latency, rate=rate)
