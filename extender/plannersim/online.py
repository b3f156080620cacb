"""One online job on the tidal trace, minute by minute, under three policies. Pure.

* ``forecast`` — the planner of :mod:`autoscaling` (seasonal forecast, NNLS model fitted to
  noisy measurements, short-lived changes stabilised away, lead ``W``, lag fallback), deciding
  every planning step;
* ``threshold`` — HPA-like: every minute ``desired = ceil(w · u / target)`` on the utilisation
  ``u`` over the last 5 minutes, 10 % tolerance, scale-down only to the largest
  recommendation of the last 5 minutes (HPA's stabilisation window);
* ``static`` — the peak of the history weeks plus 10 %, all week.

The job: the synchronous throughput model (:mod:`extender.planner.throughput`) with known θ is the
truth; the planner only sees its NNLS fit. A scaling action asked at ``t``: a rise holds the new
GPUs from ``t`` (they are being prelaunched), the new workers join at ``t + W`` and the job pauses
``pause_s`` to re-form; a fall pauses ``pause_s`` and releases at once. One action at a time. Lag is
how long the sample being consumed waited in the queue (first in, first out); SLO violation: lag
over 20 minutes.

The job's true model, its lag and the warmed forecaster serve :mod:`.autoscalers` too, the
finer-clocked comparison with Kubernetes' HPA.

Reference: kale 2.2, eq. 6, Algorithm 1 (docs/references.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from extender.planner.autoscaling import Measurements, OnlineSettings, Reason, plan_online
from extender.planner.forecasting import Seasonal, SeasonalState
from extender.planner.throughput import (
    Fit,
    Form,
    Observation,
    ThroughputModel,
    fit_throughput,
    min_workers,
)
from extender.plannersim.traces import Trace

TRUE_MODEL = ThroughputModel(Form.SYNC, (0.02, 1.6, 0.3, 0.000004), scale=16384.0)
SLO_LAG_S = 20 * 60.0


@dataclass(frozen=True, slots=True)
class OnlineResult:
    policy: str
    accumulated_lag_min: float  # sum over minutes of the lag in minutes (kale eq. 11)
    slo_violation: float  # fraction of minutes with lag > 20 min
    gpu_hours: float
    actions: int
    downtime_min: float
    workers: npt.NDArray[np.float64]  # GPUs held per minute
    lag_min: npt.NDArray[np.float64]


def consumed_up_to(
    arrivals: npt.NDArray[np.float64], consumed: float, p: int, now: int
) -> tuple[int, float | None]:
    """How far the job has consumed its arrivals (cumulative, per step) by step ``now``: the
    last step fully consumed (from ``p`` on), and the (fractional) step whose sample is being
    consumed, or None when nothing is waiting. The lag is ``now`` less that step."""
    while p + 1 < arrivals.size and arrivals[p + 1] <= consumed:
        p += 1
    if arrivals[now] - consumed <= 1e-6:
        return p, None
    span = arrivals[p + 1] - arrivals[p]
    frac = (consumed - arrivals[p]) / span if span > 0 else 0.0
    return p, p + frac


def measure_throughput(rng: np.random.Generator, counts: list[int]) -> list[Observation]:
    """Noisy (workers, samples/s) pairs, as a job's metrics would give them (3 % noise)."""
    return [
        Observation(w, TRUE_MODEL.predict(w) * float(rng.normal(1.0, 0.03)))
        for w in counts
        for _ in range(3)
    ]


def fitted_model(seed: int) -> Fit:
    rng = np.random.default_rng(seed + 1)
    return fit_throughput(measure_throughput(rng, [2, 4, 8, 16, 24, 32, 48, 64]), Form.SYNC, 16384)


Decide = Callable[[int, Measurements], int | None]


def _simulate(
    name: str, trace: Trace, settings: OnlineSettings, initial: int, decide: Decide
) -> OnlineResult:
    rate = trace.rate[trace.eval_start :]
    n = rate.size
    arrivals = np.concatenate([[0.0], np.cumsum(rate * 60.0)])  # A at each minute boundary
    consumed = 0.0
    serving = initial  # workers training now
    leased = initial
    pending: tuple[int, float, float] | None = None  # (count, join at, resume at) in minutes
    pause_until = -1.0
    workers = np.empty(n)
    lag = np.empty(n)
    actions = 0
    downtime = 0.0
    p = 0  # arrivals[p] <= consumed < arrivals[p + 1]
    lead_min = settings.lead_s / 60.0
    pause_min = settings.pause_s / 60.0
    recent: deque[float] = deque(maxlen=5)
    for k in range(n):
        if pending is not None and k >= pending[1]:
            serving = pending[0]
            leased = serving
            pause_until = pending[2]
            pending = None
        paused_frac = min(1.0, max(0.0, pause_until - k))  # pauses end inside a minute
        paused = paused_frac >= 1.0
        downtime += paused_frac
        capacity = (1.0 - paused_frac) * TRUE_MODEL.predict(serving) * 60.0
        consumed = min(arrivals[k + 1], consumed + capacity)
        backlog = arrivals[k + 1] - consumed
        p, served = consumed_up_to(arrivals, consumed, p, k + 1)
        lag_min = 0.0 if served is None else (k + 1) - served
        lag[k] = lag_min
        workers[k] = leased
        recent.append(float(rate[k]))
        if pending is None and not paused:
            m = Measurements(
                workers=serving,
                rate=sum(recent) / len(recent),
                backlog=backlog,
                lag_s=lag_min * 60.0,
            )
            target = decide(k, m)
            if target is not None and target != serving:
                actions += 1
                if target > serving:
                    leased = target
                    pending = (target, k + 1 + lead_min, k + 1 + lead_min + pause_min)
                else:
                    pending = (target, k + 1, k + 1 + pause_min)
                    leased = target
    return OnlineResult(
        policy=name,
        accumulated_lag_min=float(lag.sum()),
        slo_violation=float(np.mean(lag * 60.0 > SLO_LAG_S)),
        gpu_hours=float(workers.sum() / 60.0),
        actions=actions,
        downtime_min=float(downtime),
        workers=workers,
        lag_min=lag,
    )


