"""The prewarm controller on a real API server: it writes spec.prewarm on the nodes a GpuLease's
next scale-up will use, when the horizon before their start has come, never touches
spec.devices, counts what the agents report, and clears the directives after the scale-up or
when the lease is deleted. The clock is injected: the scale-up is at 08:00 UTC of a fixed day.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common import builders, contract
from common.errors import NotFound
from common.kubeclient import KubeClient
from common.model import Device, Tier
from common.timefmt import epoch, microtime
from extender.prewarm.controller import (
    KubePrewarmWorld,
    PrewarmController,
    PrewarmMetrics,
    run_prewarm_controller,
)
from extender.prewarm.policy import PrewarmSettings
from tests.apiserver.conftest import ApiServer
from tests.polling import eventually

pytestmark = pytest.mark.apiserver

GPN = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
IMAGE = "registry.example/recsys:v7"
CKPT = "recsys-ckpt-42"
SETTINGS = PrewarmSettings(margin_s=120.0, horizon_s=600.0, spare_standby_replicas=1)


def at(hhmmss: str) -> float:
    h, m, s = (int(x) for x in hhmmss.split(":"))
    return datetime(2025, 3, 10, h, m, s, tzinfo=UTC).timestamp()


@dataclass
class Clock:
    now: float

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    kube: KubeClient
    ns: str
    clock: Clock
    metrics: PrewarmMetrics
    registry: CollectorRegistry

    def node(self, short: str) -> str:
        return f"{self.ns}-{short}"

    @property
    def lease_path(self) -> str:
        return f"/apis/{contract.API_VERSION}/namespaces/{self.ns}/gpuleases/recsys"

    async def prewarm(self, short: str) -> list[dict[str, Any]]:
        obj = await self.kube.json("GET", f"{GPN}/{self.node(short)}")
        return list((obj.get("spec") or {}).get("prewarm") or [])

    async def prewarmed(self) -> dict[str, list[dict[str, Any]]]:
        out = {}
        for short in ("n1", "n2", "s1", "s2", "x1"):
            ds = await self.prewarm(short)
            if ds:
                out[short] = ds
        return out

    async def lease_status(self, status: dict[str, Any]) -> None:
        obj = await self.kube.json("GET", self.lease_path)
        obj["status"] = status
        await self.kube.json("PUT", f"{self.lease_path}/status", body=obj)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        return value or 0.0


def lent(node: str, gpu_type: str, *, broken: bool = False) -> list[Device]:
    devs = builders.devices(node, 4, gpu_type=gpu_type) + builders.devices(
        node, 4, gpu_type=gpu_type, owner="recsys", start=4
    )
    if broken:
        d = devs[5]
        devs[5] = Device(d.node, d.index, d.uuid, d.cls._replace(healthy=False))
    return devs


def group(node: str) -> list[str]:
    return [builders.device_uuid(node, i) for i in range(4, 8)]


async def create_node(kube: KubeClient, name: str, devs: list[Device]) -> None:
    obj = builders.gpu_node(name, devs)
    created = await kube.json("POST", GPN, body={**obj, "status": None})
    await kube.json("PUT", f"{GPN}/{name}/status", body={**created, "status": obj["status"]})


STEADY = {"phase": "Steady", "targetReplicas": 2, "reclaims": 0, "returned": 0, "backfilled": 0}


@contextlib.asynccontextmanager
async def world(apiserver: ApiServer) -> AsyncIterator[World]:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    ns = f"prewarm-{uuid.uuid4().hex[:6]}"
    await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(ns))
    # A GPU type of this test's own: GpuNodes are cluster-scoped, and standby nodes other tests
    # left on the shared API server must not be candidates.
    gpu = f"T{ns[-6:]}"
    nodes = {
        "n1": lent(f"{ns}-n1", gpu),
        "n2": lent(f"{ns}-n2", gpu, broken=True),  # its group cannot come back: standby instead
        "s1": builders.devices(f"{ns}-s1", 4, gpu_type=gpu, standby=True),
        "s2": builders.devices(f"{ns}-s2", 4, gpu_type=gpu, standby=True),
        "x1": builders.devices(f"{ns}-x1", 8, gpu_type=gpu, tier=Tier.MA),  # not involved
    }
    for short, devs in nodes.items():
        await create_node(kube, f"{ns}-{short}", devs)
    sts = builders.statefulset(
        "recsys",
        ns,
        replicas=2,
        image=IMAGE,
        container="trainer",
        annotations={
            contract.ANN_CHECKPOINT: CKPT,
            contract.ANN_IMAGE_BYTES: "10e9",
            contract.ANN_CHECKPOINT_BYTES: "100e9",
        },
    )
    await kube.json("POST", f"/apis/apps/v1/namespaces/{ns}/statefulsets", body=sts)
    lease = builders.gpu_lease(
        "recsys",
        ns,
        gpus_per_replica=4,
        desired_gpus=16,
        schedule=[{"at": "08:00", "gpus": 16}, {"at": "22:00", "gpus": 8}],
    )
    await kube.json("POST", f"/apis/{contract.API_VERSION}/namespaces/{ns}/gpuleases", body=lease)
    registry = CollectorRegistry()
    w = World(kube, ns, Clock(at("06:00:00")), PrewarmMetrics(registry), registry)
    await w.lease_status(
        {
            **STEADY,
            "lent": [
                {"replica": "recsys-2", "devices": group(f"{ns}-n1")},
                {"replica": "recsys-3", "devices": group(f"{ns}-n2")},
            ],
        }
    )
    try:
        yield w
    finally:
        for short in nodes:
            with contextlib.suppress(Exception):
                await kube.json("DELETE", f"{GPN}/{ns}-{short}")
        with contextlib.suppress(Exception):
            await kube.json("DELETE", f"/api/v1/namespaces/{ns}")
        await kube.close()


async def reconciled_past(w: World, passes: int = 2) -> None:
    """Until the controller has finished ``passes`` more reconciles, each planning with the
    clock and the objects as they are now: what it has written by then (or not) is its answer,
    not the outcome of a race with a slow machine."""
    name = "tidelease_controller_reconcile_duration_seconds_count"
    labels = {"controller": "prewarm"}
    start = w.registry.get_sample_value(name, labels) or 0.0

    async def done() -> bool:
        return (w.registry.get_sample_value(name, labels) or 0.0) >= start + passes

    await eventually(done, within_s=30)


@contextlib.asynccontextmanager
async def controller(w: World) -> AsyncIterator[None]:
    ctl = PrewarmController(
        world=KubePrewarmWorld(w.kube),
        metrics=w.metrics,
        settings=SETTINGS,
        clock=w.clock,
        template_ttl_s=0.0,
    )
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_prewarm_controller(
            kube=w.kube, controller=ctl, resync_s=0.2, min_interval_s=0.05, ready=ready
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 30)
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_directives_on_the_right_nodes_at_the_right_time_then_cleared(
    apiserver: ApiServer,
) -> None:
    async with world(apiserver) as w, controller(w):
        devices_before = (await w.kube.json("GET", f"{GPN}/{w.node('n1')}"))["spec"]["devices"]
        # 06:00: the cold nodes start at 08:00 - 82 s - 120 s = 07:56:38; the horizon is
        # 10 min: nothing is written yet (after two whole reconciles at 06:00).
        await reconciled_past(w)
        assert await w.prewarmed() == {}

        w.clock.now = at("07:50:00")

        async def written() -> dict[str, list[dict[str, Any]]] | None:
            got = await w.prewarmed()
            return got if set(got) == {"n1", "s1", "s2"} else None

        got = await eventually(written, within_s=15)
        (d1,) = got["n1"]
        assert d1["lease"] == f"{w.ns}/recsys"
        assert d1["role"] == "Lent"
        assert d1["images"] == [IMAGE]
        assert d1["checkpoints"] == [CKPT]
        assert epoch(d1["deadline"]) == at("08:00:00")
        assert epoch(d1["notBefore"]) == pytest.approx(at("07:56:38"))
        assert d1["windowSeconds"] == pytest.approx(82.0)
        assert {d["role"] for s in ("s1", "s2") for d in got[s]} == {"Standby"}
        assert w.sample("tidelease_prewarm_directives_written_total", {"role": "Lent"}) == 1
        assert w.sample("tidelease_prewarm_directives_written_total", {"role": "Standby"}) == 2
        # The leasing controller's field is untouched.
        n1 = await w.kube.json("GET", f"{GPN}/{w.node('n1')}")
        assert n1["spec"]["devices"] == devices_before

        # n1's agent reports: checkpoint done two minutes early, image failed.
        items = [
            {
                "lease": f"{w.ns}/recsys",
                "kind": "checkpoint",
                "name": CKPT,
                "state": "Done",
                "reason": "fetched",
                "seconds": 30.0,
                "finishedAt": microtime(at("07:58:00")),
                "deadline": d1["deadline"],
            },
            {
                "lease": f"{w.ns}/recsys",
                "kind": "image",
                "name": IMAGE,
                "state": "Failed",
                "reason": "pull failed",
            },
        ]
        await w.kube.json(
            "PATCH",
            f"{GPN}/{w.node('n1')}/status",
            body={"status": {"prewarm": {"items": items}}},
            content_type="application/merge-patch+json",
        )

        async def counted() -> bool:
            return (
                w.sample("tidelease_prewarm_items_total", {"kind": "checkpoint", "outcome": "done"})
                == 1
                and w.sample(
                    "tidelease_prewarm_items_total", {"kind": "image", "outcome": "failed"}
                )
                == 1
            )

        await eventually(counted, within_s=10)
        assert w.sample("tidelease_prewarm_lead_seconds_sum") == pytest.approx(120.0)

        # 08:00:01: the leasing controller reclaims; the directives stay as they are.
        w.clock.now = at("08:00:01")
        await w.lease_status(
            {
                **STEADY,
                "phase": "Reclaiming",
                "targetReplicas": 4,
                "lent": [
                    {"replica": "recsys-2", "devices": group(w.node("n1"))},
                    {"replica": "recsys-3", "devices": group(w.node("n2"))},
                ],
                "reclaim": {
                    "startedAt": microtime(at("08:00:00") + 0.3),
                    "deadline": microtime(at("08:00:45") + 0.3),
                    "noticed": [],
                    "groups": ["recsys-2", "recsys-3"],
                    "finalizing": False,
                },
            }
        )
        await reconciled_past(w)
        assert await w.prewarmed() == got

        # Scaled to 4 replicas and Steady again: cleared everywhere.
        w.clock.now = at("08:01:30")
        await w.kube.json(
            "PATCH",
            f"/apis/apps/v1/namespaces/{w.ns}/statefulsets/recsys",
            body={"spec": {"replicas": 4}},
            content_type="application/merge-patch+json",
        )
        await w.lease_status({**STEADY, "targetReplicas": 4, "lent": []})

        async def cleared() -> bool:
            return await w.prewarmed() == {}

        await eventually(cleared, within_s=15)
        assert w.sample("tidelease_prewarm_directives_cleared_total") == 3
        n1 = await w.kube.json("GET", f"{GPN}/{w.node('n1')}")
        assert n1["spec"]["devices"] == devices_before
        assert "prewarm" not in n1["spec"]


async def test_deleting_the_lease_clears_its_directives(apiserver: ApiServer) -> None:
    async with world(apiserver) as w, controller(w):
        w.clock.now = at("07:59:00")

        async def written() -> bool:
            return set(await w.prewarmed()) == {"n1", "s1", "s2"}

        await eventually(written, within_s=15)
        await w.kube.json("DELETE", w.lease_path)

        async def cleared() -> bool:
            return await w.prewarmed() == {}

        await eventually(cleared, within_s=15)


class CachedCheckpoints:
    """A cache that fetches instantly (the peer path is tested in tests/containerd)."""

    def __init__(self) -> None:
        self.held: set[str] = set()

    def has(self, checkpoint: str) -> bool:
        return checkpoint in self.held

    async def fetch(self, checkpoint: str) -> str:
        self.held.add(checkpoint)
        return "fetched"


async def test_the_agent_follows_its_directives_and_its_status_publishes_keep_the_report(
    apiserver: ApiServer,
) -> None:
    """Controller -> spec.prewarm -> the node's agent (field-selected watch) -> status.prewarm,
    which the agent's own full-status publishes keep."""
    from nodeagent.prewarm import KubePrewarmNode, PrewarmAgentSettings, Prewarmer, run_prewarm
    from nodeagent.publishing import KubePublisher

    async with world(apiserver) as w:
        w.clock.now = at("07:59:00")  # past notBefore: the agent starts at once
        n1 = w.node("n1")
        prewarmer = Prewarmer(
            settings=PrewarmAgentSettings(node=n1, retries=0),
            images=None,  # no CRI runtime: the image is reported Failed
            checkpoints=CachedCheckpoints(),
        )
        agent = asyncio.create_task(
            run_prewarm(node=KubePrewarmNode(w.kube, n1), prewarmer=prewarmer)
        )
        try:
            async with controller(w):

                async def reported() -> dict[str, str] | None:
                    obj = await w.kube.json("GET", f"{GPN}/{n1}")
                    items = ((obj.get("status") or {}).get("prewarm") or {}).get("items") or []
                    states = {i["kind"]: i["state"] for i in items}
                    return states if states == {"image": "Failed", "checkpoint": "Done"} else None

                await eventually(reported, within_s=20)
                # The agent's periodic status publish replaces the whole status: the report stays.
                obj = await w.kube.json("GET", f"{GPN}/{n1}")
                status = {**obj["status"], "prewarm": prewarmer.status()}
                await KubePublisher(w.kube, node=n1, namespace="default").publish(status)
                assert await reported()

                # Cleared by the controller (the lease is deleted): the agent's report empties.
                await w.kube.json("DELETE", w.lease_path)

                async def emptied() -> bool:
                    obj = await w.kube.json("GET", f"{GPN}/{n1}")
                    return obj["status"].get("prewarm") == {"items": []}

                await eventually(emptied, within_s=20)
        finally:
            agent.cancel()
            await asyncio.gather(agent, return_exceptions=True)


