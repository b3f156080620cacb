"""The online planner: forecast -> minimal workers -> stabilised plan -> target, with a
reactive fallback on measured lag. Pure: the caller gives the forecast, the model and the
measurements; :func:`plan_online` returns the workers to hold now and why.

For each step of the forecast, the fewest workers whose predicted throughput exceeds the
predicted traffic (:mod:`extender.planner.throughput`); that series, led by the count held now,
is stabilised (:mod:`extender.planner.stabilizing`: a count that would last less than ``tau_s``
takes the larger of its neighbours), so that short-lived changes are not made.

Lead time. Workers asked for now are serving only after the prelaunch window ``W`` (how long a new
worker takes to be ready: :mod:`common.prelaunch`, computed elsewhere and passed in as ``lead_s``)
plus the pause of the restart. So the target now is the largest stabilised count over
``[now, now + lead_s + pause_s]``: capacity for a rise is asked for ``W`` ahead of it, and capacity
is only released once no step inside the window still needs it.

Fallback. When the measured lag exceeds ``lag_threshold_s`` the forecast was wrong (a spike, a
slower GPU): the target becomes at least the fewest workers that both keep up with the measured
rate and drain the backlog within ``drain_s``.

Reference: kale 3.4 (3.4.1 eq. 10, 3.4.2 Algorithm 1, 3.4.3); weflex eq. 1-3 (docs/references.md).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from extender.planner.stabilizing import DEFAULT_RHO, DEFAULT_TAU_S, stabilize_with_reasons
from extender.planner.throughput import CapacityTable, ThroughputModel


class Reason(enum.Enum):
    FORECAST = "forecast"  # the stabilised forecast plan
    FALLBACK_LAG = "fallback-lag"  # measured lag over the threshold: reactive scale-up
    CAPPED = "capped"  # even the most workers allowed cannot carry the forecast


@dataclass(frozen=True, slots=True)
class OnlineSettings:
    step_s: float = 300.0  # planning step: one forecast point and one plan entry per step
    horizon_steps: int = 24  # how far the plan looks (2 h at 5 min)
    lead_s: float = 600.0  # prelaunch window W (weflex eq. 1-3), seconds
    pause_s: float = 120.0  # pause-and-restart of a scaling action
    rho: int = DEFAULT_RHO
    tau_s: float = DEFAULT_TAU_S
    min_workers: int = 1
    max_workers: int = 256
    lag_threshold_s: float = 300.0  # fallback trigger
    drain_s: float = 900.0  # the fallback drains the backlog within this
    headroom: float = 0.0  # plan for forecast * (1 + headroom); 0: the forecast as is (kale eq. 10)

    def validate(self) -> list[str]:
        problems = []
        if self.step_s <= 0:
            problems.append("step_s must be positive")
        if self.horizon_steps < 1:
            problems.append("horizon_steps must be at least 1")
        if self.lead_s < 0 or self.pause_s < 0:
            problems.append("lead_s and pause_s must not be negative")
        if self.rho < 1:
            problems.append("rho must be at least 1")
        if not 1 <= self.min_workers <= self.max_workers:
            problems.append("want 1 <= min_workers <= max_workers")
        if self.drain_s <= 0:
            problems.append("drain_s must be positive")
        if self.headroom < 0:
            problems.append("headroom must not be negative")
        return problems


@dataclass(frozen=True, slots=True)
class Measurements:
    workers: int  # held now
    rate: float  # measured incoming samples/s
    backlog: float  # samples waiting
    lag_s: float  # sojourn time of the sample being consumed now


@dataclass(frozen=True, slots=True)
class OnlineDecision:
    workers: int
    reason: Reason
    initial_plan: tuple[int, ...]  # fewest workers per step (kale eq. 10), led by the count now
    plan: tuple[int, ...]  # after the stabilisation (kale Algorithm 1)
    calibrations: int


def workers_for(table: CapacityTable, traffic: float, s: OnlineSettings) -> tuple[int, bool]:
    """The fewest workers that carry ``traffic`` (kale eq. 10), within the allowed range;
    ``(max_workers, True)`` when not even that is enough."""
    w = table.min_workers(traffic)
    return (s.max_workers, True) if w is None else (w, False)


def plan_online(
    forecast: Sequence[float],
    model: ThroughputModel,
    now: Measurements,
    settings: OnlineSettings,
) -> OnlineDecision:
    """Workers to hold from now on.

    ``forecast[k]`` is the predicted rate at ``now + k * step_s`` for ``k = 0..horizon``. The
    series handed to the stabilisation (kale Algorithm 1) starts with the count held now, so
    that a short excursion right at the start of the plan is calibrated like any other.
    """
    table = CapacityTable.build(model, settings.min_workers, settings.max_workers)
    counts: list[int] = []
    capped = False
    for rate in forecast:
        w, c = workers_for(table, rate * (1.0 + settings.headroom), settings)
        counts.append(w)
        capped = capped or c
    initial = (now.workers, *counts)
    plan, calibrations = stabilize_with_reasons(
        initial, settings.step_s, rho=settings.rho, tau_s=settings.tau_s
    )
    window = math.ceil((settings.lead_s + settings.pause_s) / settings.step_s)
    future = plan[1 : 2 + window] or plan[-1:]
    target = max(future)
    reason = Reason.CAPPED if capped and target >= settings.max_workers else Reason.FORECAST
    if now.lag_s > settings.lag_threshold_s:
        needed = now.rate + now.backlog / settings.drain_s
        reactive, _ = workers_for(table, needed, settings)
        reactive = max(reactive, now.workers)
        if reactive > target:
            target, reason = reactive, Reason.FALLBACK_LAG
    return OnlineDecision(
        workers=target,
        reason=reason,
        initial_plan=initial,
        plan=plan,
        calibrations=len(calibrations),
    )
