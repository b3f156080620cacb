"""Right of return in DRA mode: test_leasing.py's per-replica scenario with ResourceClaims, the
unmodified kube-scheduler (``tidelease-plain``, no extender) and the leasing controller of the
cluster's controllers process in DRA mode (settings ``dra: true``).

The owner ``recsys`` is a StatefulSet of 3 replicas whose pods ask for 4 ``tidelease-ha``
devices through a ResourceClaimTemplate and carry the scheduling gate ``tidelease.io/reclaim``.
Its GpuLease lends replicas 1 and 2: the controller reads each replica's devices from its
claim, tags them (the SliceMirrors republish them as lent), and scales down; borrowers'
``tidelease-borrow`` claims get exactly the lent devices. The lease asks for all 3 again: the
borrowers get their notice and are evicted, and each returning replica's claim is pinned to
the devices that replica lent before its gate is lifted. Every cycle, each replica is back on
exactly the UUIDs it lent, in its group's order (compared per replica, per device). With a
device of recsys-1's group made unhealthy, recsys-1 alone is pinned to standby devices of the
same type and tier, and its own group stays lent: test_leasing.py's outcomes, device for device.
Borrowers of a Deployment, replaced as soon as they are evicted, do not take the reclaimed
devices back (the controller marks them ``reclaiming``, which ``tidelease-borrow`` excludes):
the reclaim ends.

As in test_dra.py (whose helpers these tests use): kwok nodes whose GpuNodes a SliceMirror per
node (in this process) publishes as ResourceSlices, common.deviceattributes's DeviceClasses.
"""

from __future__ import annotations

from typing import Any

import pytest

from common import builders, contract, deviceattributes
from common.model import Device, Priority, Tier
from extender.leasing import claimpinning as pinning
from tests.e2e.harness import BORROWER, Cluster, NodeGroup, workload
from tests.e2e.kube import wait_for
from tests.e2e.test_dra import (  # noqa: F401  (fixtures)
    claim_of,
    claim_pod,
    create_claim_pod,
    create_claim_template,
    device_classes,
    mirrored,
    plain_scheduler,
    wait_nodes_ready,
    wait_published,
)

pytestmark = pytest.mark.cluster

b = builders
OWNER = "recsys"
REPLICA_GPUS = 4
REPLICAS = 3
CYCLES = 3
TIMEOUT_S = 90


def ha(count: int, *, standby: bool = False, gpu_type: str = "H20", tier: Tier = Tier.HA) -> Any:
    def layout(node: str) -> list[Device]:
        return b.devices(node, count, tier=tier, standby=standby, gpu_type=gpu_type)

    return layout


