"""The live planner on a real API server, against a fake Prometheus on a loopback port: a GpuLease
opted in gets spec.desiredGPUs written (its schedule dropped) by the watching controller, a
write on a stale resourceVersion is a Conflict that the next step survives, and opted-out
leases are never touched. The planner's clock is injected (a Monday noon)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common import builders, contract
from common.kubeclient import KubeClient
from extender.planner.controller import (
    KubeLeaseEvents,
    KubeLeaseWriter,
    PlannerController,
    PlannerMetrics,
    run_planner_controller,
)
from extender.planner.sources import PrometheusSource
from extender.planner.testing import FakePrometheus, TidalJob
from extender.plannersim.online import TRUE_MODEL
from tests.apiserver.conftest import ApiServer
from tests.fakeprometheus import served
from tests.integration.test_planning_live import MONDAY, SETTINGS, lease_object
from tests.polling import eventually

pytestmark = pytest.mark.apiserver

NOON = MONDAY + 12 * 3600.0


@dataclass
class World:
    kube: KubeClient
    ns: str
    source: PrometheusSource
    registry: CollectorRegistry
    prometheus: FakePrometheus

    def path(self, name: str) -> str:
        return f"/apis/{contract.API_VERSION}/namespaces/{self.ns}/gpuleases/{name}"

    async def spec(self, name: str) -> dict[str, Any]:
        return dict((await self.kube.json("GET", self.path(name))).get("spec") or {})

    def sample(self, name: str, labels: dict[str, str]) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def world(apiserver: ApiServer) -> AsyncIterator[World]:
    async with served(FakePrometheus(TidalJob(TRUE_MODEL).series())) as fake:
        kube = await KubeClient.connect(apiserver.kubeconfig)
        ns = f"planner-{uuid.uuid4().hex[:6]}"
        await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(ns))
        fake.prometheus.namespace = ns  # the series are the namespace's, read scoped only
        try:
            yield World(kube, ns, fake.source, CollectorRegistry(), fake.prometheus)
        finally:
            with contextlib.suppress(Exception):
                await kube.json("DELETE", f"/api/v1/namespaces/{ns}")
            await kube.close()


async def create(w: World, name: str, *, opted_in: bool = True) -> dict[str, Any]:
    obj = lease_object(TidalJob(TRUE_MODEL), name=name, ns=w.ns)
    if not opted_in:
        del obj["metadata"]["annotations"][contract.ANN_PLANNER]
    return await w.kube.json(
        "POST", f"/apis/{contract.API_VERSION}/namespaces/{w.ns}/gpuleases", body=obj
    )


async def test_planner_writes_desired_gpus_and_survives_a_conflict(apiserver: ApiServer) -> None:
    async with world(apiserver) as w:
        stale = await create(w, "recsys")
        await create(w, "manual", opted_in=False)
        controller = PlannerController(
            source=w.source,
            writer=KubeLeaseWriter(w.kube),
            metrics=PlannerMetrics(w.registry),
            settings=SETTINGS,
            clock=lambda: NOON,
            interval_s=1.0,
        )
        # Someone edits the lease after the planner read it: its write is a Conflict.
        await w.kube.json(
            "PATCH",
            w.path("recsys"),
            body={"spec": {"graceSeconds": 30}},
            content_type="application/merge-patch+json",
        )
        assert await controller.plan(stale) is None
        assert w.sample("tidelease_planner_writes_total", {"outcome": "conflict"}) == 1
        assert (await w.spec("recsys"))["desiredGPUs"] == 8  # untouched

        # The watching controller re-reads it and writes; the edit made meanwhile stays.
        ready = asyncio.Event()
        task = asyncio.create_task(
            run_planner_controller(kube=w.kube, controller=controller, ready=ready)
        )
        try:
            await asyncio.wait_for(ready.wait(), 30)

            async def planned() -> dict[str, Any] | None:
                spec = await w.spec("recsys")
                return spec if spec["desiredGPUs"] != 8 else None

            spec = await eventually(planned, within_s=30)
            assert "schedule" not in spec
            assert spec["graceSeconds"] == 30
            gpus = spec["desiredGPUs"]
            assert w.sample("tidelease_planner_planned_gpus", {"lease": f"{w.ns}/recsys"}) == gpus
            assert gpus % 2 == 0  # whole replicas of gpusPerReplica 2
            job = TidalJob(TRUE_MODEL)
            assert TRUE_MODEL.predict(gpus // 2) > job.traffic(NOON)

            # Steps go on: the same plan is not written again, the opted-out lease never.
            async def stepped_again() -> bool:
                return w.sample("tidelease_planner_writes_total", {"outcome": "unchanged"}) >= 2

            await eventually(stepped_again, within_s=30)
            assert w.sample("tidelease_planner_writes_total", {"outcome": "written"}) == 1
            manual = await w.spec("manual")
            assert manual["desiredGPUs"] == 8
            assert manual["schedule"] == [{"at": "08:00", "gpus": 16}]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_query_reading_another_namespace_is_refused_with_an_event(
    apiserver: ApiServer,
) -> None:
    async with world(apiserver) as w:
        obj = lease_object(TidalJob(TRUE_MODEL), name="nosy", ns=w.ns)
        nosy = 'sum(rate(trainer_samples_total{namespace="kube-system"}[5m]))'
        obj["metadata"]["annotations"][contract.ANN_PLANNER_THROUGHPUT_QUERY] = nosy
        created = await w.kube.json(
            "POST", f"/apis/{contract.API_VERSION}/namespaces/{w.ns}/gpuleases", body=obj
        )
        controller = PlannerController(
            source=w.source,
            writer=KubeLeaseWriter(w.kube),
            metrics=PlannerMetrics(w.registry),
            settings=SETTINGS,
            clock=lambda: NOON,
            events=KubeLeaseEvents(w.kube),
        )
        assert await controller.plan(created) is None
        assert w.prometheus.requests == []  # none of its queries reached Prometheus
        assert (await w.spec("nosy"))["desiredGPUs"] == 8
        events = await w.kube.json("GET", f"/api/v1/namespaces/{w.ns}/events")
        [event] = [e for e in events["items"] if e["reason"] == "PlannerQueryRefused"]
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "GpuLease"
        assert event["involvedObject"]["name"] == "nosy"
        assert contract.ANN_PLANNER_THROUGHPUT_QUERY in event["message"]
        assert 'namespace="kube-system"' in event["message"]
