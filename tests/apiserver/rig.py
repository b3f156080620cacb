"""A small world on a real API server for the leasing controller: GPU nodes, a StatefulSet
whose pods this rig creates and deletes (standing in for kube-controller-manager), and pods
scheduled through the real extender over HTTP (standing in for kube-scheduler)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from common import builders, contract
from common.errors import Conflict, NotFound
from common.kubeclient import KubeClient
from common.model import Priority, Tier
from extender.cluster.kubestore import KubeStore
from extender.controllers import Enabled, controllers
from extender.leasing.kubeworld import KubeWorld
from extender.scheduler.driver import SchedulerDriver
from extender.scheduler.extenderserver import Running, serve
from extender.scheduler.settings import ExtenderSettings

log = logging.getLogger(__name__)
GPN = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"


def lent_devices(status: dict[str, Any]) -> tuple[str, ...]:
    """Every device a GpuLease status says is lent (it lists them by the replica that lent)."""
    return tuple(u for g in status.get("lent") or [] for u in g.get("devices") or [])


def owner_pod(name: str, ns: str) -> dict[str, Any]:
    pod = builders.pod(
        name,
        4,
        namespace=ns,
        priority=Priority.HIGH,
        owner="recsys",
        tier=Tier.HA,
        priority_class="rig-online",
        controller=("StatefulSet", "recsys"),  # the stand-in's replicas, as the real one's
    )
    pod["metadata"]["labels"] = {"app": "recsys"}
    return pod


@dataclass
class Rig:
    kube: KubeClient
    ns: str
    nodes: list[str]
    kubeconfig: str
    running: Running | None = None
    # Borrowers' notice: the extender's leasing_test_grace_s (the lease says 30, the minimum)
    grace_s: int = 1
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    # --- objects ---
    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.kube.json("POST", path, body=obj)

    async def lease(self) -> dict[str, Any]:
        return await self.kube.json(
            "GET", f"/apis/{contract.API_VERSION}/namespaces/{self.ns}/gpuleases/recsys"
        )

    async def set_desired(self, gpus: int) -> None:
        await self.kube.json(
            "PATCH",
            f"/apis/{contract.API_VERSION}/namespaces/{self.ns}/gpuleases/recsys",
            body={"spec": {"desiredGPUs": gpus}},
            content_type="application/merge-patch+json",
        )

    async def all_pods(self) -> list[dict[str, Any]]:
        listed = await self.kube.json("GET", f"/api/v1/namespaces/{self.ns}/pods")
        return list(listed.get("items") or [])

    async def pods(self) -> list[dict[str, Any]]:
        return [p for p in await self.all_pods() if not p["metadata"].get("deletionTimestamp")]

    async def gpu_node(self, name: str) -> dict[str, Any]:
        return await self.kube.json("GET", f"{GPN}/{name}")

    async def set_health(self, node: str, uuid_: str, health: str) -> None:
        obj = await self.gpu_node(node)
        for d in obj["status"]["devices"]:
            if d["uuid"] == uuid_:
                d["health"] = health
        await self.kube.json("PUT", f"{GPN}/{node}/status", body=obj)

    async def ledger_devices(self) -> list[tuple[str, str]]:
        """(device, pod) for every allocation in every ledger of the rig's nodes."""
        held: list[tuple[str, str]] = []
        for node in self.nodes:
            try:
                obj = await self.kube.json(
                    "GET", f"/apis/{contract.API_VERSION}/gpuallocations/{node}"
                )
            except NotFound:
                continue
            for a in obj.get("spec", {}).get("allocations") or []:
                held.extend((u, a["name"]) for u in a["devices"])
        return held

    # --- stand-ins for kube-controller-manager and kube-scheduler ---
    async def statefulset_loop(self) -> None:
        while True:
            try:
                scale = await self.kube.json(
                    "GET", f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/recsys/scale"
                )
                want = int(scale["spec"].get("replicas") or 0)
                have = {
                    p["metadata"]["name"]: p
                    for p in await self.pods()
                    if p["metadata"].get("labels", {}).get("app") == "recsys"
                }
                for i in range(want):
                    if f"recsys-{i}" not in have:
                        await self.create(
                            f"/api/v1/namespaces/{self.ns}/pods", owner_pod(f"recsys-{i}", self.ns)
                        )
                for name in have:
                    if int(name.rsplit("-", 1)[1]) >= want:
                        await self.kube.json(
                            "DELETE",
                            f"/api/v1/namespaces/{self.ns}/pods/{name}",
                            body={"gracePeriodSeconds": 0},
                        )
            except (Conflict, NotFound) as e:
                log.info("statefulset stand-in: %s", e)
            await asyncio.sleep(0.1)

    async def kubelet_loop(self) -> None:
        """Terminating pods finish terminating (a kubelet would stop their containers)."""
        while True:
            for p in await self.all_pods():
                if p["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(NotFound, Conflict):
                        await self.kube.json(
                            "DELETE",
                            f"/api/v1/namespaces/{self.ns}/pods/{p['metadata']['name']}",
                            body={"gracePeriodSeconds": 0},
                        )
            await asyncio.sleep(0.1)

    async def scheduler_loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            if self.running is not None:
                driver = SchedulerDriver(session, self.running.url)
                for pod in await self.pods():
                    if not pod["spec"].get("nodeName"):
                        try:
                            out = await driver.schedule(pod, self.nodes)
                        except Exception as e:
                            log.info("scheduling %s: %s", pod["metadata"]["name"], e)
                            continue
                        if not out.bound:
                            log.info(
                                "scheduling %s: %s %s",
                                out.pod,
                                out.error,
                                {**out.failed, **out.unresolvable},
                            )
            await asyncio.sleep(0.1)

    async def placed(self, prefix: str) -> dict[str, tuple[str, ...]]:
        out = {}
        for p in await self.pods():
            ann = p["metadata"].get("annotations", {})
            if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName"):
                out[p["metadata"]["name"]] = tuple(ann.get(contract.ANN_DEVICES, "").split(","))
        return out


async def make_rig(kube: KubeClient, kubeconfig: str, *, standby: bool = True) -> Rig:
    for name, value in (("rig-online", 1000), ("rig-borrower", 10)):
        with contextlib.suppress(Conflict):
            await kube.json(
                "POST",
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                body={"metadata": {"name": name}, "value": value},
            )
    ns = f"lease-{uuid.uuid4().hex[:6]}"
    await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(ns))
    nodes = [f"{ns}-n1", f"{ns}-n2"] + ([f"{ns}-s1"] if standby else [])
    for name in nodes:
        devs = (
            builders.devices(name, 4, standby=True)
            if name.endswith("s1")
            else builders.devices(name, 8)
        )
        obj = builders.gpu_node(name, devs)
        created = await kube.json("POST", GPN, body={**obj, "status": None})
        await kube.json("PUT", f"{GPN}/{name}/status", body={**created, "status": obj["status"]})
    sts = builders.statefulset("recsys", ns, replicas=4)
    await kube.json("POST", f"/apis/apps/v1/namespaces/{ns}/statefulsets", body=sts)
    lease = builders.gpu_lease("recsys", ns, gpus_per_replica=4, desired_gpus=16, grace_s=30)
    await kube.json("POST", f"/apis/{contract.API_VERSION}/namespaces/{ns}/gpuleases", body=lease)
    return Rig(kube, ns, nodes, kubeconfig)


