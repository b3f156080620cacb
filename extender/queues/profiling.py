"""A job's throughput profile (its throughput at each GPU count) and the scaling factors it gives
(how much a job speeds up per extra GPU). Pure; :mod:`extender.queues.measuring` measures
profiles live.

A job is grown one GPU at a time from 1 to twice its request; at each count it trains 5
batches, the first 2 are warm-up and the mean throughput of the last 3 is kept. The scaling
factor of a job at ``j`` GPUs is the throughput gained by its next GPU relative to the gain of
its second::

    S^1 = 1,    S^j = (T^(j+1) - T^j) / (T^2 - T^1)  for j > 1

A linear job has ``S = 1`` everywhere, a sub-linear one ``S < 1`` past its knee. Non-elastic
jobs are not profiled and have ``S = 1`` (to compare with the others).

Reference: cornucopia 4.3, Algorithm 1 and eq. 1 (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.errors import InvalidInput

WARMUP_BATCHES = 2


@dataclass(frozen=True, slots=True)
class Profile:
    """Throughput ``T^j`` (samples/s) at ``j = 1..len(throughput)`` GPUs; empty: not profiled."""

    throughput: tuple[float, ...] = ()

    @property
    def max_gpus(self) -> int:
        return len(self.throughput)

    def at(self, gpus: int) -> float:
        """Throughput with ``gpus`` GPUs; past the profile, the last measured gain continues."""
        if gpus <= 0 or not self.throughput:
            return 0.0
        if gpus <= len(self.throughput):
            return self.throughput[gpus - 1]
        t = self.throughput
        step = t[-1] - t[-2] if len(t) >= 2 else t[-1]
        return t[-1] + max(step, 0.0) * (gpus - len(t))

    def scaling_factor(self, j: int) -> float:
        """Eq. 1: ``S^j``, the gain of the ``(j+1)``-th GPU relative to the second's."""
        if j <= 1 or len(self.throughput) < 2:
            return 1.0
        base = self.throughput[1] - self.throughput[0]
        if base <= 0.0:
            return 0.0
        return (self.at(j + 1) - self.at(j)) / base


def scaling_factors(profile: Profile) -> tuple[float, ...]:
    """``S^1 .. S^(n-1)`` of a profile with ``n`` counts (cornucopia eq. 1)."""
    return tuple(profile.scaling_factor(j) for j in range(1, profile.max_gpus))


def ramp_up_counts(requested: int) -> tuple[int, ...]:
    """The GPU counts the ramp-up profiler measures: 1 to twice the request (cornucopia
    Algorithm 1)."""
    return tuple(range(1, 2 * requested + 1))


def profile_from_batches(
    batch_seconds: Mapping[int, Sequence[float]], per_gpu_batch: float
) -> Profile:
    """A profile from the timed batches at each count (cornucopia Algorithm 1, lines 3-4): warm-up
    batches dropped, the throughput of the rest averaged. Data parallel: with ``g`` GPUs one
    batch is ``g * per_gpu_batch`` samples."""
    problems = []
    counts = sorted(batch_seconds)
    if counts != list(range(1, len(counts) + 1)):
        problems.append(f"want counts 1..n without gaps, got {counts}")
    for g in counts:
        if len(batch_seconds[g]) <= WARMUP_BATCHES:
            problems.append(f"{g} GPUs: want more than {WARMUP_BATCHES} batches")
        elif any(t <= 0 for t in batch_seconds[g]):
            problems.append(f"{g} GPUs: batch times must be positive")
    if problems:
        raise InvalidInput(problems)
    throughput = []
    for g in counts:
        kept = batch_seconds[g][WARMUP_BATCHES:]
        throughput.append(sum(g * per_gpu_batch / t for t in kept) / len(kept))
    return Profile(tuple(throughput))