class DraJob:
    """The owner's StatefulSet (gated pods with a claim each) and GpuLease in one namespace."""

    def __init__(self, cluster: Cluster, group: NodeGroup, namespace: str, scheduler: str) -> None:
        self.cluster, self.group, self.ns, self.scheduler = cluster, group, namespace, scheduler
        create_claim_template(
            cluster,
            builders.claim_template(
                namespace, OWNER, deviceattributes.CLASS_HA, count=REPLICA_GPUS
            ),
        )
        pod = claim_pod(group, scheduler, OWNER, priority=Priority.HIGH, owner=OWNER, gated=True)
        cluster.kube.create(workload("StatefulSet", OWNER, namespace, pod, replicas=REPLICAS))
        cluster.kube.create(
            b.gpu_lease(
                OWNER,
                namespace,
                gpus_per_replica=REPLICA_GPUS,
                desired_gpus=REPLICAS * REPLICA_GPUS,
                grace_s=30,
            )
        )

    def lease(self) -> dict[str, Any]:
        lease = self.cluster.kube.get(contract.KIND_GPU_LEASE, OWNER, self.ns)
        assert lease is not None
        return lease

    def set_desired(self, gpus: int) -> None:
        self.cluster.kube.patch(
            contract.KIND_GPU_LEASE, OWNER, {"spec": {"desiredGPUs": gpus}}, self.ns
        )

    def held(self, pod: str) -> list[str] | None:
        """The UUIDs of the devices the pod's claim is allocated, in the allocation's order,
        once the pod is bound and reserves it; None before (or for a pod going away)."""
        obj = self.cluster.kube.get("Pod", pod, self.ns)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        node = obj["spec"].get("nodeName")
        claim = claim_of(self.cluster, self.ns, pod)
        status = (claim or {}).get("status") or {}
        reserved = [r.get("uid") for r in status.get("reservedFor") or []]
        if not node or obj["metadata"]["uid"] not in reserved or "allocation" not in status:
            return None
        out = []
        for result in status["allocation"]["devices"]["results"]:
            assert (result["driver"], result["pool"]) == (deviceattributes.DRIVER, node), result
            index = pinning.device_index(result["device"])
            assert index is not None, result
            out.append(b.device_uuid(node, index))
        return out

    def placed(self, pods: list[str]) -> dict[str, list[str]]:
        def all_held() -> dict[str, list[str]] | None:
            found = {p: self.held(p) for p in pods}
            return (
                {p: h for p, h in found.items() if h is not None}
                if all(h is not None for h in found.values())
                else None
            )

        return wait_for(
            all_held,
            what=f"pods {pods} bound with their claims",
            timeout=TIMEOUT_S,
            describe=self.describe,
        )

    def describe(self) -> str:
        pods = self.cluster.kube.list("Pod", self.ns)
        lines = [f"lease status: {self.lease().get('status')}"]
        for p in pods:
            name = p["metadata"]["name"]
            claim = claim_of(self.cluster, self.ns, name) or {}
            lines.append(
                f"pod {name}: node={p['spec'].get('nodeName')!r} "
                f"gates={p['spec'].get('schedulingGates')} claim={claim.get('status')}"
            )
        lines.append(self.cluster.log_tail("controllers.log", 20))
        return "\n".join(lines)

    def wait_steady(self, what: str, check: Any) -> dict[str, Any]:
        def steady() -> dict[str, Any] | None:
            status = self.lease().get("status") or {}
            return status if status.get("phase") == "Steady" and check(status) else None

        return wait_for(steady, what=what, timeout=TIMEOUT_S, describe=self.describe)

    def lend_two(self, what: str = "") -> dict[str, list[str]]:
        """Scale down to one replica: the two lent groups, by replica, once lent and their
        pods gone."""
        names = [f"{OWNER}-{i}" for i in range(REPLICAS)]
        self.set_desired(REPLICA_GPUS)
        status = self.wait_steady(
            f"{what}8 devices lent",
            lambda s: sum(len(g["devices"]) for g in s.get("lent") or []) == 8,
        )
        self.gone(names[1:])
        return {g["replica"]: g["devices"] for g in status["lent"]}

    def gone(self, pods: list[str]) -> None:
        wait_for(
            lambda: all(self.cluster.kube.get("Pod", p, self.ns) is None for p in pods),
            what=f"pods {pods} gone",
            timeout=TIMEOUT_S,
            describe=self.describe,
        )


@pytest.fixture
def dra_job(
    cluster: Cluster,
    group: NodeGroup,
    namespace: str,
    plain_scheduler: str,  # noqa: F811
    device_classes: list[str],  # noqa: F811
) -> Any:
    """3 x 4 H20 HA GPUs on a 4-GPU and an 8-GPU node (no free HA device beside the job's),
    and standby pools of several types and tiers: s1 of the job's (H20, HA), s2 of another type
    (A100, HA), s3 of the job's type at a lower tier (H20, MA), 4 GPUs each; a stand-in must
    come from s1. Their slices mirrored while the test runs."""
    cluster.ensure_priority_class(BORROWER, 10)
    group.add_node("n1", ha(4))
    group.add_node("n2", ha(8))
    group.add_node("s1", ha(4, standby=True))
    group.add_node("s2", ha(4, standby=True, gpu_type="A100"), gpu_type="A100")
    group.add_node("s3", ha(4, standby=True, tier=Tier.MA))
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        for node, count in zip(group.nodes, (4, 8, 4, 4, 4), strict=True):
            wait_published(cluster, node, {f"gpu-{i}" for i in range(count)})
        yield DraJob(cluster, group, namespace, plain_scheduler)