async def test_tidelease_agent_with_a_cache_carries_out_its_directive(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    """`tidelease agent --cache-dir ...` as a process: prewarming is on, and its report stays
    through the agent's own status publishes (every 0.5 s here)."""
    import signal
    import socket
    import sys

    from nodeagent.cache.testing import write_token

    node = f"prewarm-{uuid.uuid4().hex[:6]}"
    kube = await KubeClient.connect(apiserver.kubeconfig)
    with contextlib.suppress(Exception):
        await kube.json(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": "tidelease-system"}}
        )
    write_token(tmp_path / "token")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "common.cli",
        "agent",
        "--node",
        node,
        "--backend",
        "fake",
        "--fake-gpus",
        "2",
        "--no-device-plugin",
        "--kubeconfig",
        str(apiserver.kubeconfig),
        "--cycle",
        "0.5",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--cache-token-file",
        str(tmp_path / "token"),
        "--cache-port",
        str(port),
        "--cache-advertise",
        f"http://127.0.0.1:{port}",
        stderr=asyncio.subprocess.DEVNULL,
    )
    path = f"{GPN}/{node}"
    try:

        async def published() -> bool:
            try:
                return bool((await kube.json("GET", path)).get("status", {}).get("devices"))
            except NotFound:
                return False

        await eventually(published, within_s=30)
        now = time.time()
        directive = {
            "lease": "ml/recsys",
            "role": "Standby",
            "images": [IMAGE],
            "checkpoints": ["nobody-has-it"],
            "notBefore": microtime(now - 1),
            "deadline": microtime(now + 300),
            "windowSeconds": 82.0,
        }
        await kube.json(
            "PATCH",
            path,
            body={"spec": {"prewarm": [directive]}},
            content_type="application/merge-patch+json",
        )

        async def reported() -> dict[str, dict[str, Any]] | None:
            obj = await kube.json("GET", path)
            items = ((obj.get("status") or {}).get("prewarm") or {}).get("items") or []
            by_kind = {i["kind"]: i for i in items}
            done = len(by_kind) == 2 and all(i["state"] == "Failed" for i in by_kind.values())
            return by_kind if done else None

        items = await eventually(reported, within_s=90)
        assert "--cri-endpoint" in items["image"]["reason"]
        assert "nobody-has-it" in items["checkpoint"]["reason"]
        # A marker: a second directive, for another lease. Once the agent reports its item, it
        # has run (and published its whole status) past the first items' failure: they must
        # still be Failed, unchanged, not retried.
        marker = {**directive, "lease": "ml/marker", "images": [], "checkpoints": ["marker-only"]}
        await kube.json(
            "PATCH",
            path,
            body={"spec": {"prewarm": [directive, marker]}},
            content_type="application/merge-patch+json",
        )

        async def marked() -> list[dict[str, Any]] | None:
            obj = await kube.json("GET", path)
            now = ((obj.get("status") or {}).get("prewarm") or {}).get("items") or []
            seen = any(i["lease"] == "ml/marker" and i["state"] == "Failed" for i in now)
            return list(now) if seen else None

        after = await eventually(marked, within_s=90)
        assert {i["kind"]: i for i in after if i["lease"] == directive["lease"]} == items
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        with contextlib.suppress(Exception):
            await kube.json("DELETE", path)
        await kube.close()
