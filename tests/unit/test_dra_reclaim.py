"""Reclaim in DRA mode: which gated pod of an owner the leasing controller pins to its lent
devices, or lets go (extender.leasing.claimpinning.next_claim_step), and the controller doing it
over a MemoryStore (the claims watched, a gated pod stepping its lease at once)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common import builders as b
from common import deviceattributes
from common.model import Device, GpuUuid, Holder, NodeName, Priority, Tier
from common.tenancy import job_key
from extender.cluster.store import MemoryStore
from extender.cluster.testing import FixedView
from extender.cluster.watching import ClaimCache
from extender.controllers import Enabled, controllers
from extender.leasing import claimpinning as pinning
from extender.leasing.controller import DRA_VIEW_KINDS, LeaseController
from extender.leasing.decisions import TagChange
from extender.leasing.metrics import LeasingMetrics
from extender.rightofreturn.lease import GpuLease, LeaseStatus, LentGroup, Workload, parse_gpu_lease
from extender.scheduler.settings import ExtenderSettings
from tests.polling import eventually
from tests.unit.cluster import cluster, granted_leases

NS = "ns"
KEY = job_key(NS, "job")  # the lease's owner, as tags and holders name it
NODE = NodeName("node-a")
OTHER = NodeName("node-b")
DEVICES: list[Device] = b.devices(NODE, 4, tier=Tier.HA) + b.devices(OTHER, 4, tier=Tier.HA)
BY_UUID = {d.uuid: d for d in DEVICES}
OFFERING = {NODE: True, OTHER: True}


def uuid(node: str, index: int) -> GpuUuid:
    return b.device_uuid(node, index)


# job-1 lent node-a's gpu-2 and gpu-3 (in that order), job-2 node-b's gpu-1 and gpu-0.
GROUPS = (
    LentGroup("job-1", (uuid(NODE, 2), uuid(NODE, 3))),
    LentGroup("job-2", (uuid(OTHER, 1), uuid(OTHER, 0))),
)


def lease(
    *, phase: str = "Reclaiming", kind: str = "StatefulSet", finalizing: bool = False
) -> GpuLease:
    obj = b.gpu_lease("job", NS, gpus_per_replica=2, desired_gpus=6)
    obj["spec"]["workload"]["kind"] = kind
    obj["metadata"]["resourceVersion"] = "1"
    status = LeaseStatus(
        phase=phase,  # type: ignore[arg-type]
        target_replicas=3,
        groups=GROUPS,
        reclaiming=("job-1", "job-2") if phase == "Reclaiming" else (),
        reclaim_started=1.0e9 if phase == "Reclaiming" else None,
        finalizing=finalizing,
    )
    obj["status"] = status.to_json()
    return parse_gpu_lease(obj)


def claim_obj(name: str, *, count: int = 2, allocated: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": deviceattributes.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "5"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": deviceattributes.CLASS_HA, "count": count},
                    }
                ]
            }
        },
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {"devices": {"results": []}}
    return obj


def gated(name: str, *claims: str) -> pinning.GatedPod:
    return pinning.GatedPod(NS, name, b.pod(name, namespace=NS)["metadata"]["uid"], claims)


def claims_of(*objs: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(NS, o["metadata"]["name"]): o for o in objs}


def step(
    the_lease: GpuLease,
    pods: list[pinning.GatedPod],
    claims: dict[tuple[str, str], dict[str, Any]],
    *,
    devices: dict[GpuUuid, Device] | None = None,
    offering: dict[NodeName, bool] | None = None,
    taken: Iterable[GpuUuid] = (),
    owned: Iterable[GpuUuid] = (),
    live: Iterable[str] = (),
) -> pinning.ClaimStep | None:
    return pinning.next_claim_step(
        the_lease,
        pods,
        claims,
        BY_UUID if devices is None else devices,
        OFFERING if offering is None else offering,  # type: ignore[arg-type]
        set(taken),
        set(owned),
        set(live),
    )


def pinned_names(found: pinning.ClaimStep | None) -> tuple[str, str, list[tuple[str, str]]]:
    """(pod, group, [(pool, device)] of the allocation) of a Pin."""
    assert isinstance(found, pinning.Pin), found
    results = found.status["allocation"]["devices"]["results"]
    return found.pod.name, found.group, [(r["pool"], r["device"]) for r in results]


# --- the decision ---


def test_a_returning_replica_is_pinned_to_exactly_its_own_group_in_order() -> None:
    found = step(lease(), [gated("job-1", "job-1-gpu")], claims_of(claim_obj("job-1-gpu")))
    assert pinned_names(found) == ("job-1", "job-1", [(NODE, "gpu-2"), (NODE, "gpu-3")])
    assert isinstance(found, pinning.Pin)
    assert [d.uuid for d in found.devices] == list(GROUPS[0].devices)
    # job-2 gets job-2's group, not job-1's, whichever comes first.
    found = step(lease(), [gated("job-2", "job-2-gpu")], claims_of(claim_obj("job-2-gpu")))
    assert pinned_names(found) == ("job-2", "job-2", [(OTHER, "gpu-1"), (OTHER, "gpu-0")])


def test_a_device_a_claim_still_holds_keeps_that_replica_waiting_not_the_others() -> None:
    pods = [gated("job-1", "c1"), gated("job-2", "c2")]
    claims = claims_of(claim_obj("c1"), claim_obj("c2"))
    assert step(lease(), pods, claims, taken=[uuid(NODE, 3), uuid(OTHER, 0)]) is None
    found = step(lease(), pods, claims, taken=[uuid(NODE, 3)])
    assert pinned_names(found)[:2] == ("job-2", "job-2")


def test_a_claim_not_made_yet_waits_and_an_allocated_one_lets_its_pod_go() -> None:
    assert step(lease(), [gated("job-1", "")], {}) is None  # no name in the pod's status yet
    assert step(lease(), [gated("job-1", "c1")], {}) is None  # named, not in the view yet
    found = step(lease(), [gated("job-1", "c1")], claims_of(claim_obj("c1", allocated=True)))
    assert isinstance(found, pinning.Ungate), found
    assert not found.warning


@pytest.mark.parametrize(
    ("change", "what"),
    [
        (lambda d: {**d, uuid(NODE, 3): _unhealthy(d[uuid(NODE, 3)])}, "unhealthy"),
        (lambda d: {k: v for k, v in d.items() if k != uuid(NODE, 2)}, "gone"),
    ],
    ids=["unhealthy", "gone"],
)
def test_a_group_that_cannot_come_back_whole_lets_its_pod_go_with_a_warning(
    change: Callable[[dict[GpuUuid, Device]], dict[GpuUuid, Device]], what: str
) -> None:
    found = step(
        lease(), [gated("job-1", "c1")], claims_of(claim_obj("c1")), devices=change(BY_UUID)
    )
    assert isinstance(found, pinning.Ungate), found
    assert found.warning
    assert "cannot come back whole" in found.why


STANDBY = NodeName("standby-a")
SMALL = NodeName("standby-b")


def with_standby(*, tier: Tier = Tier.HA, gpu_type: str = "H20") -> dict[GpuUuid, Device]:
    """Node-a's gpu-3 unhealthy; standby nodes: standby-a with 4 devices (gpu-1 on loan to
    another job), standby-b with 1 (too few for a group of 2)."""
    out = {**BY_UUID, uuid(NODE, 3): _unhealthy(BY_UUID[uuid(NODE, 3)])}
    pool = b.devices(STANDBY, 4, tier=tier, gpu_type=gpu_type, standby=True)
    pool[1] = dataclasses.replace(pool[1], cls=pool[1].cls._replace(owner="other"))
    pool += b.devices(SMALL, 1, tier=tier, gpu_type=gpu_type, standby=True)
    return out | {d.uuid: d for d in pool}


def test_a_group_that_cannot_come_back_is_stood_in_for_by_standby_devices_on_one_node() -> None:
    def job_1(taken: Iterable[GpuUuid] = ()) -> pinning.ClaimStep | None:
        claims = claims_of(claim_obj("c1"))
        offering = {**OFFERING, STANDBY: True, SMALL: True}
        pods = [gated("job-1", "c1")]
        return step(lease(), pods, claims, devices=with_standby(), offering=offering, taken=taken)

    found = job_1()
    # standby-b has one free device, standby-a three (gpu-1 is on loan): gpu-0 and gpu-2.
    assert pinned_names(found) == ("job-1", "job-1", [(STANDBY, "gpu-0"), (STANDBY, "gpu-2")])
    assert isinstance(found, pinning.Pin)
    assert found.standby
    # Two of them held by claims: too few left anywhere.
    found = job_1(taken=[b.device_uuid(STANDBY, 0), b.device_uuid(STANDBY, 2)])
    assert isinstance(found, pinning.Ungate), found
    assert found.warning


@pytest.mark.parametrize(
    "pool", [{"tier": Tier.MA}, {"gpu_type": "A100"}], ids=["other-tier", "other-type"]
)
def test_standby_devices_of_another_type_or_tier_do_not_stand_in(pool: dict[str, Any]) -> None:
    found = step(
        lease(),
        [gated("job-1", "c1")],
        claims_of(claim_obj("c1")),
        devices=with_standby(**pool),
        offering={**OFFERING, STANDBY: True, SMALL: True},
    )
    assert isinstance(found, pinning.Ungate), found
    assert found.warning


def test_a_silent_node_lets_its_pod_go_unpinned() -> None:
    found = step(
        lease(), [gated("job-1", "c1")], claims_of(claim_obj("c1")), offering={NODE: False}
    )
    assert isinstance(found, pinning.Ungate), found
    assert found.warning


def _unhealthy(d: Device) -> Device:
    return dataclasses.replace(d, cls=d.cls._replace(healthy=False))


@pytest.mark.parametrize(
    ("pod", "the_lease"),
    [
        (gated("job-0", "c0"), lease()),  # not a reclaimed replica
        (gated("job-1", "c1"), lease(phase="Steady")),
        (gated("job-1", "c1"), lease(finalizing=True)),
    ],
    ids=["not-reclaimed", "steady", "finalizing"],
)
def test_a_pod_that_takes_back_no_group_goes_at_once(
    pod: pinning.GatedPod, the_lease: GpuLease
) -> None:
    found = step(the_lease, [pod], claims_of(claim_obj(pod.claims[0])))
    assert found == pinning.Ungate(pod, "it takes back no lent group")


@pytest.mark.parametrize(
    ("claims", "count"), [(("a", "b"), 2), (("c1",), 1)], ids=["two-claims", "one-device"]
)
def test_a_claim_that_cannot_be_pinned_lets_its_pod_go_with_a_warning(
    claims: tuple[str, ...], count: int
) -> None:
    objs = claims_of(*(claim_obj(c, count=count) for c in claims))
    found = step(lease(), [gated("job-1", *claims)], objs)
    assert isinstance(found, pinning.Ungate), found
    assert found.warning


def test_a_deployments_pods_take_the_groups_not_back_yet_one_each() -> None:
    dep = lease(kind="Deployment")
    pods = [gated("web-x", "cx"), gated("web-y", "cy")]
    claims = claims_of(claim_obj("cx"), claim_obj("cy"))
    assert pinned_names(step(dep, pods, claims))[:2] == ("web-x", "job-1")
    # job-1's group is back (its devices held by an owner's pod): web-x takes job-2's.
    assert pinned_names(step(dep, pods, claims, owned=GROUPS[0].devices))[:2] == ("web-x", "job-2")
    # job-1's devices still held by a borrower: web-x waits for them, web-y takes job-2's.
    found = step(dep, pods, claims, taken=GROUPS[0].devices[:1])
    assert pinned_names(found)[:2] == ("web-y", "job-2")
    # Both back: a third pod returns from no loan.
    found = step(dep, pods[:1], claims, owned=GROUPS[0].devices + GROUPS[1].devices)
    assert isinstance(found, pinning.Ungate), found
    assert not found.warning


def named(obj: dict[str, Any], group: str) -> dict[str, Any]:
    """``obj`` with the annotation a pin writes: the lent group its claim takes back."""
    obj["metadata"]["annotations"] = {pinning.RETURNED_GROUP: group}
    return obj


def test_a_group_stood_in_for_is_not_given_to_a_second_deployment_pod() -> None:
    dep = lease(kind="Deployment")
    # web-x's claim was pinned to standby devices in place of job-1's group (its devices are
    # not the group's, so "owned" cannot tell): web-y takes job-2's, not job-1's again.
    claims = claims_of(named(claim_obj("cx", allocated=True), "job-1"), claim_obj("cy"))
    assert pinned_names(step(dep, [gated("web-y", "cy")], claims))[:2] == ("web-y", "job-2")
    # Both groups named by claims: a third pod returns from no loan.
    claims = claims_of(
        named(claim_obj("cx", allocated=True), "job-1"),
        named(claim_obj("cy", allocated=True), "job-2"),
        claim_obj("cz"),
    )
    found = step(dep, [gated("web-z", "cz")], claims)
    assert isinstance(found, pinning.Ungate), found
    assert not found.warning


def test_a_pin_cut_short_resumes_with_the_group_its_claim_names() -> None:
    dep = lease(kind="Deployment")
    # The controller named job-2 on web-y's claim and stopped before the allocation: web-y
    # still takes job-2's group, and web-x (first in order) job-1's.
    claims = claims_of(claim_obj("cx"), named(claim_obj("cy"), "job-2"))
    pods = [gated("web-x", "cx"), gated("web-y", "cy")]
    assert pinned_names(step(dep, pods, claims))[:2] == ("web-x", "job-1")
    assert pinned_names(step(dep, pods[1:], claims))[:2] == ("web-y", "job-2")
    # A claim of another namespace naming a group does not count.
    other = named(claim_obj("cx"), "job-1")
    other["metadata"]["namespace"] = "elsewhere"
    claims = {("elsewhere", "cx"): other, (NS, "cy"): claim_obj("cy")}
    assert pinned_names(step(dep, [gated("web-y", "cy")], claims))[:2] == ("web-y", "job-1")


def test_a_claim_leaving_with_its_pod_gives_its_group_to_the_replacement() -> None:
    """A pinned pod deleted (say, it never fit its node): its claim, still allocated until the
    pod is gone, no longer keeps the group from the pod the ReplicaSet makes in its place."""
    dep = lease(kind="Deployment")
    old = named(claim_obj("cx", allocated=True), "job-1")
    old["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "web-x", "uid": "x-uid"}]
    claims = claims_of(old, claim_obj("cz"))
    pods = [gated("web-z", "cz")]
    # web-x still running: its claim keeps job-1, web-z takes job-2.
    found = step(dep, pods, claims, live={"x-uid"})
    assert pinned_names(found)[:2] == ("web-z", "job-2")
    # web-x being deleted (not live): web-z takes job-1, once its devices are free.
    assert step(dep, pods, claims, taken=GROUPS[0].devices, owned=GROUPS[1].devices) is None
    assert pinned_names(step(dep, pods, claims, owned=GROUPS[1].devices))[:2] == ("web-z", "job-1")
    # The claim itself being deleted: the same.
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    found = step(dep, pods, claims, live={"x-uid"}, owned=GROUPS[1].devices)
    assert pinned_names(found)[:2] == ("web-z", "job-1")


def test_pin_patch_adds_the_finalizer_and_the_group_once() -> None:
    fresh = claim_obj("c")
    assert pinning.pin_patch(fresh, "job-1") == {
        "metadata": {
            "finalizers": [pinning.FINALIZER],
            "resourceVersion": "5",
            "annotations": {pinning.RETURNED_GROUP: "job-1"},
        }
    }
    done = named(claim_obj("c"), "job-1")
    done["metadata"]["finalizers"] = [pinning.FINALIZER]
    assert pinning.pin_patch(done, "job-1") is None
    assert pinning.pin_patch(done, "job-2") == {
        "metadata": {"annotations": {pinning.RETURNED_GROUP: "job-2"}, "resourceVersion": "5"}
    }
    assert pinning.returned_group(done) == "job-1"
    assert pinning.returned_group(fresh) == ""
    assert pinning.returned_group(None) == ""


def test_gated_pod_reads_the_gate_and_the_claims_names() -> None:
    pod = b.pod("job-1", 0, namespace=NS)
    assert pinning.gated_pod(pod) is None
    pod["spec"]["schedulingGates"] = [{"name": "other"}, {"name": pinning.RECLAIM_GATE}]
    pod["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": "tpl"},
        {"name": "shared", "resourceClaimName": "shared-claim"},
        {"name": "later", "resourceClaimTemplateName": "tpl2"},
    ]
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "job-1-gpu-x"}]
    found = pinning.gated_pod(pod)
    assert found == pinning.GatedPod(
        NS, "job-1", pod["metadata"]["uid"], ("job-1-gpu-x", "shared-claim", "")
    )
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pinning.gated_pod(pod) is None


# --- the controller ---


class World:
    """Records the pins and gate lifts, and writes the reclaiming marks into the store's
    GpuNodes (as the API server would keep them); the workload has its 3 replicas."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store
        self.pins: list[tuple[str, str, tuple[GpuUuid, ...]]] = []
        self.ungated: list[tuple[str, bool]] = []
        self.marks: list[dict[GpuUuid, bool]] = []
        self.event = asyncio.Event()

    async def replicas(self, namespace: str, workload: Workload) -> int:
        return 3

    async def set_tags(self, changes: Iterable[TagChange]) -> None:
        pass

    async def write_status(self, *args: Any) -> None:
        pass

    async def notify(self, pod: Holder, lease: GpuLease, deadline: float) -> None:
        pass

    async def evict(self, pod: Holder, lease: GpuLease) -> None:
        pass

    async def scale(self, namespace: str, workload: Workload, replicas: int) -> None:
        pass

    async def pin(self, found: pinning.Pin, lease: GpuLease) -> None:
        meta = found.claim["metadata"]
        self.pins.append((found.pod.name, meta["name"], tuple(d.uuid for d in found.devices)))
        self.event.set()

    async def ungate(self, found: pinning.Ungate, lease: GpuLease) -> None:
        self.ungated.append((found.pod.name, found.warning))
        self.event.set()

    async def mark_reclaiming(self, found: pinning.MarkReclaiming) -> None:
        self.marks.append({u: on for marks in found.marks.values() for u, on in marks.items()})
        for node, marks in found.marks.items():
            obj = self.store.get("GpuNode", "", node) if self.store else None
            if obj is None:
                continue
            obj = copy.deepcopy(obj)
            for entry in obj["spec"]["devices"]:
                if entry["uuid"] in marks:
                    entry[deviceattributes.ATTR_RECLAIMING] = marks[entry["uuid"]]
            self.store.put(obj)  # type: ignore[union-attr]
        self.event.set()


