"""The embedded default: an extender serving a built-in cluster, and a day of tides replayed on it.

``tidelease demo`` starts a real extender HTTP server on loopback over an in-memory store holding
the demo cluster below, and drives it over HTTP exactly as kube-scheduler would
(:class:`~extender.scheduler.driver.SchedulerDriver`). The steps a leasing controller will take
(tag the devices an online job releases, evict borrowers) are played by the script itself. Every
placement decision is printed with its reason.

The demo cluster: five nodes of eight GPUs.

* gpu-node-1, gpu-node-2: H20, all HA; node 1 caches the recsys image and checkpoint.
* gpu-node-3: H20, four HA, two MA, two LA, of which one is unhealthy.
* gpu-node-4: H20, four HA in the standby pool and four MA.
* gpu-node-5: A100, all MA.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

import aiohttp

from common import builders, contract
from common.model import Priority, Tier
from common.tenancy import job_key
from extender.cluster.store import MemoryStore
from extender.rightofreturn.rules import ordinal
from extender.scheduler.driver import Outcome, SchedulerDriver
from extender.scheduler.extenderserver import Running, serve
from extender.scheduler.settings import ExtenderSettings

OWNER = job_key("default", "recsys")  # recsys, a job of namespace default
RECSYS_IMAGE = "registry.example/recsys:v7"
RECSYS_CKPT = "recsys-ckpt-0412"
NODES = [f"gpu-node-{i}" for i in range(1, 6)]


def demo_objects() -> list[dict[str, Any]]:
    d = builders.devices
    return [
        builders.namespace("default"),  # granted online jobs by the admin (docs/tenancy.md)
        builders.gpu_node("gpu-node-1", images=[RECSYS_IMAGE], checkpoints=[RECSYS_CKPT]),
        builders.gpu_node("gpu-node-2"),
        builders.gpu_node(
            "gpu-node-3",
            d("gpu-node-3", 4)
            + d("gpu-node-3", 2, tier=Tier.MA, start=4)
            + d("gpu-node-3", 1, tier=Tier.LA, start=6)
            + d("gpu-node-3", 1, tier=Tier.LA, healthy=False, start=7),
        ),
        builders.gpu_node(
            "gpu-node-4",
            d("gpu-node-4", 4, standby=True) + d("gpu-node-4", 4, tier=Tier.MA, start=4),
        ),
        builders.gpu_node("gpu-node-5", d("gpu-node-5", gpu_type="A100", tier=Tier.MA)),
    ]


def recsys_pod(i: int, *, generation: int = 0) -> dict[str, Any]:
    """A replica of the StatefulSet recsys (its controller, what ties it to its GpuLease)."""
    return builders.pod(
        f"recsys-{i}",
        4,
        uid=f"uid-recsys-{i}-g{generation}",
        priority=Priority.HIGH,
        owner="recsys",
        tier=Tier.HA,
        gpu_type="H20",
        checkpoint=RECSYS_CKPT,
        image=RECSYS_IMAGE,
        pod_priority=1000,
        controller=("StatefulSet", "recsys"),
    )


def borrower_pod(i: int) -> dict[str, Any]:
    return builders.pod(
        f"finetune-{i}",
        4,
        uid=f"uid-finetune-{i}",
        priority=Priority.LOW,
        pod_priority=100,
        image="registry.example/finetune:v2",
    )


@dataclass(slots=True)
class DemoReport:
    """What happened, for the printed summary and for tests."""

    placements: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    lent: dict[str, tuple[str, ...]] = field(default_factory=dict)  # recsys pod -> devices lent
    reclaimed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pod -> devices got
    returned: int = 0  # lent devices that came back to recsys
    backfilled: int = 0  # standby devices recsys got instead


class Demo:
    def __init__(
        self, store: MemoryStore, running: Running, driver: SchedulerDriver, out: TextIO
    ) -> None:
        self.store, self.running, self.driver, self.out = store, running, driver, out
        self.report = DemoReport()

    def say(self, text: str = "") -> None:
        print(text, file=self.out)

    def devices_of(self, name: str) -> tuple[str, tuple[str, ...]]:
        obj = self.store.get("Pod", "default", name) or {}
        ann = obj.get("metadata", {}).get("annotations", {})
        devs = tuple(filter(None, ann.get(contract.ANN_DEVICES, "").split(",")))
        return ann.get(contract.ANN_DEVICE_NODE, ""), devs

    def index_of(self, node: str, uuid: str) -> int:
        for i in range(8):
            if builders.device_uuid(node, i) == uuid:
                return i
        return -1

    def standby_uuids(self, node: str) -> set[str]:
        obj = self.store.get("GpuNode", "", node) or {}
        return {e["uuid"] for e in obj.get("spec", {}).get("devices", []) if e.get("standby")}

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        return [
            p for p in self.store.objects("Pod") if (p.get("spec") or {}).get("nodeName") == node
        ]

    async def evict(self, node: str, uids: list[str]) -> None:
        for p in self.pods_on(node):
            if p["metadata"]["uid"] in uids:
                self.say(f"    evict {p['metadata']['name']} from {node} (preempted by reclaim)")
                self.store.delete("Pod", "default", p["metadata"]["name"])
        await self.settle()

    async def settle(self) -> None:
        await self.store.settle()
        await self.running.app.binder.reap_once()
        await self.store.settle()

    async def schedule(self, pod: dict[str, Any]) -> Outcome:
        self.store.put(pod)
        await self.store.settle()
        out = await self.driver.schedule(pod, NODES, victims_on=self.pods_on, evict=self.evict)
        await self.store.settle()
        self.report.outcomes.append(out)
        name = pod["metadata"]["name"]
        rejected = {**out.failed, **out.unresolvable}
        if rejected:
            for node, why in sorted(rejected.items()):
                self.say(f"    {name}: {node} rejected: {why}")
        if out.bound:
            node, devs = self.devices_of(name)
            self.report.placements[name] = (node, devs)
            idx = ",".join(str(self.index_of(node, u)) for u in devs)
            scores = " ".join(f"{n}={s}" for n, s in sorted(out.scores.items()))
            self.say(f"  > {name} -> {node} GPUs [{idx}]   scores: {scores}")
        else:
            self.say(f"  x {name} not placed: {out.error}")
        return out

    def set_tags(self, node: str, tags: dict[str, dict[str, Any]]) -> None:
        """What the leasing controller does: write owner tags / standby into GpuNode.spec."""
        obj = copy.deepcopy(self.store.get("GpuNode", "", node))
        assert obj is not None
        entries = {e["uuid"]: e for e in obj["spec"].get("devices", [])}
        for uuid, tag in tags.items():
            entries[uuid] = {"uuid": uuid, **tag}
        obj["spec"]["devices"] = [e for e in entries.values() if len(e) > 1]
        self.store.put(obj)

    def set_health(self, node: str, uuid: str, health: str) -> None:
        """What the node agent does when NVML reports a fault."""
        obj = copy.deepcopy(self.store.get("GpuNode", "", node))
        assert obj is not None
        for dev in obj["status"]["devices"]:
            if dev["uuid"] == uuid:
                dev["health"] = health
        self.store.put(obj)

    async def scale_down(self, names: Sequence[str]) -> None:
        for name in names:
            node, devs = self.devices_of(name)
            self.report.lent[name] = devs
            self.set_tags(node, {u: {"owner": OWNER, "replica": name} for u in devs})
            self.store.delete("Pod", "default", name)
            idx = ",".join(str(self.index_of(node, u)) for u in devs)
            self.say(f"  - {name} released {node} GPUs [{idx}], tagged owner={OWNER} (lent out)")
        await self.settle()

    async def reclaim(self) -> None:
        """What the leasing controller records when recsys scales up: its GpuLease reclaims the
        lent groups, which makes recsys' replicas reclaims (nothing on the pods says so)."""
        lease = builders.gpu_lease("recsys", "default", gpus_per_replica=4, desired_gpus=16)
        lease["status"] = {
            "phase": "Reclaiming",
            "lent": [{"replica": r, "devices": list(d)} for r, d in self.report.lent.items()],
            "reclaim": {"groups": list(self.report.lent)},
        }
        self.store.put(lease)
        # ... and gives the borrowers of the lent devices their notice (the preempt verb evicts
        # none without one).
        lent = {u for devs in self.report.lent.values() for u in devs}
        for p in self.store.objects("Pod"):
            annotations = (p.get("metadata") or {}).get("annotations") or {}
            held = set((annotations.get(contract.ANN_DEVICES) or "").split(","))
            if annotations.get(contract.ANN_PRIORITY) == "low" and held & lent:
                noticed = copy.deepcopy(p)
                noticed["metadata"]["annotations"][contract.ANN_RECLAIM_NOTICE] = (
                    "2026-01-01T00:00:00Z"
                )
                self.store.put(noticed)
        await self.settle()

    async def run(self) -> DemoReport:
        say = self.say
        say("== 1. Day: online job recsys (high priority, HA, H20) runs 4 pods x 4 GPUs")
        for i in range(4):
            await self.schedule(recsys_pod(i))

        say("\n== 2. Night: recsys scales down to 2 pods; the released GPUs are lent out")
        lent = [n for n in ("recsys-2", "recsys-3") if n in self.report.placements]
        await self.scale_down(lent)

        say("\n== 3. Another online job (ads, high priority) may not take recsys' lent GPUs")
        await self.schedule(
            builders.pod(
                "ads-0",
                4,
                uid="uid-ads-0",
                priority=Priority.HIGH,
                owner="ads",
                tier=Tier.HA,
                gpu_type="H20",
                pod_priority=1000,
            )
        )

        say("\n== 4. Borrowers (low priority) fill free GPUs, untagged first, then lent ones")
        for i in range(5):
            await self.schedule(borrower_pod(i))

        say("\n== 5. A lent GPU fails during the night")
        if lent:
            broken_node = self.report.placements[lent[-1]][0]
            bad = self.report.lent[lent[-1]][0]
            self.set_health(broken_node, bad, "Unhealthy")
            await self.settle()
            say(f"  ! {broken_node} GPU {self.index_of(broken_node, bad)} is unhealthy")

        say("\n== 6. Morning: recsys scales up again and reclaims its GPUs (right of return)")
        await self.reclaim()
        for gen, name in enumerate(lent, start=1):
            i = ordinal(name)
            out = await self.schedule(recsys_pod(i, generation=gen))
            if out.bound:
                self.report.reclaimed[name] = self.devices_of(name)[1]
        lent_set = {u for devs in self.report.lent.values() for u in devs}
        back = {u for devs in self.report.reclaimed.values() for u in devs}
        standby = {u for node in NODES for u in self.standby_uuids(node) if u in back}
        self.report.returned = len(back & lent_set)
        self.report.backfilled = len(standby)
        say("\nSummary")
        say(
            f"  recsys lent {len(lent_set)} GPUs; {self.report.returned} of the same GPUs came "
            f"back, {self.report.backfilled} came from the standby pool (same type and tier) "
            f"for the pod whose lent GPUs could not all return (one failed)"
        )
        return self.report


async def run_demo(
    *,
    out: TextIO = sys.stdout,
    settings: ExtenderSettings | None = None,
    on_running: Callable[[Running], None] | None = None,
) -> DemoReport:
    store = MemoryStore(demo_objects())
    settings = settings or ExtenderSettings(host="127.0.0.1", port=0)
    # Pods the script deletes are really gone: release their GPUs at once.
    settings = replace(settings, missing_grace_s=1e-6)
    async with serve(store=store, settings=settings) as running:
        if on_running is not None:
            on_running(running)
        print(f"tidelease extender serving the demo cluster at {running.url}", file=out)
        async with aiohttp.ClientSession() as session:
            demo = Demo(store, running, SchedulerDriver(session, running.url), out)
            return await demo.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tidelease demo", description=__doc__)
    parser.parse_args(argv)
    asyncio.run(run_demo())
    return 0
