"""The autoscaler comparison: one online job on a 15-second clock under the forecast planner,
Kubernetes' HPA and static peak provisioning, new workers useful only after the prelaunch
window ``W``. Pure.

Finer than :mod:`.online`'s minute steps: pods start in batches (several scale-ups may be
starting at once), a scale-down cancels starting workers first, and the HPA (:mod:`.hpa`) reads
the ready workers' GPU utilisation every sync period. The job, its lag and the planner's
forecaster are :mod:`.online`'s.

It repeats, in simulation, the comparison that the paper the planner follows makes between its
forecast planner and the HPA, which added workers late on every rise.

Reference: kale 1, 3.4, 4.4 (docs/references.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from extender.planner.autoscaling import Measurements, OnlineSettings, Reason, plan_online
from extender.planner.throughput import ThroughputModel, min_workers
from extender.plannersim.hpa import HpaSettings, HpaState
from extender.plannersim.hpa import decide as hpa_decide
from extender.plannersim.online import SLO_LAG_S, TRUE_MODEL, consumed_up_to, warmed_forecaster
from extender.plannersim.traces import Trace


@dataclass(frozen=True, slots=True)
class AutoscalerSettings:
    """How the autoscaler comparison runs (docs/planner.md, "Kale reproduced")."""

    tick_s: float = 15.0  # simulation step: the HPA's sync period
    prelaunch_s: float = 600.0  # W: a new worker is useful this long after it is asked for
    pause_s: float = 30.0  # the job re-forms (pause-and-restart) when its worker count changes
    metric_window_s: float = 60.0  # the HPA's utilisation is averaged over this
    rate_window_s: float = 300.0  # the planner's measured rate is averaged over this
    static_margin: float = 0.1  # static: the history's peak plus this
    paused_reads_idle: bool = True  # a paused job's GPUs read 0 % (else: no metric while paused)

    def validate(self) -> list[str]:
        problems = []
        if self.tick_s <= 0 or 60.0 % self.tick_s:
            problems.append("tick_s must divide a minute")
        if self.prelaunch_s < 0 or self.pause_s < 0:
            problems.append("prelaunch_s and pause_s must not be negative")
        if self.metric_window_s < self.tick_s or self.rate_window_s < self.tick_s:
            problems.append("metric and rate windows must be at least one tick")
        return problems


@dataclass(frozen=True, slots=True)
class Tick:
    """What a policy sees at the end of a tick."""

    t_s: float  # seconds since the evaluated week began
    ready: int  # workers training
    starting: int  # workers asked for, not useful yet (inside W)
    utilisation: float | None  # ready workers' mean utilisation over the metric window (None:
    # no metric: paused all through the window and ``paused_reads_idle`` is off)
    rate: float  # mean incoming samples/s over the rate window
    backlog: float  # samples waiting
    lag_s: float


Policy = Callable[[Tick], int | None]  # replicas wanted (None: leave them)


@dataclass(frozen=True, slots=True)
class AutoscalerResult:
    policy: str
    slo_violation: float  # share of time (sampled every tick) with lag > 20 min
    mean_lag_min: float
    accumulated_lag_min: float  # integral of lag over time, minutes x minutes (kale eq. 11)
    max_lag_min: float
    gpu_hours: float  # workers held (ready + starting) x time
    actions: int  # changes of the replica count
    downtime_min: float
    workers: npt.NDArray[np.float64]  # workers held, per minute
    lag_min: npt.NDArray[np.float64]  # lag at the end of each minute


def _mean_utilisation(busy: deque[tuple[float, float]]) -> float | None:
    metered = sum(m for _, m in busy)
    return sum(b for b, _ in busy) / metered if metered > 1e-9 else None


def simulate_ticks(
    name: str,
    rate_per_min: npt.NDArray[np.float64],
    s: AutoscalerSettings,
    initial: int,
    policy: Policy,
) -> AutoscalerResult:
    """One online job over ``rate_per_min``, every ``tick_s``.

    A scale-up asked at ``t`` holds its GPUs from ``t`` and its workers join at ``t + W``; a
    join re-forms the job (pause ``pause_s``). A scale-down cancels workers still starting first
    (newest first), then removes ready ones at once, which re-forms the job. Several scale-ups
    may be starting at a time. Lag is the FIFO sojourn time of the sample being consumed.
    """
    per_min = round(60.0 / s.tick_s)
    rate = np.repeat(np.asarray(rate_per_min, dtype=float), per_min)
    n = rate.size
    arrivals = np.concatenate([[0.0], np.cumsum(rate * s.tick_s)])
    capacity_of: dict[int, float] = {}

    def capacity(w: int) -> float:
        if w not in capacity_of:
            capacity_of[w] = TRUE_MODEL.predict(w) if w > 0 else 0.0
        return capacity_of[w]

    ready = initial
    starting: list[tuple[float, int]] = []  # (join at s, workers)
    pause_until = -1.0
    consumed = 0.0
    p = 0
    metric_n = max(1, round(s.metric_window_s / s.tick_s))
    rate_n = max(1, round(s.rate_window_s / s.tick_s))
    busy: deque[tuple[float, float]] = deque(maxlen=metric_n)  # (busy s, metered s) per tick
    held = np.empty(n)
    lag = np.empty(n)
    actions = 0
    downtime = 0.0
    for k in range(n):
        t0 = k * s.tick_s
        t1 = t0 + s.tick_s
        while starting and starting[0][0] <= t0:
            ready += starting.pop(0)[1]
            pause_until = max(pause_until, t0 + s.pause_s)
        paused = min(1.0, max(0.0, (pause_until - t0) / s.tick_s))
        downtime += paused * s.tick_s
        full = capacity(ready) * s.tick_s
        before = consumed
        consumed = min(arrivals[k + 1], consumed + (1.0 - paused) * full)
        metered = s.tick_s if s.paused_reads_idle else (1.0 - paused) * s.tick_s
        busy.append(((consumed - before) / full * s.tick_s if full > 0 else 0.0, metered))
        backlog = arrivals[k + 1] - consumed
        p, served = consumed_up_to(arrivals, consumed, p, k + 1)
        lag_s = 0.0 if served is None else t1 - served * s.tick_s
        lag[k] = lag_s
        pending = sum(c for _, c in starting)
        held[k] = ready + pending
        lo = max(0, k + 1 - rate_n)
        seen = Tick(
            t_s=t1,
            ready=ready,
            starting=pending,
            utilisation=_mean_utilisation(busy),
            rate=float((arrivals[k + 1] - arrivals[lo]) / ((k + 1 - lo) * s.tick_s)),
            backlog=backlog,
            lag_s=lag_s,
        )
        wanted = policy(seen)
        if wanted is None or wanted == ready + pending:
            continue
        actions += 1
        if wanted > ready + pending:
            starting.append((t1 + s.prelaunch_s, wanted - ready - pending))
            continue
        cut = ready + pending - wanted
        while cut and starting:
            at, c = starting.pop()
            if c > cut:
                starting.append((at, c - cut))
                cut = 0
            else:
                cut -= c
        if cut:
            ready -= cut
            pause_until = max(pause_until, t1 + s.pause_s)
    lag_min = lag / 60.0
    minute_end = slice(per_min - 1, None, per_min)
    return AutoscalerResult(
        policy=name,
        slo_violation=float(np.mean(lag > SLO_LAG_S)),
        mean_lag_min=float(lag_min.mean()),
        accumulated_lag_min=float(lag_min.sum() * s.tick_s / 60.0),
        max_lag_min=float(lag_min.max()),
        gpu_hours=float(held.sum() * s.tick_s / 3600.0),
        actions=actions,
        downtime_min=downtime / 60.0,
        workers=held.reshape(-1, per_min).max(axis=1),
        lag_min=lag_min[minute_end],
    )


def static_peak(
    trace: Trace, s: AutoscalerSettings, model: ThroughputModel, *, top: int = 96
) -> AutoscalerResult:
    """Static peak provisioning: enough for the history's peak plus ``static_margin`` (at most
    ``top`` workers), all week."""
    peak = float(trace.rate[: trace.eval_start].max())
    w = min_workers(model, peak * (1.0 + s.static_margin), highest=top) or top
    return simulate_ticks("static peak", trace.rate[trace.eval_start :], s, w, lambda seen: None)


def hpa_autoscaler(
    trace: Trace, s: AutoscalerSettings, model: ThroughputModel, hpa: HpaSettings
) -> AutoscalerResult:
    """Kubernetes' HPA on the workers' GPU utilisation (:mod:`.hpa`), every ``sync_s``."""
    start = float(trace.rate[trace.eval_start])
    initial = min_workers(model, start / hpa.target, highest=hpa.max_replicas) or 1
    every = max(1, round(hpa.sync_s / s.tick_s))
    state = HpaState()
    ticks = 0

    def policy(seen: Tick) -> int | None:
        nonlocal state, ticks
        ticks += 1
        if ticks % every or seen.utilisation is None:
            return None  # not a sync, or no metric: the HPA leaves the replicas as they are
        wanted, state = hpa_decide(
            state, seen.t_s, seen.ready, seen.starting, seen.utilisation, hpa
        )
        return wanted

    name = f"HPA (GPU utilisation, target {hpa.target * 100:.0f} %)"
    return simulate_ticks(name, trace.rate[trace.eval_start :], s, initial, policy)


def forecast_autoscaler(
    trace: Trace, s: AutoscalerSettings, settings: OnlineSettings, model: ThroughputModel
) -> tuple[AutoscalerResult, dict[str, int]]:
    """The forecast planner (:func:`~extender.planner.autoscaling.plan_online`; kale 3.4)
    deciding every planning step, its lead ``lead_s``."""
    forecaster, state = warmed_forecaster(trace, settings)
    step_min = int(settings.step_s // 60)
    base = trace.eval_start
    eval_rate = trace.rate[base:]
    reasons: dict[str, int] = {r.value: 0 for r in Reason}
    holder = {"state": state}

    def forecast_at(now_s: float) -> list[float]:
        return [
            forecaster.predict(holder["state"], now_s + j * settings.step_s)
            for j in range(settings.horizon_steps + 1)
        ]

    def policy(seen: Tick) -> int | None:
        k = round(seen.t_s / 60.0)  # minutes since the evaluated week began
        if abs(seen.t_s - k * 60.0) > 1e-6 or k % step_min:
            return None
        seen_rate = float(eval_rate[k - step_min : k].mean())
        holder["state"] = forecaster.observe(
            holder["state"], (base + k - step_min) * 60.0, seen_rate
        )
        held = seen.ready + seen.starting
        m = Measurements(workers=held, rate=seen.rate, backlog=seen.backlog, lag_s=seen.lag_s)
        decision = plan_online(forecast_at((base + k) * 60.0), model, m, settings)
        reasons[decision.reason.value] += 1
        return decision.workers

    first = forecast_at(base * 60.0)
    initial = plan_online(first, model, Measurements(1, first[0], 0.0, 0.0), settings).workers
    name = "forecast planner (kale)"
    return simulate_ticks(name, eval_rate, s, initial, policy), reasons
