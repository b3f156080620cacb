"""The embedded tidal trace of the planner's simulator: three weeks of per-minute traffic. Pure.

Shaped after the production traffic of the paper the planner follows: a working day climbs from a
night trough (about 34k samples/s) to an evening peak (about 260k), weekends run higher for longer;
multiplicative AR(1) noise, and a few unannounced spikes (+40..+90 % for 20-60 min) that no forecast
can see. Minute 0 is a Monday 00:00 UTC. Deterministic for a seed.

Reference: kale fig. 2a (docs/references.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MINUTES_PER_DAY = 1440
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY

# Fraction of the weekday peak at each hour of the day (UTC), interpolated per minute.
WEEKDAY = (
    0.30, 0.22, 0.17, 0.14, 0.13, 0.14, 0.20, 0.32, 0.45, 0.55, 0.60, 0.63,
    0.66, 0.64, 0.62, 0.64, 0.68, 0.75, 0.85, 0.95, 1.00, 0.97, 0.80, 0.50,
)  # fmt: skip
WEEKEND = (
    0.34, 0.26, 0.19, 0.15, 0.13, 0.14, 0.18, 0.28, 0.45, 0.65, 0.78, 0.85,
    0.90, 0.90, 0.88, 0.88, 0.90, 0.94, 1.00, 1.08, 1.12, 1.08, 0.90, 0.56,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Spike:
    start_min: int
    length_min: int
    height: float  # +fraction at the top


@dataclass(frozen=True, slots=True)
class Trace:
    rate: npt.NDArray[np.float64]  # samples/s, one per minute
    spikes: tuple[Spike, ...]
    history_weeks: int  # weeks before the evaluated one

    @property
    def eval_start(self) -> int:
        return self.history_weeks * MINUTES_PER_WEEK


def _profile(hours: tuple[float, ...]) -> npt.NDArray[np.float64]:
    knots = np.array([*hours, hours[0]], dtype=float)
    x = np.arange(MINUTES_PER_DAY) / 60.0
    out: npt.NDArray[np.float64] = np.interp(x, np.arange(25), knots)
    return out


def tidal_trace(
    seed: int = 7,
    *,
    weeks: int = 3,
    peak: float = 260_000.0,
    noise: float = 0.04,
    spikes_per_week: int = 4,
) -> Trace:
    rng = np.random.default_rng(seed)
    weekday, weekend = _profile(WEEKDAY), _profile(WEEKEND)
    days = [weekend if d % 7 >= 5 else weekday for d in range(7 * weeks)]
    base = np.concatenate(days) * peak
    rate = base * np.exp(ar_noise(rng, base.size, noise))
    spikes = add_spikes(rate, rng, weeks, spikes_per_week, (0.4, 0.9), ramp_min=8)
    return Trace(rate=rate, spikes=spikes, history_weeks=weeks - 1)


def ar_noise(rng: np.random.Generator, n: int, noise: float) -> npt.NDArray[np.float64]:
    """``n`` minutes of AR(1) noise (phi 0.95) whose stationary deviation is ``noise``: the
    log of the traffic's multiplicative noise."""
    eps = rng.normal(0.0, noise * np.sqrt(1 - 0.95**2), n)
    ar = np.empty(n)
    acc = 0.0
    for i in range(n):
        acc = 0.95 * acc + float(eps[i])
        ar[i] = acc
    return ar


def add_spikes(
    rate: npt.NDArray[np.float64],
    rng: np.random.Generator,
    weeks: int,
    per_week: int,
    heights: tuple[float, float],
    *,
    ramp_min: int,
) -> tuple[Spike, ...]:
    """Unannounced spikes, ``per_week`` a week, of 20-60 minutes and a height drawn from
    ``heights`` (a share of the traffic), ramping up and down over ``ramp_min`` minutes:
    multiplied into ``rate`` in place; the spikes."""
    spikes: list[Spike] = []
    for week in range(weeks):
        for _ in range(per_week):
            start = week * MINUTES_PER_WEEK + int(rng.integers(0, MINUTES_PER_WEEK - 90))
            length = int(rng.integers(20, 61))
            height = float(rng.uniform(*heights))
            spikes.append(Spike(start, length, height))
            t = np.arange(length)
            shape = np.minimum(1.0, np.minimum(t + 1, length - t) / float(ramp_min))
            rate[start : start + length] *= 1.0 + height * shape
    return tuple(spikes)