def owner_pod(name: str, claim: str, *, gate: bool = True) -> dict[str, Any]:
    pod = b.pod(
        name,
        0,
        namespace=NS,
        owner="job",
        priority=Priority.HIGH,
        controller=("StatefulSet", "job"),
    )
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "tpl"}]
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]
    if gate:
        pod["spec"]["schedulingGates"] = [{"name": pinning.RECLAIM_GATE}]
    return pod


def lease_obj(phase: str) -> dict[str, Any]:
    obj = b.gpu_lease("job", NS, gpus_per_replica=2, desired_gpus=6)
    reclaiming = ("job-1",) if phase == "Reclaiming" else ()
    started = time.time() if reclaiming else None
    status = LeaseStatus(
        phase=phase,  # type: ignore[arg-type]
        groups=GROUPS[:1],
        reclaiming=reclaiming,
        reclaim_started=started,
        reclaim_deadline=started,
    )
    obj["status"] = status.to_json()
    return obj


def borrowers_claim(name: str, device: int) -> dict[str, Any]:
    """An allocated claim holding node-a's device ``device``, reserved for a borrower pod."""
    obj = claim_obj(name, count=1)
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": deviceattributes.DRIVER,
                        "pool": NODE,
                        "device": f"gpu-{device}",
                    }
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "borrower", "uid": "b-uid"}],
    }
    return obj