def test_each_replica_gets_back_exactly_its_own_devices_every_cycle_in_dra_mode(
    dra_job: DraJob,
) -> None:
    job = dra_job
    names = [f"{OWNER}-{i}" for i in range(REPLICAS)]
    # The controller lets the first pods go at once (they return from no loan).
    first = job.placed(names)
    every = [u for devices in first.values() for u in devices]
    assert len(every) == len(set(every)) == REPLICAS * REPLICA_GPUS
    for cycle in range(CYCLES):
        # The truth before each lend: the devices each replica's claim holds.
        before = job.placed(names)
        groups = job.lend_two(f"cycle {cycle}: ")
        # each group is what its replica's claim held, device by device, every cycle
        assert groups == {r: before[r] for r in names[1:]}, (cycle, groups)

        borrowers = []
        for i in range(2):
            name = f"borrow-{cycle}-{i}"
            _borrower(job, name)
            borrowers.append(name)
        borrowed = job.placed(borrowers)
        lent = {u for devices in groups.values() for u in devices}
        assert {u for devices in borrowed.values() for u in devices} == lent, borrowed

        job.set_desired(REPLICAS * REPLICA_GPUS)
        done = cycle + 1
        status = job.wait_steady(
            f"cycle {cycle}: the reclaim to finish", lambda s, n=done: s.get("reclaims") == n
        )
        placed = job.placed(names)
        assert placed == before, f"cycle {cycle}: replicas back on {placed}, held {before}"
        assert (status["returned"], status["backfilled"]) == (8 * (cycle + 1), 0)
        assert not status.get("lent"), status
        job.gone(borrowers)
        # The borrowers were told first, and each returning replica's claim pinned.
        noticed = {
            e["involvedObject"]["name"]
            for e in job.cluster.kube.list("Event", job.ns)
            if e.get("reason") == "ReclaimNotice"
        }
        assert noticed >= set(borrowers), noticed
        # The reclaim pinned each returning replica's claim, and said so on the pod.
        pinned = {
            e["involvedObject"]["name"]
            for e in job.cluster.kube.list("Event", job.ns)
            if e.get("reason") == "ReclaimPinned"
        }
        assert pinned >= set(groups), pinned
    # No device is tagged any more: the slices offer them to anyone's claims again.
    for node in job.group.nodes[:2]:
        tagged = [d for d in job.cluster.gpu_node_uuids(node).values() if d.get("owner")]
        assert not tagged, f"{node} still has devices tagged after the reclaims: {tagged}"


def _borrower(job: DraJob, name: str) -> None:
    """A low-priority pod of the plain scheduler on any of the group's nodes, with a claim for
    4 devices of ``tidelease-borrow``."""
    create_claim_pod(
        job.cluster, job.group, job.scheduler, job.ns, name, None, deviceattributes.CLASS_BORROW,
        count=REPLICA_GPUS,
    )  # fmt: skip


