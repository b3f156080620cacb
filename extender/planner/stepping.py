"""One live planning step for one GpuLease, pure: its annotations and what its metrics say ->
the GPUs to hold now and why.

The live planner (:mod:`extender.planner.controller`) gathers :class:`Observations` from a
traffic source and hands them here; this module turns them into the inputs of
:func:`~extender.planner.autoscaling.plan_online` exactly as the simulator does:

* the traffic history (``(time, samples/s)`` every planning step) is folded into the seasonal
  forecaster from scratch, and the forecast read at ``now + k * step_s`` for the horizon;
* the ``(workers, samples/s)`` pairs of the throughput history are fitted by non-negative least
  squares (NNLS) to the throughput model, synchronous or asynchronous training
  (:func:`~extender.planner.throughput.fit_throughput`);
* the measured rate, backlog and lag of now feed the lag fallback.

Nothing is kept between steps: a restarted planner reads the same history again and decides the
same way. GPUs are workers times the lease's ``gpusPerReplica`` (one worker per replica).

Reference: kale eq. 6 and 9 (docs/references.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from common import contract
from common.errors import InvalidInput
from common.queryscope import DEFAULT_LABEL, refusal, scope_query, valid_label
from extender.planner.autoscaling import Measurements, OnlineSettings, plan_online
from extender.planner.directives import gpus_for
from extender.planner.forecasting import Seasonal, fold
from extender.planner.throughput import Form, Observation, fit_throughput

DAY_S = 86400.0
MIN_HISTORY_POINTS = 12  # an hour at 5-minute steps: less than that is no forecast
MAX_LEAD_S = 3600.0


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    """The live planner's settings: the online planner's, plus how much history to read."""

    online: OnlineSettings = field(default_factory=OnlineSettings)  # step_s is the cadence
    history_s: float = 14 * DAY_S  # two weeks: every hour of the week seen twice
    min_history_points: int = MIN_HISTORY_POINTS
    # The label a lease's queries are scoped by (its namespace; common/queryscope.py).
    tenant_query_label: str = DEFAULT_LABEL

    def validate(self) -> list[str]:
        problems = self.online.validate()
        if not valid_label(self.tenant_query_label):
            problems.append(f"tenant_query_label {self.tenant_query_label!r} is not a label name")
        if self.history_s < self.online.step_s * self.min_history_points:
            problems.append("history must hold at least min_history_points planning steps")
        if self.history_s / self.online.step_s > 11000:
            problems.append("history / step exceeds Prometheus's 11,000 points per series")
        return problems


@dataclass(frozen=True, slots=True)
class Queries:
    """The PromQL expressions of one job (GpuLease annotations); each gives one series."""

    traffic: str  # incoming samples/s
    workers: str  # workers running
    throughput: str  # samples/s the job processed at its capacity
    lag: str | None = None  # seconds; absent: 0
    backlog: str | None = None  # samples waiting; absent: 0


@dataclass(frozen=True, slots=True)
class LeasePlanConfig:
    queries: Queries
    lead_s: float
    form: Form


def lease_config(annotations: Mapping[str, str], default_lead_s: float) -> LeasePlanConfig:
    """The planner's view of a lease's annotations; InvalidInput names every problem."""
    problems = []
    required = {
        "traffic": contract.ANN_PLANNER_TRAFFIC_QUERY,
        "workers": contract.ANN_PLANNER_WORKERS_QUERY,
        "throughput": contract.ANN_PLANNER_THROUGHPUT_QUERY,
    }
    found: dict[str, str] = {}
    for what, key in required.items():
        value = (annotations.get(key) or "").strip()
        if not value:
            problems.append(f"annotation {key} (PromQL) is required")
        found[what] = value
    lead_s = default_lead_s
    lead_text = annotations.get(contract.ANN_PLANNER_LEAD_SECONDS)
    if lead_text is not None:
        try:
            lead_s = float(lead_text)
        except ValueError:
            lead_s = -1.0
        if not 0.0 <= lead_s <= MAX_LEAD_S:
            problems.append(
                f"annotation {contract.ANN_PLANNER_LEAD_SECONDS}: want seconds in "
                f"0..{MAX_LEAD_S:.0f}, got {lead_text!r}"
            )
    form_text = annotations.get(contract.ANN_PLANNER_FORM, Form.SYNC.value)
    try:
        form = Form(form_text)
    except ValueError:
        problems.append(f"annotation {contract.ANN_PLANNER_FORM}: want sync or async")
        form = Form.SYNC
    if problems:
        raise InvalidInput(problems)
    return LeasePlanConfig(
        queries=Queries(
            traffic=found["traffic"],
            workers=found["workers"],
            throughput=found["throughput"],
            lag=(annotations.get(contract.ANN_PLANNER_LAG_QUERY) or "").strip() or None,
            backlog=(annotations.get(contract.ANN_PLANNER_BACKLOG_QUERY) or "").strip() or None,
        ),
        lead_s=lead_s,
        form=form,
    )


QUERY_ANNOTATIONS = {
    "traffic": contract.ANN_PLANNER_TRAFFIC_QUERY,
    "workers": contract.ANN_PLANNER_WORKERS_QUERY,
    "throughput": contract.ANN_PLANNER_THROUGHPUT_QUERY,
    "lag": contract.ANN_PLANNER_LAG_QUERY,
    "backlog": contract.ANN_PLANNER_BACKLOG_QUERY,
}


def scoped_queries(queries: Queries, namespace: str, label: str = DEFAULT_LABEL) -> Queries:
    """The lease's queries, each scoped to the lease's namespace (common/queryscope.py: the
    matcher ``label="<namespace>"`` on every selector); InvalidInput names each annotation
    that cannot be scoped, and why (none of them is then run)."""
    scoped: dict[str, str | None] = {}
    problems = []
    for what, annotation in QUERY_ANNOTATIONS.items():
        query = getattr(queries, what)
        if query is None:
            scoped[what] = None
            continue
        try:
            scoped[what] = scope_query(query, namespace, label)
        except InvalidInput as e:
            problems.append(refusal(annotation, namespace, label, e))
    if problems:
        raise InvalidInput(problems)
    return Queries(
        traffic=str(scoped["traffic"]),
        workers=str(scoped["workers"]),
        throughput=str(scoped["throughput"]),
        lag=scoped["lag"],
        backlog=scoped["backlog"],
    )


@dataclass(frozen=True, slots=True)
class Observations:
    """What a traffic source says of one job at ``at_s``."""

    at_s: float
    rate: float  # incoming samples/s now
    workers: int  # workers running now
    backlog: float  # samples waiting now
    lag_s: float  # sojourn time of the sample consumed now
    traffic: tuple[tuple[float, float], ...]  # (time, samples/s), oldest first
    throughput: tuple[Observation, ...]  # (workers, samples/s) pairs of the history


def pair_throughput(
    workers: Sequence[tuple[float, float]], throughput: Sequence[tuple[float, float]]
) -> tuple[Observation, ...]:
    """(workers, samples/s) at the timestamps both series have; non-positive values dropped."""
    counts = {t: w for t, w in workers}
    out = []
    for t, f in throughput:
        w = counts.get(t)
        if w is None or not math.isfinite(w) or not math.isfinite(f):
            continue
        n = round(w)
        if n > 0 and f > 0.0:
            out.append(Observation(n, f))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class StepPlan:
    workers: int
    gpus: int
    reason: str  # autoscaling.Reason's value
    forecast_now: float  # forecast samples/s now
    forecast_lead: float  # forecast samples/s at now + W: what the count is for
    fit_mape: float  # % error of the throughput fit on its own history


def plan_step(
    config: LeasePlanConfig,
    seen: Observations,
    settings: PlannerSettings,
    gpus_per_replica: int,
) -> StepPlan:
    """The GPUs to hold now; InvalidInput when the observations cannot support a plan (too
    little history, a throughput model the data do not determine)."""
    online = replace(settings.online, lead_s=config.lead_s)
    history = [(t, v) for t, v in seen.traffic if t <= seen.at_s and math.isfinite(v)]
    if len(history) < settings.min_history_points:
        raise InvalidInput(
            f"traffic history has {len(history)} points, want at least "
            f"{settings.min_history_points}"
        )
    forecaster = Seasonal()
    state = fold(forecaster, history)
    forecast = [
        forecaster.predict(state, seen.at_s + k * online.step_s)
        for k in range(online.horizon_steps + 1)
    ]
    fit = fit_throughput(seen.throughput, config.form)
    now = Measurements(
        workers=max(0, seen.workers), rate=seen.rate, backlog=seen.backlog, lag_s=seen.lag_s
    )
    decision = plan_online(forecast, fit.model, now, online)
    lead_k = min(len(forecast) - 1, math.ceil(online.lead_s / online.step_s))
    return StepPlan(
        workers=decision.workers,
        gpus=gpus_for(decision.workers, gpus_per_replica, gpus_per_replica),
        reason=decision.reason.value,
        forecast_now=forecast[0],
        forecast_lead=forecast[lead_k],
        fit_mape=fit.mape,
    )
