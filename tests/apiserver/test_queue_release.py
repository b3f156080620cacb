"""The queues controller's releases on a real API server: the JSON patch that removes the queue
gate writes the release proof the extender asks for (common/queuerelease.py); a pod whose gate a
tenant removed, or that carries a made-up proof, is released in its turn with a proof of the
queues; a pod re-created under the same name is not released with the proof of the one before."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common import builders, contract
from common.kubeclient import KubeClient
from common.queuerelease import release_problem, release_proof
from extender.cluster.store import MemoryStore
from extender.queues.controller import KEY, QueueMetrics, QueuesController, QueueSettings
from tests.apiserver.conftest import ApiServer

pytestmark = pytest.mark.apiserver

RELEASE_KEY = b"r" * 48
INTERACTIVE = {contract.ANN_JOB_CLASS: "interactive"}


@dataclass
class World:
    kube: KubeClient
    ns: str

    def controller(self) -> QueuesController:
        ctl = QueuesController(
            self.kube,
            MemoryStore(),
            namespace=self.ns,
            settings=QueueSettings(),
            metrics=QueueMetrics(CollectorRegistry()),
            release_key=lambda: RELEASE_KEY,
        )
        ctl.synced.set()
        ctl.nodes_synced.set()
        return ctl

    async def create(self, name: str, annotations: dict[str, str], *, gate: bool) -> None:
        obj = builders.pod(name, 1, namespace=self.ns, extra_annotations=annotations)
        obj["metadata"].pop("uid")
        obj.pop("status", None)
        if gate:
            obj["spec"]["schedulingGates"] = [
                {"name": "other"},
                {"name": contract.SCHEDULING_GATE},
            ]
        await self.kube.json("POST", f"/api/v1/namespaces/{self.ns}/pods", body=obj)

    async def pod(self, name: str) -> dict[str, Any]:
        return await self.kube.json("GET", f"/api/v1/namespaces/{self.ns}/pods/{name}")

    async def watched(self, ctl: QueuesController) -> None:
        """The controller's cache as its watch would fill it: the pods as they are now."""
        listed = await self.kube.json("GET", f"/api/v1/namespaces/{self.ns}/pods")
        for obj in listed.get("items") or []:
            ctl.pods.apply("ADDED", {"apiVersion": "v1", "kind": "Pod", **obj})


@contextlib.asynccontextmanager
async def world(apiserver: ApiServer) -> AsyncIterator[World]:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    ns = f"release-{uuid.uuid4().hex[:6]}"
    await kube.json("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    try:
        yield World(kube, ns)
    finally:
        with contextlib.suppress(Exception):
            await kube.json("DELETE", f"/api/v1/namespaces/{ns}")
        await kube.close()


def released(ctl: QueuesController) -> float | None:
    return ctl.metrics.registry.get_sample_value(
        "tidelease_queues_released_pods_total", {"queue": "1"}
    )


def gate_names(obj: dict[str, Any]) -> list[str]:
    return [g["name"] for g in obj["spec"].get("schedulingGates") or []]


async def test_a_released_pod_carries_a_proof_for_its_uid_whoever_removed_its_gate(
    apiserver: ApiServer,
) -> None:
    async with world(apiserver) as w:
        await w.create("gated", INTERACTIVE, gate=True)
        # A tenant removed the gate (or never set it), and wrote the queue itself.
        await w.create("ungated", {**INTERACTIVE, contract.ANN_QUEUE: "1"}, gate=False)
        forged = {**INTERACTIVE, contract.ANN_QUEUE_RELEASED: release_proof(b"x" * 48, "any")}
        await w.create("forged", forged, gate=False)
        for name in ("gated", "ungated", "forged"):
            assert release_problem(await w.pod(name), RELEASE_KEY) is not None, name

        ctl = w.controller()
        await w.watched(ctl)
        await ctl.reconcile(KEY)

        for name in ("gated", "ungated", "forged"):
            obj = await w.pod(name)
            annotations = obj["metadata"]["annotations"]
            assert annotations[contract.ANN_QUEUE] == "1", name
            assert annotations[contract.ANN_QUEUE_RELEASED] == release_proof(
                RELEASE_KEY, obj["metadata"]["uid"]
            ), name
            assert release_problem(obj, RELEASE_KEY) is None, name
            assert annotations[contract.ANN_JOB_CLASS] == "interactive"  # the others kept
        assert gate_names(await w.pod("gated")) == ["other"]  # the queue gate, and only it
        assert released(ctl) == 3

        # The next pass, the watch caught up: nothing more to release.
        await w.watched(ctl)
        await ctl.reconcile(KEY)
        assert released(ctl) == 3


async def test_a_pod_recreated_under_the_same_name_is_not_released_for_the_one_before(
    apiserver: ApiServer,
) -> None:
    async with world(apiserver) as w:
        await w.create("again", INTERACTIVE, gate=True)
        ctl = w.controller()
        await w.watched(ctl)  # the first pod in the cache; the watch is slow to tell the rest
        before = (await w.pod("again"))["metadata"]["uid"]
        await w.kube.json("DELETE", f"/api/v1/namespaces/{w.ns}/pods/again")
        await w.create("again", INTERACTIVE, gate=True)
        await ctl.reconcile(KEY)

        obj = await w.pod("again")
        assert obj["metadata"]["uid"] != before
        assert contract.SCHEDULING_GATE in gate_names(obj)
        assert contract.ANN_QUEUE_RELEASED not in obj["metadata"]["annotations"]
        assert release_problem(obj, RELEASE_KEY) is not None


async def test_the_key_secret_is_made_once_in_the_cluster(apiserver: ApiServer) -> None:
    """The queues controller makes its key's Secret when absent and never replaces it (what
    the chart mounts; nothing random is rendered)."""
    import base64

    from common.keyfile import MIN_KEY_LENGTH, make_key_secret

    kube = await KubeClient.connect(apiserver.kubeconfig)
    ns = f"qkey-{uuid.uuid4().hex[:6]}"
    await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(ns, online=False))
    try:
        assert await make_key_secret(kube, ns, "tidelease-queue-release-key") is True
        path = f"/api/v1/namespaces/{ns}/secrets/tidelease-queue-release-key"
        first = await kube.json("GET", path)
        key = base64.b64decode(first["data"]["key"])
        assert len(key) >= MIN_KEY_LENGTH
        assert await make_key_secret(kube, ns, "tidelease-queue-release-key") is False
        again = await kube.json("GET", path)
        assert again["data"] == first["data"]  # kept: a key in use never changes under readers
    finally:
        with contextlib.suppress(Exception):
            await kube.json("DELETE", f"/api/v1/namespaces/{ns}")
        await kube.close()