def test_only_the_replica_whose_device_failed_falls_back_to_standby_in_dra_mode(
    dra_job: DraJob,
) -> None:
    job = dra_job
    names = [f"{OWNER}-{i}" for i in range(REPLICAS)]
    before = job.placed(names)
    groups = job.lend_two()
    assert groups == {r: before[r] for r in names[1:]}, groups
    borrowers = [f"borrow-{i}" for i in range(2)]
    for name in borrowers:
        _borrower(job, name)
    job.placed(borrowers)

    broken = groups[f"{OWNER}-1"][0]
    node = next(n for n in job.group.nodes if broken in job.cluster.gpu_node_uuids(n))
    break_device(job.cluster, node, broken)
    job.set_desired(REPLICAS * REPLICA_GPUS)
    status = job.wait_steady("the reclaim to finish", lambda s: s.get("reclaims") == 1)
    placed = job.placed(names)
    assert placed[f"{OWNER}-2"] == before[f"{OWNER}-2"]  # untouched by the failure
    assert placed[f"{OWNER}-0"] == before[f"{OWNER}-0"]
    like = job.cluster.gpu_node_uuids(node)[broken]
    standby = job.cluster.gpu_node_uuids(job.group.nodes[2])
    assert set(placed[f"{OWNER}-1"]) <= set(standby), placed[f"{OWNER}-1"]
    for u in placed[f"{OWNER}-1"]:
        assert (standby[u]["type"], standby[u]["tier"]) == (like["type"], like["tier"])
    assert (status["returned"], status["backfilled"]) == (4, 4)
    # recsys-1's own devices stay lent, whole (they come back once repaired), named after a
    # replica that is down now that recsys-1 runs on stand-ins; the stand-ins are on loan.
    assert [(g["replica"], g["devices"]) for g in status["lent"]] == [
        (f"{OWNER}-3", groups[f"{OWNER}-1"])
    ]
    for u in placed[f"{OWNER}-1"]:  # tagged with the job of the lease's namespace
        on_loan = (standby[u].get("owner"), standby[u].get("standby"))
        assert on_loan == (f"{job.ns}/{OWNER}", True), standby[u]


def break_device(cluster: Cluster, node: str, uuid: str) -> None:
    """Mark one device Unhealthy in its GpuNode's status, as its node agent would (the mirror
    then withdraws it from the node's slice)."""
    gpu_node = cluster.kube.get(contract.KIND_GPU_NODE, node)
    assert gpu_node is not None
    for d in gpu_node["status"]["devices"]:
        if d["uuid"] == uuid:
            d["health"] = "Unhealthy"
    cluster.kube.patch(
        contract.KIND_GPU_NODE, node, {"status": gpu_node["status"]}, subresource="status"
    )


def test_a_reclaim_ends_though_every_evicted_borrower_is_replaced_in_dra_mode(
    dra_job: DraJob,
) -> None:
    """Borrowers of a Deployment: the ReplicaSet replaces each pod the reclaim evicts at once,
    and its replacements' claims (tidelease-borrow) may take lent devices. The reclaim still
    ends with each replica on its own devices."""
    job = dra_job
    names = [f"{OWNER}-{i}" for i in range(REPLICAS)]
    before = job.placed(names)
    groups = job.lend_two()
    assert groups == {r: before[r] for r in names[1:]}, groups
    create_claim_template(
        job.cluster,
        builders.claim_template(
            job.ns, "finetune", deviceattributes.CLASS_BORROW, count=REPLICA_GPUS
        ),
    )
    pod = claim_pod(job.group, job.scheduler, "finetune")
    job.cluster.kube.create(workload("Deployment", "finetune", job.ns, pod, replicas=2))

    def borrowers() -> list[str]:
        return [
            p["metadata"]["name"]
            for p in job.cluster.kube.list("Pod", job.ns)
            if p["metadata"]["name"].startswith("finetune-")
        ]

    first = wait_for(
        lambda: (lambda b: b if len(b) == 2 and all(job.held(n) for n in b) else None)(borrowers()),
        what="two borrowers placed",
        timeout=TIMEOUT_S,
        describe=job.describe,
    )
    job.set_desired(REPLICAS * REPLICA_GPUS)
    status = job.wait_steady("the reclaim to finish", lambda s: s.get("reclaims") == 1)
    placed = job.placed(names)
    assert {r: placed[r] for r in groups} == groups
    assert (status["returned"], status["backfilled"]) == (8, 0)
    lent = {u for devices in groups.values() for u in devices}
    for name in borrowers():
        held = job.held(name) or []
        assert not set(held) & lent, (name, held)
    print(f"first borrowers {first}, now {borrowers()}")