async def wait_for(world: World, check: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not check():
            world.event.clear()
            await world.event.wait()


RECONCILES = "tidelease_controller_reconcile_duration_seconds_count"


async def reconciled(registry: CollectorRegistry, passes: int = 2) -> None:
    """Until the leasing controller has finished ``passes`` more reconciles: what it has done
    by then (or not) is its answer, not the outcome of a race with a slow machine."""
    labels = {"controller": "leasing"}
    start = registry.get_sample_value(RECONCILES, labels) or 0.0

    async def done() -> bool:
        return (registry.get_sample_value(RECONCILES, labels) or 0.0) >= start + passes

    await eventually(done, within_s=10)


def lent_node() -> dict[str, Any]:
    """node-a, whose gpu-2 and gpu-3 job-1 lent (GROUPS[0]): tagged with their owner."""
    lent = b.devices(NODE, 2, tier=Tier.HA, start=2, owner=KEY, replica="job-1")
    return b.gpu_node(NODE, b.devices(NODE, 2, tier=Tier.HA) + lent)


async def test_the_controller_pins_a_returning_replica_once_the_borrowers_claim_is_gone() -> None:
    store = MemoryStore([lent_node(), b.namespace(NS)])
    store.put(borrowers_claim("borrowed", 3))
    store.put(claim_obj("job-1-gpu"))
    store.put(owner_pod("job-1", "job-1-gpu"))
    store.put(lease_obj("Reclaiming"))
    world = World(store)
    settings = ExtenderSettings(dra=True)
    registry = CollectorRegistry()
    async with controllers(
        store=store,
        world=world,  # type: ignore[arg-type]
        kube=None,  # type: ignore[arg-type]
        settings=settings,
        enabled=Enabled(leasing=True),
        registry=registry,
    ) as running:
        assert running.view is not None
        await store.settle()
        assert {k for k in DRA_VIEW_KINDS if store.watchers(k)} == set(DRA_VIEW_KINDS)
        await wait_for(world, lambda: bool(world.marks))
        await reconciled(registry)  # steps come and go: the borrower's claim holds gpu-3
        assert world.pins == []
        assert world.ungated == []

        # First of all, job-1's devices were marked reclaiming (borrowers keep off them), once:
        # the steps after it read the marks back from the GpuNode.
        assert world.marks == [dict.fromkeys(GROUPS[0].devices, True)]
        stored = store.get("GpuNode", "", NODE)
        assert stored is not None
        assert deviceattributes.reclaiming(stored) == set(GROUPS[0].devices)
        store.delete("ResourceClaim", NS, "borrowed")
        await wait_for(world, lambda: bool(world.pins))
        assert world.pins == [("job-1", "job-1-gpu", GROUPS[0].devices)]

        # A Steady lease's gated pod (a replica recreated, not returning from a loan) is let go
        # as soon as it appears, not at the lease's next resync (30 s).
        store.put({**lease_obj("Steady"), "metadata": {"name": "job", "namespace": NS}})
        await store.settle()
        store.put(owner_pod("job-0", "job-0-gpu"))
        await wait_for(world, lambda: ("job-0", False) in world.ungated)


class RefusingWorld(World):
    """The API server refuses every pin (as a 403 or 422 would)."""

    async def pin(self, found: pinning.Pin, lease: GpuLease) -> None:
        raise pinning.PinRefused("resourceclaims/status is forbidden")


async def test_a_refused_pin_lets_the_pod_go_with_a_warning_and_the_lease_go_on() -> None:
    store = MemoryStore([lent_node(), b.namespace(NS)])
    store.put(claim_obj("job-1-gpu"))
    store.put(owner_pod("job-1", "job-1-gpu"))
    store.put(lease_obj("Reclaiming"))
    world = RefusingWorld(store)
    async with controllers(
        store=store,
        world=world,  # type: ignore[arg-type]
        kube=None,  # type: ignore[arg-type]
        settings=ExtenderSettings(dra=True),
        enabled=Enabled(leasing=True),
        registry=CollectorRegistry(),
    ):
        await wait_for(world, lambda: bool(world.ungated))
        assert world.ungated[0] == ("job-1", True)


@pytest.mark.parametrize("dra_mode", [True, False])
async def test_the_standby_pool_is_not_topped_up_with_devices_claims_hold(dra_mode: bool) -> None:
    """In DRA mode no ledger records the devices pods hold: the claims do. A device a claim
    holds is not free, so it does not join the standby pool."""
    state = cluster(b.gpu_node(NODE, b.devices(NODE, 4, tier=Tier.HA)))
    claims = ClaimCache()
    claims.apply("ADDED", borrowers_claim("borrowed", 3))
    changes: list[TagChange] = []

    class Recorder:
        async def set_tags(self, batch: Iterable[TagChange]) -> None:
            changes.extend(batch)

    controller = LeaseController(
        view=FixedView(state, claims=claims),
        leases=granted_leases(),
        world=Recorder(),  # type: ignore[arg-type]
        metrics=LeasingMetrics(CollectorRegistry()),
        standby_targets={("H20", Tier.HA): 4},
        dra_mode=dra_mode,
    )
    assert await controller.top_up_standby() == (3 if dra_mode else 4)
    joined = {c.uuid for c in changes if c.standby}
    assert (uuid(NODE, 3) in joined) is not dra_mode


async def test_without_dra_mode_claims_are_not_watched_and_gated_pods_left_alone() -> None:
    store = MemoryStore([b.gpu_node(NODE, b.devices(NODE, 4, tier=Tier.HA)), b.namespace(NS)])
    store.put(claim_obj("job-1-gpu"))
    store.put(owner_pod("job-1", "job-1-gpu"))
    store.put(lease_obj("Reclaiming"))
    world = World()
    registry = CollectorRegistry()
    async with controllers(
        store=store,
        world=world,  # type: ignore[arg-type]
        kube=None,  # type: ignore[arg-type]
        settings=ExtenderSettings(),
        enabled=Enabled(leasing=True),
        registry=registry,
    ):
        await store.settle()
        await reconciled(registry)
        assert store.watchers("ResourceClaim") == 0
        assert world.pins == []
        assert world.ungated == []


def test_observe_reads_holders_and_the_owners_devices_from_the_claims() -> None:
    """In DRA mode: the owner's pod holds what its claim is allocated, a borrower's claim makes
    the borrower (low priority) the holder of its device; a claim reserved for a pod whose UID
    the cache does not know (a pod replaced under the same name) makes no holder."""
    from extender.cluster.state import ClusterState
    from extender.cluster.watching import PodCache
    from extender.leasing.observation import observe

    cluster = ClusterState()
    cluster.apply_gpu_node("ADDED", b.gpu_node(NODE, b.devices(NODE, 4, tier=Tier.HA)))
    pods = PodCache(claims=True)
    owner = owner_pod("job-0", "job-0-gpu", gate=False)
    owner["spec"]["nodeName"] = NODE
    borrower = b.pod("borrower", 0, namespace=NS, uid="b-uid", priority=Priority.LOW)
    borrower["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "borrowed"}]
    stale = b.pod("stale", 0, namespace=NS, uid="new-uid")
    stale["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "old"}]
    for pod in (owner, borrower, stale):
        pods.apply("ADDED", pod)
    owned = claim_obj("job-0-gpu", count=2)
    owned["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": deviceattributes.DRIVER,
                        "pool": NODE,
                        "device": f"gpu-{i}",
                    }
                    for i in (1, 0)
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "job-0", "uid": owner["metadata"]["uid"]}],
    }
    old = borrowers_claim("old", 2)
    old["status"]["reservedFor"] = [{"resource": "pods", "name": "stale", "uid": "old-uid"}]
    claims = [owned, borrowers_claim("borrowed", 3), old]
    holdings = pinning.claim_holdings(claims, b.devices(NODE, 4, tier=Tier.HA))
    owner_pods, view = observe(cluster, pods, lease(), holdings, granted={NS})

    (mine,) = owner_pods
    assert (mine.name, mine.node, mine.devices) == ("job-0", NODE, (uuid(NODE, 1), uuid(NODE, 0)))
    held = {u: (h.name, h.priority) for u, h in view.holders.items()}
    assert held == {
        uuid(NODE, 1): ("job-0", Priority.HIGH),
        uuid(NODE, 0): ("job-0", Priority.HIGH),
        uuid(NODE, 3): ("borrower", Priority.LOW),
    }
    # In a namespace not granted online jobs, what a pod writes makes it no high-priority
    # holder: it is a borrower like any other.
    _, ungranted = observe(cluster, pods, lease(), holdings)
    assert {h.priority for h in ungranted.holders.values()} == {Priority.LOW}


