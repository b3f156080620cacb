"""Traffic forecasting (the samples/s a job will receive at each coming planning step) behind
a small interface, with a seasonal default. Pure.

The paper the planner follows uses a FEDformer-style Transformer and says the forecaster is
pluggable. The default here is a seasonal profile with exponential smoothing, numpy-free and cheap
enough to update every planning step: an hour-of-week profile captures the weekly tide (weekends
differ from weekdays), an hour-of-day profile stands in for hours of the week not seen yet (the
first week), and an exponentially smoothed level tracks how this week differs from the last::

    p(t)   = profile at t, interpolated linearly between bucket centres
    level ← alpha * y / p(t) + (1 - alpha) * level          (clamped to 0.5..2 per observation)
    s[b]  ← s[b] + gamma * (y - p(t))                    (b: the hour-of-week bucket of t)
    y_hat(t)  = level * p(t)
State is a frozen value: ``observe`` returns a new one, so a planner can be replayed.

Reference: kale 3.2 (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

HOUR_S = 3600.0
DAY_S = 24 * HOUR_S
WEEK_S = 7 * DAY_S
WEEK_BUCKETS = 168
DAY_BUCKETS = 24

S = TypeVar("S")


class Forecaster(Protocol[S]):
    """A traffic forecaster: a state folded over observations, queried for any future time."""

    def initial(self) -> S: ...

    def observe(self, state: S, at_s: float, value: float) -> S: ...

    def predict(self, state: S, at_s: float) -> float: ...


def fold(forecaster: Forecaster[S], samples: Sequence[tuple[float, float]]) -> S:
    """The state after observing ``(time, value)`` samples in order."""
    state = forecaster.initial()
    for at_s, value in samples:
        state = forecaster.observe(state, at_s, value)
    return state


@dataclass(frozen=True, slots=True)
class LastValueState:
    value: float = 0.0


@dataclass(frozen=True, slots=True)
class LastValue:
    """The null forecaster: tomorrow is now. What a reactive policy implicitly assumes."""

    def initial(self) -> LastValueState:
        return LastValueState()

    def observe(self, state: LastValueState, at_s: float, value: float) -> LastValueState:
        return LastValueState(value)

    def predict(self, state: LastValueState, at_s: float) -> float:
        return state.value


@dataclass(frozen=True, slots=True)
class SeasonalState:
    weekly: tuple[float, ...] = (0.0,) * WEEK_BUCKETS  # 0.0: bucket not seen yet
    daily: tuple[float, ...] = (0.0,) * DAY_BUCKETS
    level: float = 1.0  # smoothed ratio of the traffic to last week's profile
    observations: int = 0


def _interpolate(profile: tuple[float, ...], position: float) -> float:
    """Profile value at a fractional bucket position (bucket centres at k + 0.5), wrapping;
    an unseen neighbour (0.0) gives way to the seen one."""
    n = len(profile)
    x = position - 0.5
    lo = int(x // 1) % n
    hi = (lo + 1) % n
    frac = x - (x // 1)
    a, b = profile[lo], profile[hi]
    if a <= 0.0:
        return b
    if b <= 0.0:
        return a
    return a + (b - a) * frac


@dataclass(frozen=True, slots=True)
class Seasonal:
    """Hour-of-week profile, error-corrected, with a smoothed level (the default forecaster).

    ``epoch_s`` fixes where the week starts (default: the Unix epoch; only the phase must be
    the same for every call).
    """

    alpha: float = 0.1  # level smoothing, per observation
    gamma: float = 0.3  # profile correction, per observation
    epoch_s: float = 0.0

    def initial(self) -> SeasonalState:
        return SeasonalState()

    def _positions(self, at_s: float) -> tuple[float, float]:
        t = at_s - self.epoch_s
        return (t % WEEK_S) / HOUR_S, (t % DAY_S) / HOUR_S

    def observe(self, state: SeasonalState, at_s: float, value: float) -> SeasonalState:
        value = max(value, 0.0)
        week_pos, day_pos = self._positions(at_s)
        wb, db = int(week_pos) % WEEK_BUCKETS, int(day_pos) % DAY_BUCKETS
        weekly, daily = list(state.weekly), list(state.daily)
        level = state.level
        if weekly[wb] > 0.0:
            expected = _interpolate(state.weekly, week_pos)
            if expected > 0.0:
                ratio = min(2.0, max(0.5, value / expected))
                level = self.alpha * ratio + (1.0 - self.alpha) * level
            weekly[wb] += self.gamma * (value - expected)
        else:
            weekly[wb] = value
        if daily[db] > 0.0:
            daily[db] += self.gamma * (value - _interpolate(state.daily, day_pos))
        else:
            daily[db] = value
        return replace(
            state,
            weekly=tuple(max(w, 1e-9) if w != 0.0 else 0.0 for w in weekly),
            daily=tuple(max(d, 1e-9) if d != 0.0 else 0.0 for d in daily),
            level=level,
            observations=state.observations + 1,
        )

    def predict(self, state: SeasonalState, at_s: float) -> float:
        if state.observations == 0:
            return 0.0
        week_pos, day_pos = self._positions(at_s)
        if state.weekly[int(week_pos) % WEEK_BUCKETS] > 0.0:
            return state.level * _interpolate(state.weekly, week_pos)
        return _interpolate(state.daily, day_pos)
