"""The live planner against a fake Prometheus on a loopback port: the real PrometheusSource
reads a synthetic daily tide over /api/v1/query and /api/v1/query_range, and the controller's
step writes desiredGPUs into a faithful fake of the GpuLeases (merge patches on resourceVersion).
The count must be in place W before the traffic needs it, and fall with the tide."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from common import builders, contract
from extender.planner.autoscaling import OnlineSettings
from extender.planner.controller import PlannerController, PlannerMetrics
from extender.planner.sources import PrometheusSource
from extender.planner.stepping import DAY_S, PlannerSettings
from extender.planner.testing import FakePrometheus, MemoryLeases, TidalJob
from extender.planner.throughput import min_workers
from extender.plannersim.online import TRUE_MODEL
from tests.fakeprometheus import served

GPUS_PER_REPLICA = 2
LEAD_S = 1800.0
# Eight days of history: every hour of the week seen once, a day of it twice.
SETTINGS = PlannerSettings(online=OnlineSettings(headroom=0.1), history_s=8 * DAY_S)
MONDAY = datetime(2025, 3, 10, tzinfo=UTC).timestamp()


def lease_object(job: TidalJob, *, name: str = "recsys", ns: str = "prod") -> dict[str, Any]:
    q = job.queries
    assert q.lag is not None
    return builders.gpu_lease(
        name,
        ns,
        gpus_per_replica=GPUS_PER_REPLICA,
        desired_gpus=8,
        schedule=[{"at": "08:00", "gpus": 16}],
        annotations={
            contract.ANN_PLANNER: "true",
            contract.ANN_PLANNER_TRAFFIC_QUERY: q.traffic,
            contract.ANN_PLANNER_WORKERS_QUERY: q.workers,
            contract.ANN_PLANNER_THROUGHPUT_QUERY: q.throughput,
            contract.ANN_PLANNER_LAG_QUERY: q.lag,
            contract.ANN_PLANNER_LEAD_SECONDS: str(int(LEAD_S)),
        },
    )


@dataclass
class Clock:
    now: float

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    prometheus: FakePrometheus
    source: PrometheusSource
    url: str


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with served(FakePrometheus(TidalJob(TRUE_MODEL).series())) as s:
        yield Rig(s.prometheus, s.source, s.url)


def needed_gpus(job: TidalJob, t: float) -> int:
    w = min_workers(TRUE_MODEL, job.traffic(t), highest=1024)
    assert w is not None
    return w * GPUS_PER_REPLICA


async def test_prometheus_replies_in_its_own_format(rig: Rig) -> None:
    job = TidalJob(TRUE_MODEL)
    async with aiohttp.ClientSession() as s:
        async with s.get(
            f"{rig.url}/api/v1/query", params={"query": job.queries.traffic, "time": "0"}
        ) as r:
            body = await r.json()
        assert body["status"] == "success"
        assert body["data"]["resultType"] == "vector"
        [series] = body["data"]["result"]
        assert series["metric"] == {}
        assert series["value"][0] == 0.0
        assert isinstance(series["value"][1], str)
        async with s.get(
            f"{rig.url}/api/v1/query_range",
            params={"query": job.queries.traffic, "start": "0", "end": "600", "step": "300"},
        ) as r:
            body = await r.json()
        [series] = body["data"]["result"]
        assert [p[0] for p in series["values"]] == [0.0, 300.0, 600.0]
        async with s.get(f"{rig.url}/api/v1/query", params={"query": "rate(", "time": "0"}) as r:
            assert r.status == 400
            body = await r.json()
        assert body["status"] == "error"
        assert body["errorType"] == "bad_data"
        async with s.get(
            f"{rig.url}/api/v1/query_range",
            params={"query": job.queries.traffic, "start": "0", "end": "86400", "step": "1"},
        ) as r:
            assert r.status == 400  # over 11,000 points


async def test_desired_gpus_follow_the_tide_w_ahead(rig: Rig) -> None:
    rig.prometheus.namespace = "prod"  # the lease's: its series, read by scoped queries only
    job = TidalJob(TRUE_MODEL)
    leases = MemoryLeases()
    leases.put(lease_object(job))
    clock = Clock(MONDAY)
    registry = CollectorRegistry()
    controller = PlannerController(
        source=rig.source,
        writer=leases,
        metrics=PlannerMetrics(registry),
        settings=SETTINGS,
        clock=clock,
    )
    held: dict[float, int] = {}
    for k in range(0, 24 * 4):  # a day, every 15 minutes
        clock.now = MONDAY + k * 900.0
        for obj in leases.objects.values():
            controller.on_lease("MODIFIED", obj)  # as the watch brings the last write back
        await controller.loop.run_once()
        spec = leases.objects["prod/recsys"]["spec"]
        assert "schedule" not in spec  # the first write removed it: it would win otherwise
        held[clock.now] = spec["desiredGPUs"]
    # In place W ahead: the count held at t carries the traffic of t + W (and of t).
    short = {
        t: (gpus, needed_gpus(job, t), needed_gpus(job, t + LEAD_S))
        for t, gpus in held.items()
        if gpus < max(needed_gpus(job, t), needed_gpus(job, t + LEAD_S))
    }
    assert not short, short
    # ... which a reactive count would not be: on the rise, t + W needs more than t.
    ahead = [t for t in held if needed_gpus(job, t + LEAD_S) > needed_gpus(job, t)]
    assert len(ahead) > 10
    # It follows the tide down too: well below the peak's count at the trough (04:00).
    peak_gpus = max(held.values())
    assert held[MONDAY + 4 * 3600.0] <= peak_gpus / 2
    assert peak_gpus <= needed_gpus(job, MONDAY + 16 * 3600.0) * 1.5
    # Metrics: gauges per lease, decisions by reason, no source errors.
    labels = {"lease": "prod/recsys"}
    assert registry.get_sample_value("tidelease_planner_planned_gpus", labels) == held[clock.now]
    forecast = registry.get_sample_value(
        "tidelease_planner_forecast_traffic", {**labels, "at": "now"}
    )
    assert forecast == pytest.approx(job.traffic(clock.now), rel=0.1)
    assert registry.get_sample_value("tidelease_planner_decisions_total", {"reason": "forecast"})
    assert registry.get_sample_value("tidelease_planner_writes_total", {"outcome": "written"})


async def test_source_errors_leave_the_lease_as_it_is(rig: Rig) -> None:
    rig.prometheus.namespace = "prod"  # the lease's: its series, read by scoped queries only
    job = TidalJob(TRUE_MODEL)
    leases = MemoryLeases()
    obj = leases.put(lease_object(job))
    registry = CollectorRegistry()
    controller = PlannerController(
        source=rig.source,
        writer=leases,
        metrics=PlannerMetrics(registry),
        settings=SETTINGS,
        clock=Clock(MONDAY),
    )
    rig.prometheus.down = True
    assert await controller.plan(obj) is None
    rig.prometheus.down = False
    rig.prometheus.empty.add(job.queries.traffic)
    assert await controller.plan(obj) is None
    rig.prometheus.empty.clear()
    unknown = leases.put(lease_object(job, name="typo"))
    # A query Prometheus does not answer (one that does not parse is refused before it is
    # sent: tests/unit/test_planning_live.py).
    unknown["metadata"]["annotations"][contract.ANN_PLANNER_WORKERS_QUERY] = 'count(up{job="x"})'
    assert await controller.plan(unknown) is None
    assert not leases.writes
    assert registry.get_sample_value(
        "tidelease_planner_source_errors_total", {"kind": "unavailable"}
    )
    assert (
        registry.get_sample_value("tidelease_planner_source_errors_total", {"kind": "bad-result"})
        == 2
    )
    # A source on a port nobody listens on: unreachable, counted, no crash.
    gone = PrometheusSource("http://127.0.0.1:9", timeout_s=2.0)
    try:
        controller.source = gone
        assert await controller.plan(obj) is None
    finally:
        await gone.close()
    assert (
        registry.get_sample_value("tidelease_planner_source_errors_total", {"kind": "unavailable"})
        == 2
    )
    # And the source back: written.
    controller.source = rig.source
    assert await controller.plan(obj) is not None
    assert len(leases.writes) == 1