# --- the reclaiming marks ---


# job-1 and job-2's devices tagged with their owner, as lent devices are.
TAGGED = {
    u: dataclasses.replace(BY_UUID[u], cls=BY_UUID[u].cls._replace(owner=KEY, replica=g.replica))
    for g in GROUPS
    for u in g.devices
}
LENT = BY_UUID | TAGGED
EVERYTHING = frozenset(GROUPS[0].devices + GROUPS[1].devices)


def on_nodes(uuids: Iterable[GpuUuid], owner: str | None = KEY) -> dict[Any, str | None]:
    """What the GpuNodes say is marked: each device on its node, with its owner tag."""
    return {(LENT[u].node, u): owner for u in uuids}


def marks_of(found: pinning.MarkReclaiming | None) -> dict[GpuUuid, bool]:
    assert found is not None
    return {u: on for m in found.marks.values() for u, on in m.items()}


def test_the_devices_a_reclaim_takes_back() -> None:
    assert pinning.reclaimed_devices(lease()) == EVERYTHING
    assert pinning.reclaimed_devices(lease(finalizing=True)) == frozenset()
    assert pinning.reclaimed_devices(lease(phase="Steady")) == frozenset()


def test_the_marks_follow_the_reclaim_from_what_the_gpu_nodes_say() -> None:
    reclaiming, steady = lease(), lease(phase="Steady")
    # Nothing marked yet: every device taken back, per node.
    found = pinning.reclaiming_marks(reclaiming, LENT, {}, [])
    assert found is not None
    assert found.marks == {
        NODE: {u: True for u in GROUPS[0].devices},
        OTHER: {u: True for u in GROUPS[1].devices},
    }
    # Marked already (this process wrote them, or another before a restart): nothing to write.
    assert pinning.reclaiming_marks(reclaiming, LENT, on_nodes(EVERYTHING), []) is None
    # Half marked (a write cut short): the rest.
    half = on_nodes(GROUPS[0].devices)
    assert marks_of(pinning.reclaiming_marks(reclaiming, LENT, half, [])) == dict.fromkeys(
        GROUPS[1].devices, True
    )
    # Steady again: every mark of the owner's devices is cleared, and then nothing to write.
    done = pinning.reclaiming_marks(steady, LENT, on_nodes(EVERYTHING), [])
    assert marks_of(done) == dict.fromkeys(EVERYTHING, False)
    assert pinning.reclaiming_marks(steady, LENT, {}, []) is None


