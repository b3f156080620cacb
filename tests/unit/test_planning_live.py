"""The live planner's pure parts: Prometheus replies parsed at the boundary, lease annotations,
observations turned into planner inputs; and the controller's step over fakes (no I/O)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common import builders, contract
from common.errors import Conflict, InvalidInput, Unavailable
from common.reconcile import Requeue
from extender.planner.autoscaling import OnlineSettings
from extender.planner.controller import PlannerController, PlannerMetrics, opted_in
from extender.planner.sources import parse_instant, parse_range
from extender.planner.stepping import (
    LeasePlanConfig,
    Observations,
    PlannerSettings,
    Queries,
    lease_config,
    pair_throughput,
    plan_step,
)
from extender.planner.testing import (
    FakeTrafficSource,
    MemoryLeaseEvents,
    MemoryLeases,
    TidalJob,
    merge,
)
from extender.planner.throughput import Form, Observation
from extender.plannersim.online import TRUE_MODEL

ROOT = Path(__file__).resolve().parents[2]
Q = Queries(traffic="traffic", workers="workers", throughput="throughput")


def ok(rtype: str, result: object) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": rtype, "result": result}}


def vector(*values: str) -> dict[str, Any]:
    return ok(
        "vector", [{"metric": {"job": f"j{i}"}, "value": [1.5, v]} for i, v in enumerate(values)]
    )


def matrix(*series: list[list[Any]]) -> dict[str, Any]:
    return ok("matrix", [{"metric": {}, "values": s} for s in series])


@pytest.mark.parametrize(
    ("body", "value"),
    [
        pytest.param(vector("42.5"), 42.5, id="vector"),
        pytest.param(ok("scalar", [1.5, "7"]), 7.0, id="scalar"),
        pytest.param(vector("1e3"), 1000.0, id="exponent"),
    ],
)
def test_instant_values(body: dict[str, Any], value: float) -> None:
    assert parse_instant(body, "q") == value


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            {"status": "error", "errorType": "bad_data", "error": "parse error"},
            "Prometheus error (bad_data): parse error",
            id="error",
        ),
        pytest.param(vector(), "no data", id="empty"),
        pytest.param(vector("NaN"), "value is nan", id="nan"),
        pytest.param(vector("+Inf"), "value is inf", id="inf"),
        pytest.param(vector("1", "2"), "2 series, want one", id="two-series"),
        pytest.param(vector("abc"), "not a number", id="garbage"),
        pytest.param(ok("string", [1.5, "x"]), "resultType string", id="string"),
        pytest.param(ok("matrix", []), "resultType matrix", id="matrix"),
        pytest.param({"status": "success"}, "no data.resultType", id="no-data"),
        pytest.param(["not", "an", "object"], "not a JSON object", id="list"),
        pytest.param(
            ok("vector", [{"metric": {}, "value": ["1.5", "3"]}]), "not a number", id="str-time"
        ),
    ],
)
def test_instant_errors(body: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=r"^q: ") as e:
        parse_instant(body, "q")
    assert message in str(e.value)


def test_range_drops_nan_and_inf_points() -> None:
    body = matrix([[0, "1"], [300, "NaN"], [600, "+Inf"], [900, "-Inf"], [1200, "2.5"]])
    assert parse_range(body, "q") == ((0.0, 1.0), (1200.0, 2.5))


def test_range_empty_is_no_history() -> None:
    assert parse_range(ok("matrix", []), "q") == ()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(matrix([[0, "1"]], [[0, "2"]]), "2 series", id="two-series"),
        pytest.param(vector("1"), "resultType vector, want matrix", id="vector"),
        pytest.param(ok("matrix", [{"metric": {}}]), "without values", id="no-values"),
        pytest.param(
            {"status": "error", "errorType": "execution", "error": "too many samples"},
            "execution",
            id="error",
        ),
    ],
)
def test_range_errors(body: object, message: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_range(body, "q")
    assert message in str(e.value)


def annotations(**extra: str) -> dict[str, str]:
    return {
        contract.ANN_PLANNER: "true",
        contract.ANN_PLANNER_TRAFFIC_QUERY: "traffic",
        contract.ANN_PLANNER_WORKERS_QUERY: "workers",
        contract.ANN_PLANNER_THROUGHPUT_QUERY: "throughput",
        **extra,
    }


def test_lease_config_defaults_and_overrides() -> None:
    config = lease_config(annotations(), 600.0)
    assert config == LeasePlanConfig(Q, 600.0, Form.SYNC)
    config = lease_config(
        annotations(
            **{
                contract.ANN_PLANNER_LEAD_SECONDS: "900",
                contract.ANN_PLANNER_FORM: "async",
                contract.ANN_PLANNER_LAG_QUERY: " lag ",
                contract.ANN_PLANNER_BACKLOG_QUERY: "",
            }
        ),
        600.0,
    )
    assert (config.lead_s, config.form, config.queries.lag, config.queries.backlog) == (
        900.0,
        Form.ASYNC,
        "lag",
        None,
    )


def test_lease_config_names_every_problem() -> None:
    with pytest.raises(InvalidInput) as e:
        lease_config(
            {
                contract.ANN_PLANNER_TRAFFIC_QUERY: "  ",
                contract.ANN_PLANNER_LEAD_SECONDS: "soon",
                contract.ANN_PLANNER_FORM: "elastic",
            },
            600.0,
        )
    assert len(e.value.problems) == 5


def test_pairs_at_shared_timestamps_only() -> None:
    workers = [(0.0, 2.0), (300.0, 3.9), (600.0, 0.0), (900.0, math.nan)]
    throughput = [(0.0, 10.0), (300.0, 20.0), (600.0, 5.0), (900.0, 7.0), (1200.0, 9.0)]
    assert pair_throughput(workers, throughput) == (Observation(2, 10.0), Observation(4, 20.0))


def observed(
    job: TidalJob, at_s: float, *, points: int = 8 * 288, lag_s: float = 0.0
) -> Observations:
    times = [at_s - k * 300.0 for k in range(points, -1, -1)]
    return Observations(
        at_s=at_s,
        rate=job.traffic(at_s),
        workers=round(job.workers(at_s)),
        backlog=job.traffic(at_s) * lag_s,
        lag_s=lag_s,
        traffic=tuple((t, job.traffic(t)) for t in times),
        throughput=pair_throughput(
            [(t, job.workers(t)) for t in times], [(t, job.throughput(t)) for t in times]
        ),
    )


SETTINGS = PlannerSettings(online=OnlineSettings(headroom=0.1))
NOON = 1_741_608_000.0  # 2025-03-10 12:00 UTC, a Monday


def test_plan_step_turns_history_into_a_plan() -> None:
    job = TidalJob(TRUE_MODEL)
    config = LeasePlanConfig(Q, 600.0, Form.SYNC)
    step = plan_step(config, observed(job, NOON), SETTINGS, gpus_per_replica=4)
    assert step.reason == "forecast"
    assert step.gpus == step.workers * 4
    assert step.forecast_now == pytest.approx(job.traffic(NOON), rel=0.05)
    assert step.forecast_lead == pytest.approx(job.traffic(NOON + 600.0), rel=0.05)
    assert step.fit_mape < 1.0
    assert TRUE_MODEL.predict(step.workers) > job.traffic(NOON + 600.0)


def test_plan_step_lag_fallback() -> None:
    job = TidalJob(TRUE_MODEL)
    config = LeasePlanConfig(Q, 600.0, Form.SYNC)
    calm = plan_step(config, observed(job, NOON), SETTINGS, 1)
    late = plan_step(config, observed(job, NOON, lag_s=1800.0), SETTINGS, 1)
    assert late.reason == "fallback-lag"
    assert late.workers > calm.workers


@pytest.mark.parametrize(
    ("points", "message"),
    [
        pytest.param(5, "traffic history has 6 points", id="short-history"),
    ],
)
def test_plan_step_refuses_thin_data(points: int, message: str) -> None:
    job = TidalJob(TRUE_MODEL)
    with pytest.raises(InvalidInput, match=message):
        plan_step(
            LeasePlanConfig(Q, 600.0, Form.SYNC), observed(job, NOON, points=points), SETTINGS, 1
        )


def test_plan_step_refuses_an_undetermined_model() -> None:
    seen = observed(TidalJob(TRUE_MODEL), NOON)
    flat = Observations(**{**_fields(seen), "throughput": (Observation(4, 100.0),) * 10})
    with pytest.raises(InvalidInput, match="distinct worker counts"):
        plan_step(LeasePlanConfig(Q, 600.0, Form.SYNC), flat, SETTINGS, 1)


def _fields(o: Observations) -> dict[str, Any]:
    return {f: getattr(o, f) for f in Observations.__dataclass_fields__}


def test_settings_validate() -> None:
    assert PlannerSettings().validate() == []
    assert len(PlannerSettings(history_s=60.0 * 86400).validate()) == 1  # > 11,000 points
    assert len(PlannerSettings(history_s=600.0).validate()) == 1


def test_merge_patch() -> None:
    assert merge({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}, "f": None}) == {
        "a": 1,
        "b": {"d": 3, "e": 4},
    }


# --- the controller over fakes ---


def lease(name: str = "recsys", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "prod", "name": name, "annotations": annotations()},
        "spec": {**builders.gpu_lease_spec(name, gpus_per_replica=2), **spec},
    }


def rig(
    source: FakeTrafficSource, clock: float = NOON
) -> tuple[PlannerController, MemoryLeases, CollectorRegistry]:
    registry = CollectorRegistry()
    leases = MemoryLeases()
    controller = PlannerController(
        source=source,
        writer=leases,
        metrics=PlannerMetrics(registry),
        settings=SETTINGS,
        clock=lambda: clock,
    )
    return controller, leases, registry


def tidal_source() -> FakeTrafficSource:
    # The observations of namespace prod (the leases'): they answer its queries scoped to it.
    return FakeTrafficSource({"traffic": observed(TidalJob(TRUE_MODEL), NOON)}, namespace="prod")


async def test_writes_a_changed_count_and_drops_the_schedule() -> None:
    controller, leases, _ = rig(tidal_source())
    obj = leases.put(lease(desiredGPUs=2, schedule=[{"at": "08:00", "gpus": 8}]))
    gpus = await controller.plan(obj)
    assert gpus is not None
    [(_, _, patch)] = leases.writes
    assert patch == {"spec": {"desiredGPUs": gpus, "schedule": None}}
    assert "schedule" not in leases.objects["prod/recsys"]["spec"]
    # The same count again: nothing written.
    assert await controller.plan(leases.objects["prod/recsys"]) == gpus
    assert len(leases.writes) == 1


async def test_conflict_is_left_to_the_next_step() -> None:
    controller, leases, registry = rig(tidal_source())
    stale = leases.put(lease(desiredGPUs=2))
    stale = {**stale, "metadata": dict(stale["metadata"])}
    leases.put(lease(desiredGPUs=4))  # someone else wrote meanwhile
    assert await controller.plan(stale) is None
    assert not leases.writes
    assert registry.get_sample_value("tidelease_planner_writes_total", {"outcome": "conflict"})
    assert await controller.plan(leases.objects["prod/recsys"]) is not None
    assert len(leases.writes) == 1


@pytest.mark.parametrize(
    ("fail", "kind"),
    [
        pytest.param(Unavailable("connection refused"), "unavailable", id="unreachable"),
        pytest.param(InvalidInput("no data"), "bad-result", id="bad-result"),
        pytest.param(Conflict("odd"), "bad-result", id="other-error"),
    ],
)
async def test_source_errors_are_counted_and_change_nothing(fail: Exception, kind: str) -> None:
    controller, leases, registry = rig(FakeTrafficSource(fail=fail))
    assert await controller.plan(leases.put(lease(desiredGPUs=2))) is None
    assert not leases.writes
    assert registry.get_sample_value("tidelease_planner_source_errors_total", {"kind": kind}) == 1


async def test_invalid_leases_and_opted_out_ones() -> None:
    source = tidal_source()
    controller, leases, registry = rig(source)
    bad = leases.put(lease("bad"))
    bad["metadata"]["annotations"][contract.ANN_PLANNER_LEAD_SECONDS] = "-5"
    quiet = leases.put(lease("quiet"))
    quiet["metadata"]["annotations"][contract.ANN_PLANNER] = "false"
    for obj in leases.objects.values():
        controller.on_lease("ADDED", obj)  # as the watch lists them
    await controller.loop.run_once()
    assert not opted_in(quiet)
    assert source.calls == 0
    assert registry.get_sample_value("tidelease_planner_source_errors_total", {"kind": "config"})
    controller.metrics.forget("prod/bad")  # nothing to forget: no error


async def test_each_opted_in_lease_is_planned_when_first_seen_then_every_interval() -> None:
    controller, leases, registry = rig(tidal_source())
    obj = leases.put(lease(desiredGPUs=2))
    controller.on_lease("ADDED", obj)
    assert controller.loop.depth == 1  # at once
    await controller.loop.run_once()
    assert len(leases.writes) == 1
    step_s = SETTINGS.online.step_s
    assert controller.loop.due_in("prod/recsys") == pytest.approx(step_s, abs=5.0)
    # A change (our own write, back from the watch) waits for the step.
    controller.on_lease("MODIFIED", leases.objects["prod/recsys"])
    assert controller.loop.depth == 0
    assert await controller.reconcile("prod/recsys") == Requeue(step_s)
    # Gone: its gauges go, and its last timer plans nothing.
    controller.on_lease("DELETED", leases.objects["prod/recsys"])
    labels = {"lease": "prod/recsys"}
    assert registry.get_sample_value("tidelease_planner_planned_gpus", labels) is None
    assert await controller.reconcile("prod/recsys") is None


async def test_queries_are_run_scoped_to_the_lease_namespace() -> None:
    source = tidal_source()
    controller, leases, _ = rig(source)
    assert await controller.plan(leases.put(lease())) is not None
    [asked] = source.asked
    assert asked.traffic == 'traffic{namespace="prod"}'
    assert asked.workers == 'workers{namespace="prod"}'
    assert asked.throughput == 'throughput{namespace="prod"}'


async def test_a_query_reading_another_namespace_is_refused_with_an_event() -> None:
    source = tidal_source()
    controller, leases, registry = rig(source)
    events = MemoryLeaseEvents()
    controller.events = events
    obj = lease()
    obj["metadata"]["annotations"][contract.ANN_PLANNER_WORKERS_QUERY] = (
        'count(up{namespace="other", job="w"} == 1)'
    )
    obj = leases.put(obj)
    assert await controller.plan(obj) is None
    assert await controller.plan(obj) is None  # the next step: refused again, told once
    assert source.calls == 0  # never run
    assert not leases.writes
    [(key, reason, message)] = events.posted
    assert (key, reason) == ("prod/recsys", "PlannerQueryRefused")
    assert contract.ANN_PLANNER_WORKERS_QUERY in message
    assert 'namespace="other"' in message
    assert registry.get_sample_value("tidelease_planner_source_errors_total", {"kind": "config"})
    # Fixed: planned, and a later refusal is told again.
    obj["metadata"]["annotations"][contract.ANN_PLANNER_WORKERS_QUERY] = "workers"
    assert await controller.plan(leases.put(obj)) is not None
    obj["metadata"]["annotations"][contract.ANN_PLANNER_TRAFFIC_QUERY] = "rate("
    assert await controller.plan(leases.put(obj)) is None
    assert len(events.posted) == 2
    assert contract.ANN_PLANNER_TRAFFIC_QUERY in events.posted[1][2]