def run_static(trace: Trace, settings: OnlineSettings, model: ThroughputModel) -> OnlineResult:
    peak = float(trace.rate[: trace.eval_start].max())
    w = min_workers(model, peak * 1.1, highest=settings.max_workers) or settings.max_workers
    return _simulate("static peak", trace, settings, w, lambda k, m: None)


def run_threshold(
    trace: Trace,
    settings: OnlineSettings,
    model: ThroughputModel,
    *,
    target: float = 0.8,
    tolerance: float = 0.1,
    window_min: int = 5,
) -> OnlineResult:
    start = trace.rate[trace.eval_start]
    initial = min_workers(model, start / target, highest=settings.max_workers) or 1
    history: deque[int] = deque(maxlen=window_min)

    def decide(k: int, m: Measurements) -> int | None:
        capacity = model.predict(m.workers)
        util = 1.0 if m.backlog > capacity * 60.0 else min(1.0, m.rate / capacity)
        ratio = util / target
        desired = m.workers
        if abs(ratio - 1.0) > tolerance:
            desired = math.ceil(m.workers * ratio)
        desired = max(settings.min_workers, min(settings.max_workers, desired))
        history.append(desired)
        if desired < m.workers:
            desired = max(history)  # scale-down stabilisation
        return desired if desired != m.workers else None

    return _simulate("threshold (HPA-like)", trace, settings, initial, decide)


def warmed_forecaster(trace: Trace, settings: OnlineSettings) -> tuple[Seasonal, SeasonalState]:
    """The forecaster and its state after the trace's history, one planning step at a time."""
    forecaster = Seasonal()
    step_min = int(settings.step_s // 60)
    state: SeasonalState = forecaster.initial()
    history = trace.rate[: trace.eval_start]
    for b in range(0, history.size, step_min):
        state = forecaster.observe(state, b * 60.0, float(history[b : b + step_min].mean()))
    return forecaster, state


def run_forecast(
    trace: Trace, settings: OnlineSettings, model: ThroughputModel
) -> tuple[OnlineResult, dict[str, int]]:
    forecaster, state = warmed_forecaster(trace, settings)
    step_min = int(settings.step_s // 60)
    base = trace.eval_start
    eval_rate = trace.rate[base:]
    reasons: dict[str, int] = {r.value: 0 for r in Reason}
    holder = {"state": state}

    def decide(k: int, m: Measurements) -> int | None:
        if k % step_min:
            return None
        if k >= step_min:  # observe the last planning step's traffic
            seen = float(eval_rate[k - step_min : k].mean())
            holder["state"] = forecaster.observe(
                holder["state"], (base + k - step_min) * 60.0, seen
            )
        now_s = (base + k) * 60.0
        forecast = [
            forecaster.predict(holder["state"], now_s + j * settings.step_s)
            for j in range(settings.horizon_steps + 1)
        ]
        decision = plan_online(forecast, model, m, settings)
        reasons[decision.reason.value] += 1
        return decision.workers if decision.workers != m.workers else None

    first = [
        forecaster.predict(state, base * 60.0 + j * settings.step_s)
        for j in range(settings.horizon_steps + 1)
    ]
    initial = plan_online(first, model, Measurements(1, first[0], 0.0, 0.0), settings).workers
    return _simulate("forecast planner", trace, settings, initial, decide), reasons


def forecast_error(trace: Trace, step_min: int = 5) -> float:
    """MAPE (%) of the seasonal forecast one planning step ahead over the evaluated week."""
    forecaster = Seasonal()
    state = forecaster.initial()
    errors = []
    for b in range(0, trace.rate.size - step_min, step_min):
        actual = float(trace.rate[b : b + step_min].mean())
        if b >= trace.eval_start:
            predicted = forecaster.predict(state, b * 60.0)
            errors.append(abs(predicted - actual) / actual)
        state = forecaster.observe(state, b * 60.0, actual)
    return float(np.mean(errors) * 100.0)