def test_a_device_without_an_owner_tag_is_marked_once_tagged() -> None:
    untagged = BY_UUID | {u: TAGGED[u] for u in GROUPS[0].devices}
    found = pinning.reclaiming_marks(lease(), untagged, {}, [])
    assert marks_of(found) == dict.fromkeys(GROUPS[0].devices, True)
    # A device no GpuNode knows is left out too.
    partial = {u: d for u, d in LENT.items() if u != GROUPS[1].devices[0]}
    some = marks_of(pinning.reclaiming_marks(lease(), partial, {}, []))
    assert GROUPS[1].devices[0] not in some
    assert GROUPS[1].devices[1] in some


def test_marks_of_other_owners_stay_unless_no_lease_names_them() -> None:
    other_key = job_key(NS, "other")
    other = b.devices(NODE, 1, start=3, tier=Tier.HA, owner=other_key, replica="other-0")[0]
    other = dataclasses.replace(other, uuid=GpuUuid("GPU-other"))
    devices = LENT | {other.uuid: other}
    marked = {(NODE, other.uuid): other_key}
    steady = lease(phase="Steady")
    theirs = dataclasses.replace(steady, spec=dataclasses.replace(steady.spec, owner=other_key))
    # Another lease's reclaim marks its own devices: this lease leaves them alone ...
    assert pinning.reclaiming_marks(steady, devices, marked, [theirs]) is None
    # ... unless no lease names that owner any more (deleted past its finalizer).
    gone = pinning.reclaiming_marks(steady, devices, marked, [])
    assert marks_of(gone) == {other.uuid: False}


def test_two_leases_of_one_owner_name_in_two_namespaces_keep_each_others_marks() -> None:
    """A Steady lease of the same job name in another namespace is another owner: it must not
    clear what a reclaiming one marked (they would undo each other every step)."""
    reclaiming = lease()
    steady = lease(phase="Steady")
    elsewhere = dataclasses.replace(
        steady,
        namespace="elsewhere",
        spec=dataclasses.replace(steady.spec, owner=job_key("elsewhere", "job")),
    )
    marked = on_nodes(EVERYTHING)
    assert pinning.reclaiming_marks(elsewhere, LENT, marked, [reclaiming]) is None
    assert pinning.reclaiming_marks(reclaiming, LENT, marked, [elsewhere]) is None


def test_a_mark_is_cleared_on_the_node_that_carries_it() -> None:
    """One UUID on two GpuNodes (a GPU moved, its old node's object not yet gone): the mark is
    cleared where it is, not where the view last saw the device."""
    u = GROUPS[0].devices[0]
    found = pinning.reclaiming_marks(lease(phase="Steady"), LENT, {(OTHER, u): KEY}, [])
    assert found is not None
    assert found.marks == {OTHER: {u: False}}
