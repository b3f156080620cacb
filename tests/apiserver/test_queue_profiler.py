"""The ramp-up profiler live on a real API server, its readings through the planner's Prometheus
client against a fake Prometheus on a loopback port: a job's metric read at 1..6 GPUs gives
the eq. 1 factors of its true throughput; the measurements are saved on the job's Deployment
and a new Profiler (a restart) reads them back, equal; bad stored data is ignored."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common import contract
from common.kubeclient import KubeClient
from extender.planner.sources import PrometheusSource
from extender.planner.testing import FakePrometheus
from extender.queues.measuring import Profiler, ThroughputReader
from extender.queues.profiling import Profile
from tests.apiserver.conftest import ApiServer
from tests.fakeprometheus import served
from tests.unit.test_queue_profiler import EVERY, QUERY, Ramp, true_throughput

pytestmark = pytest.mark.apiserver

COUNTS = (1, 2, 3, 4, 5, 6)


@dataclass
class World:
    kube: KubeClient
    ns: str
    source: PrometheusSource

    @property
    def path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.ns}/deployments/trainer"

    @property
    def job(self) -> str:
        return f"{self.ns}/trainer"

    def profiler(self) -> Profiler:
        reader: ThroughputReader = self.source  # the planner's client, as the wiring passes it
        return Profiler(reader, registry=CollectorRegistry(), every_s=EVERY)

    async def annotations(self) -> dict[str, str]:
        obj = await self.kube.json("GET", self.path)
        return dict((obj.get("metadata") or {}).get("annotations") or {})


def deployment(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations or {"team": "vision"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {contract.ANN_THROUGHPUT_QUERY: QUERY},
                },
                "spec": {"containers": [{"name": "train", "image": "trainer:1"}]},
            },
        },
    }


@contextlib.asynccontextmanager
async def world(apiserver: ApiServer, ramp: Ramp) -> AsyncIterator[World]:
    async with served(FakePrometheus({QUERY: ramp.metric})) as fake:
        kube = await KubeClient.connect(apiserver.kubeconfig)
        ns = f"profiler-{uuid.uuid4().hex[:6]}"
        await kube.json("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
        try:
            yield World(kube, ns, fake.source)
        finally:
            with contextlib.suppress(Exception):
                await kube.json("DELETE", f"/api/v1/namespaces/{ns}")
            await kube.close()


async def test_measured_on_prometheus_saved_on_the_deployment_and_read_after_a_restart(
    apiserver: ApiServer,
) -> None:
    ramp = Ramp(counts=COUNTS)
    async with world(apiserver, ramp) as w:
        await w.kube.json(
            "POST", f"/apis/apps/v1/namespaces/{w.ns}/deployments", body=deployment("trainer")
        )
        profiler = w.profiler()
        for i, g in enumerate(ramp.counts):  # the controller's passes, one reading each
            for k in range(ramp.per_count):
                await profiler.observe(w.job, QUERY, g, ramp.start(i) + k * EVERY)
                await profiler.save(w.kube, w.job, w.path)

        want = {g: true_throughput(g) for g in COUNTS}
        assert profiler.measured(w.job) == want
        annotations = await w.annotations()
        assert (
            annotations[contract.ANN_THROUGHPUT_MEASURED] == "1:100,2:200,3:300,4:400,5:420,6:440"
        )
        assert annotations["team"] == "vision"  # a merge patch: the others kept

        restarted = w.profiler()
        assert await restarted.load(w.kube, w.job, f"{w.path}/scale")
        assert restarted.measured(w.job) == want
        truth = Profile(tuple(true_throughput(g) for g in COUNTS))
        got = restarted.profile(w.job, Profile((100.0, 150.0)), request=3)
        assert got == truth
        assert [got.scaling_factor(j) for j in range(1, 7)] == [
            truth.scaling_factor(j) for j in range(1, 7)
        ]
        assert [got.scaling_factor(j) for j in range(1, 6)] == [1.0, 1.0, 1.0, 0.2, 0.2]


async def test_bad_stored_data_on_the_deployment_is_ignored(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    ramp = Ramp(counts=(2,))
    async with world(apiserver, ramp) as w:
        bad = {contract.ANN_THROUGHPUT_MEASURED: "1:100,2:oops"}
        await w.kube.json(
            "POST", f"/apis/apps/v1/namespaces/{w.ns}/deployments", body=deployment("trainer", bad)
        )
        profiler = w.profiler()
        assert await profiler.load(w.kube, w.job, w.path)
        assert profiler.measured(w.job) == {}
        assert "ignored" in caplog.text
        for k in range(ramp.per_count):
            await profiler.observe(w.job, QUERY, 2, ramp.start(0) + k * EVERY)
        assert await profiler.save(w.kube, w.job, w.path)
        assert (await w.annotations())[contract.ANN_THROUGHPUT_MEASURED] == "2:200"
