"""A daily tide with sharp rises, shaped like the production traffic of the paper the planner
follows: the autoscaler comparison's trace. Pure.

That traffic climbs from an early-morning trough (about 34k samples/s) to an evening peak
(about 260k, 7.65x), weekends higher for longer; the HPA falls behind it "during the period of
workload spikes". What this generator models, per minute (minute 0 is a Monday 00:00 UTC):

* a **tide**: a piecewise-linear day through ``DAY_KNOTS`` (fractions of the weekday peak): the
  trough at 04:00, a slow climb, then three **rises** — the morning commute (07:30, +125 % in
  15 min), lunch (12:00, +36 % in 10 min) and the evening prime time (19:30, +54 % in 10 min) —
  and a slow fall from 22:30;
* **day-to-day variation**: each rise starts ``jitter_min`` (sd) earlier or later, each day's
  level is scaled by a factor with sd ``day_sd``; weekends run ``weekend`` higher from noon on;
* **noise**: multiplicative AR(1) (coefficient 0.95, sd ``noise``);
* **unannounced spikes** that no forecast can see: ``spikes_per_week`` at random times,
  +30..+70 % for 20-60 min with 5-minute ramps.

The rises recur every day at about the same time, so a seasonal forecast sees them coming; a
reactive policy sees each only when it has arrived. Deterministic for a seed.

Reference: kale 2.3 and fig. 2a, 4.4 and fig. 10 (docs/references.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from extender.plannersim.traces import MINUTES_PER_DAY, Trace, add_spikes, ar_noise

# (minute of the day, fraction of the weekday peak); a rise is two knots a few minutes apart.
DAY_KNOTS = (
    (0, 0.45),
    (240, 0.13),  # 04:00 trough (34k of 260k)
    (450, 0.20),  # 07:30 morning rise ...
    (465, 0.45),  # ... over 15 min
    (720, 0.55),  # 12:00 lunch rise ...
    (730, 0.75),  # ... over 10 min
    (840, 0.62),
    (1170, 0.65),  # 19:30 evening rise ...
    (1180, 1.00),  # ... over 10 min
    (1350, 1.00),  # 22:30
    (1440, 0.45),
)
RISES = (2, 4, 7)  # indices of the knots where a rise starts


@dataclass(frozen=True, slots=True)
class SurgeModel:
    peak: float = 260_000.0  # samples/s at the weekday evening peak (kale fig. 2a)
    jitter_min: float = 8.0  # sd of each rise's start, per day
    day_sd: float = 0.05  # sd of each day's level
    weekend: float = 0.12  # weekends run this much higher from noon on
    noise: float = 0.03  # sd of the AR(1) multiplicative noise
    spikes_per_week: int = 2


def _day(rng: np.random.Generator, m: SurgeModel, weekend: bool) -> npt.NDArray[np.float64]:
    xs = [float(x) for x, _ in DAY_KNOTS]
    ys = [y for _, y in DAY_KNOTS]
    for i in RISES:
        shift = float(np.clip(rng.normal(0.0, m.jitter_min), -3 * m.jitter_min, 3 * m.jitter_min))
        xs[i] += shift
        xs[i + 1] += shift
    minutes = np.arange(MINUTES_PER_DAY, dtype=float)
    day: npt.NDArray[np.float64] = np.interp(minutes, xs, ys)
    if weekend:
        day = day * np.where(minutes >= 720, 1.0 + m.weekend, 1.0)
    level = float(np.exp(rng.normal(0.0, m.day_sd)))
    return day * level * m.peak


def surge_trace(seed: int = 7, *, weeks: int = 3, model: SurgeModel | None = None) -> Trace:
    """``weeks`` weeks of per-minute samples/s; the last is evaluated, the others are history."""
    m = model or SurgeModel()
    rng = np.random.default_rng(seed)
    days = [_day(rng, m, d % 7 >= 5) for d in range(7 * weeks)]
    rate = np.concatenate(days)
    rate = rate * np.exp(ar_noise(rng, rate.size, m.noise))
    spikes = add_spikes(rate, rng, weeks, m.spikes_per_week, (0.3, 0.7), ramp_min=5)
    return Trace(rate=rate, spikes=spikes, history_weeks=weeks - 1)