@contextlib.asynccontextmanager
async def running_rig(
    kubeconfig: str, *, standby: bool = True, grace_s: int | None = None
) -> AsyncIterator[Rig]:
    """A rig with its stand-ins for kube-controller-manager, kube-scheduler and kubelet running."""
    from pathlib import Path

    kube = await KubeClient.connect(Path(kubeconfig))
    rig = await make_rig(kube, kubeconfig, standby=standby)
    if grace_s is not None:
        rig.grace_s = grace_s
    async with aiohttp.ClientSession() as session:
        rig.tasks = [
            asyncio.create_task(rig.statefulset_loop()),
            asyncio.create_task(rig.scheduler_loop(session)),
            asyncio.create_task(rig.kubelet_loop()),
        ]
        try:
            yield rig
        finally:
            for t in rig.tasks:
                t.cancel()
            await asyncio.gather(*rig.tasks, return_exceptions=True)
            await kube.close()


@contextlib.asynccontextmanager
async def extender(rig: Rig, *, overdue_s: float = 120.0) -> AsyncIterator[Running]:
    """The extender and the leasing controller, as the deployment runs them: each with its
    own watched view (here in one process, each stopped with the block). ``overdue_s``: the
    setting reclaim_overdue_s."""
    from pathlib import Path

    store = await KubeStore.connect(Path(rig.kubeconfig))
    controllers_store = await KubeStore.connect(Path(rig.kubeconfig))
    kube = await KubeClient.connect(Path(rig.kubeconfig))
    settings = ExtenderSettings(
        host="127.0.0.1",
        port=0,
        reap_interval_s=0.5,
        missing_grace_s=0.5,
        leasing_test_grace_s=rig.grace_s,
        reclaim_overdue_s=overdue_s,
    )
    try:
        async with (
            serve(store=store, settings=settings) as running,
            controllers(
                store=controllers_store,
                world=KubeWorld(kube),
                kube=kube,
                settings=settings,
                enabled=Enabled(leasing=True),
            ),
        ):
            rig.running = running
            yield running
    finally:
        rig.running = None
        await store.close()
        await controllers_store.close()
        await kube.close()
