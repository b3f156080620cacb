"""Right-of-return leasing on the local cluster: the real StatefulSet controller scales the owner,
the real kube-scheduler places every pod through the extender, and the leasing controller runs in
the extender process (as the chart deploys it).

An online job ``recsys`` (a StatefulSet of 4-GPU replicas) holds 16 GPUs; its GpuLease lends 8,
borrowers run on them, then the lease asks for 16 again: the borrowers get a notice, are evicted
after the grace period, and the owner's new replicas land on the very devices it lent. With one
lent device made unhealthy, the replica that held it gets standby devices of the same type and
tier instead.

Right of return per replica: a 3 x 4 GPU StatefulSet lends replicas 1 and 2 and takes them back
twenty times, borrowers on exactly the lent devices each time; every time each replica is back
on exactly the UUIDs it lent (compared per ordinal). With a device of recsys-1's group made
unhealthy, recsys-1 alone falls back to standby devices.

The local cluster gives borrowers GRACE_S seconds of notice (hack/cluster-up.sh sets the
extender's leasing_test_grace_s); the leases say 30 s, the CRD's minimum.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from common import builders, contract
from common.model import Priority, Tier
from tests.e2e.harness import BORROWER, ONLINE, Cluster, NodeGroup, devices_of, workload
from tests.e2e.kube import get_text, wait_for

pytestmark = pytest.mark.cluster

GRACE_S = 2  # TL_CLUSTER_LEASING_GRACE_S's default
REPLICA_GPUS = 4


def lent_devices(lease: dict[str, Any]) -> set[str]:
    return {
        u for g in (lease.get("status") or {}).get("lent") or [] for u in g.get("devices") or []
    }


class Job:
    """The owner's StatefulSet and GpuLease in one namespace, on one node group."""

    def __init__(
        self, cluster: Cluster, group: NodeGroup, namespace: str, *, replicas: int = 4
    ) -> None:
        self.cluster, self.group, self.ns = cluster, group, namespace
        self.replicas = replicas
        kube = cluster.kube
        template = group.pod(
            namespace,
            "template",
            REPLICA_GPUS,
            priority=Priority.HIGH,
            owner="recsys",
            tier=Tier.HA,
            priority_class=ONLINE,
        )
        kube.create(workload("StatefulSet", "recsys", namespace, template, replicas=replicas))
        kube.create(
            builders.gpu_lease(
                "recsys",
                namespace,
                gpus_per_replica=REPLICA_GPUS,
                desired_gpus=replicas * REPLICA_GPUS,
                grace_s=30,
            )
        )

    def lease(self) -> dict[str, Any]:
        lease = self.cluster.kube.get(contract.KIND_GPU_LEASE, "recsys", self.ns)
        assert lease is not None
        return lease

    def set_desired(self, gpus: int) -> None:
        self.cluster.kube.patch(
            contract.KIND_GPU_LEASE, "recsys", {"spec": {"desiredGPUs": gpus}}, self.ns
        )

    def placed(self, prefix: str) -> dict[str, list[str]]:
        """Bound, not terminating pods named ``prefix*``, with their devices."""
        return {
            p["metadata"]["name"]: devices_of(p)
            for p in self.cluster.kube.list("Pod", self.ns)
            if p["metadata"]["name"].startswith(prefix)
            and p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and devices_of(p)
        }

    def describe(self) -> str:
        return f"lease status: {self.lease().get('status')}\npods: {self.placed('')}"

    def wait_placed(
        self, prefix: str, names: set[str], timeout: float = 60
    ) -> dict[str, list[str]]:
        def placed() -> dict[str, list[str]] | None:
            now = self.placed(prefix)
            return now if set(now) == names else None

        return wait_for(
            placed, what=f"pods {sorted(names)} placed", timeout=timeout, describe=self.describe
        )

    def wait_steady(self, what: str, check: Any, timeout: float = 60) -> dict[str, Any]:
        def steady() -> dict[str, Any] | None:
            status = self.lease().get("status") or {}
            return status if status.get("phase") == "Steady" and check(status) else None

        return wait_for(steady, what=what, timeout=timeout, describe=self.describe)

    def lend_half(self) -> set[str]:
        """16 GPUs placed, then 8 lent: the devices lent (tagged for the owner)."""
        self.wait_placed("recsys-", {f"recsys-{i}" for i in range(4)})
        self.set_desired(8)
        status = self.wait_steady("8 devices lent", lambda s: len(lent_devices({"status": s})) == 8)
        self.wait_placed("recsys-", {"recsys-0", "recsys-1"})
        return lent_devices({"status": status})

    def borrow(self, lent: set[str], prefix: str = "finetune-") -> dict[str, list[str]]:
        for i in range(2):
            self.group.create_pod(
                self.ns,
                f"{prefix}{i}",
                REPLICA_GPUS,
                priority=Priority.LOW,
                priority_class=BORROWER,
            )
        placed = self.wait_placed(prefix, {f"{prefix}0", f"{prefix}1"})
        assert {u for d in placed.values() for u in d} <= lent, placed
        return placed

    def break_device(self, node: str, uuid: str) -> None:
        """Mark one device Unhealthy in its GpuNode's status, as its node agent would."""
        gpu_node = self.cluster.kube.get(contract.KIND_GPU_NODE, node)
        assert gpu_node is not None
        for d in gpu_node["status"]["devices"]:
            if d["uuid"] == uuid:
                d["health"] = "Unhealthy"
        self.cluster.kube.patch(
            contract.KIND_GPU_NODE, node, {"status": gpu_node["status"]}, subresource="status"
        )

    def replicas_placed(self, count: int) -> dict[str, list[str]]:
        return self.wait_placed("recsys-", {f"recsys-{i}" for i in range(count)})

    def lend_groups(self, keep: int) -> dict[str, list[str]]:
        """Scale down to ``keep`` replicas: the lent groups, by replica, once lent."""
        lent = (self.replicas - keep) * REPLICA_GPUS
        self.set_desired(keep * REPLICA_GPUS)
        status = self.wait_steady(
            f"{lent} devices lent", lambda s: len(lent_devices({"status": s})) == lent
        )
        self.replicas_placed(keep)
        return {g["replica"]: sorted(g["devices"]) for g in status["lent"]}

    def reclaim(self, reclaims: int) -> dict[str, Any]:
        self.set_desired(self.replicas * REPLICA_GPUS)
        return self.wait_steady(
            f"reclaim {reclaims} to finish", lambda s: s.get("reclaims") == reclaims
        )


@pytest.fixture
def job(cluster: Cluster, group: NodeGroup, namespace: str) -> Job:
    cluster.ensure_priority_class(BORROWER, 10)
    for suffix in ("n1", "n2"):
        group.add_node(suffix, lambda name: builders.devices(name, 8))
    group.add_node("s1", lambda name: builders.devices(name, 4, standby=True))
    group.wait_ready()
    return Job(cluster, group, namespace)


def test_lend_borrow_reclaim_gives_the_owner_the_same_devices(job: Job) -> None:
    lent = job.lend_half()
    job.borrow(lent)

    start = time.monotonic()
    job.set_desired(16)
    status = job.wait_steady("the reclaim to finish", lambda s: s.get("reclaims"))
    took = time.monotonic() - start

    assert took <= GRACE_S + 10, f"reclaim took {took:.1f} s"
    placed = job.wait_placed("recsys-", {f"recsys-{i}" for i in range(4)})
    assert set(placed["recsys-2"]) | set(placed["recsys-3"]) == lent  # the same UUIDs
    assert (status["returned"], status["backfilled"]) == (8, 0)
    assert not job.placed("finetune-"), "the borrowers were not evicted"
    # The borrowers were told first: the notice annotation and an Event.
    events = job.cluster.kube.list("Event", job.ns)
    noticed = {
        e["involvedObject"]["name"]
        for e in events
        if e["involvedObject"]["name"].startswith("finetune-")
    }
    assert noticed == {"finetune-0", "finetune-1"}, [e.get("reason") for e in events]
    every = [u for d in placed.values() for u in d]
    assert len(every) == len(set(every))
    for node in job.group.nodes:
        tagged = [d for d in job.cluster.gpu_node_uuids(node).values() if d.get("owner")]
        assert not tagged, f"{node} still has devices tagged after the reclaim: {tagged}"
    print(f"reclaim took {took:.2f} s (grace {GRACE_S} s)")


def test_a_reclaim_ends_though_every_evicted_borrower_is_replaced(job: Job) -> None:
    """Borrowers of a Deployment: the ReplicaSet replaces each pod the reclaim evicts at once.
    The replacements are kept off the devices being taken back (they wait), so the owner's
    replicas return to the very devices they lent and the reclaim ends; before, each
    replacement landed on them again, got notice and was evicted, round after round."""
    lent = job.lend_half()
    template = job.group.pod(
        job.ns, "template", REPLICA_GPUS, priority=Priority.LOW, priority_class=BORROWER
    )
    job.cluster.kube.create(workload("Deployment", "finetune", job.ns, template, replicas=2))

    def two_placed() -> dict[str, list[str]] | None:
        placed = job.placed("finetune-")
        return placed if len(placed) == 2 else None

    first = wait_for(two_placed, what="two borrowers placed", describe=job.describe)
    assert {u for d in first.values() for u in d} == lent, first

    start = time.monotonic()
    job.set_desired(16)
    status = job.wait_steady("the reclaim to finish", lambda s: s.get("reclaims"), timeout=60)
    took = time.monotonic() - start

    placed = job.wait_placed("recsys-", {f"recsys-{i}" for i in range(4)})
    assert set(placed["recsys-2"]) | set(placed["recsys-3"]) == lent  # the same UUIDs
    assert (status["returned"], status["backfilled"]) == (8, 0)
    # The replacements wait (the rest is held by the owner or kept as standby), none on a
    # returned device; only the two first borrowers were ever given notice.
    assert not job.placed("finetune-"), job.describe()
    replacements = [
        p
        for p in job.cluster.kube.list("Pod", job.ns)
        if p["metadata"]["name"].startswith("finetune-")
    ]
    assert len(replacements) == 2
    noticed = {
        e["involvedObject"]["name"]
        for e in job.cluster.kube.list("Event", job.ns)
        if e.get("reason") == "ReclaimNotice"
    }
    assert noticed == set(first), noticed
    print(f"reclaim with replaced borrowers took {took:.2f} s (grace {GRACE_S} s)")


def test_a_lent_device_that_failed_is_backfilled_from_standby(job: Job) -> None:
    lent = job.lend_half()
    s1 = job.group.nodes[2]
    broken = sorted(lent)[0]  # on whichever node kube-scheduler put the lent replicas
    node = next(n for n in job.group.nodes if broken in job.cluster.gpu_node_uuids(n))
    devices = job.cluster.gpu_node_uuids(node)
    job.break_device(node, broken)

    job.set_desired(16)
    status = job.wait_steady("the reclaim to finish", lambda s: s.get("reclaims"))
    placed = job.wait_placed("recsys-", {f"recsys-{i}" for i in range(4)})
    standby = job.cluster.gpu_node_uuids(s1)
    new = set(placed["recsys-2"]) | set(placed["recsys-3"])
    assert broken not in new
    assert len(new & lent) == 4  # the replica whose lent devices are all healthy got them back
    backfill = new & set(standby)
    assert len(backfill) == 4  # the other went to the standby node, same type and tier
    for u in backfill:
        assert (standby[u]["type"], standby[u]["tier"]) == (
            devices[broken]["type"],
            devices[broken]["tier"],
        )
    assert (status["returned"], status["backfilled"]) == (4, 4)


@pytest.fixture
def small_job(cluster: Cluster, group: NodeGroup, namespace: str) -> Job:
    """3 x 4 GPUs on a 4-GPU and an 8-GPU node (no free device beside the job's), and a
    4-GPU standby node."""
    cluster.ensure_priority_class(BORROWER, 10)
    group.add_node("n1", lambda name: builders.devices(name, 4))
    group.add_node("n2", lambda name: builders.devices(name, 8))
    group.add_node("s1", lambda name: builders.devices(name, 4, standby=True))
    group.wait_ready()
    return Job(cluster, group, namespace, replicas=3)


CYCLES = 20


def test_each_replica_gets_back_exactly_its_own_devices_every_cycle(small_job: Job) -> None:
    job = small_job
    first = job.replicas_placed(3)
    for cycle in range(CYCLES):
        groups = job.lend_groups(keep=1)
        assert set(groups) == {"recsys-1", "recsys-2"}, groups
        if cycle == 0:  # each group is what its replica held
            assert groups == {r: sorted(first[r]) for r in groups}
        job.borrow({u for devs in groups.values() for u in devs}, prefix=f"borrow-{cycle}-")
        status = job.reclaim(reclaims=cycle + 1)
        placed = job.replicas_placed(3)
        got = {r: sorted(placed[r]) for r in groups}
        assert got == groups, f"cycle {cycle}: replicas back on {got}, lent {groups}"
        assert sorted(placed["recsys-0"]) == sorted(first["recsys-0"])
        assert (status["returned"], status["backfilled"]) == (8 * (cycle + 1), 0)
        assert not job.placed(f"borrow-{cycle}-"), "the borrowers were not evicted"


def test_only_the_replica_whose_device_failed_falls_back_to_standby(small_job: Job) -> None:
    job = small_job
    job.replicas_placed(3)
    groups = job.lend_groups(keep=1)
    job.borrow({u for devs in groups.values() for u in devs})
    broken = groups["recsys-1"][0]
    node = next(n for n in job.group.nodes if broken in job.cluster.gpu_node_uuids(n))
    job.break_device(node, broken)
    status = job.reclaim(reclaims=1)
    placed = job.replicas_placed(3)
    assert sorted(placed["recsys-2"]) == groups["recsys-2"]  # untouched by the failure
    standby = job.cluster.gpu_node_uuids(job.group.nodes[2])
    assert set(placed["recsys-1"]) <= set(standby), placed["recsys-1"]
    assert (status["returned"], status["backfilled"]) == (4, 4)
    # recsys-1's own devices stay lent, whole (they come back once repaired), named after a
    # replica that is down now that recsys-1 runs on stand-ins.
    assert [(g["replica"], sorted(g["devices"])) for g in status["lent"]] == [
        ("recsys-3", groups["recsys-1"])
    ]


def test_the_controllers_process_serves_every_controllers_metrics(cluster: Cluster) -> None:
    """`tidelease controllers`: one /metrics for the leasing, prewarm and hot-restart
    controllers; the extender's has none of them (it serves the verbs only)."""
    url = f"{cluster.controllers_url}/metrics"
    text = get_text(url, token=cluster.token)
    for family in (
        "tidelease_leasing_reclaims_total",
        "tidelease_prewarm_directives_written_total",
    ):
        assert f"# HELP {family} " in text, family
    extender = get_text(f"{cluster.extender_probe_url}/metrics", token=cluster.token)
    assert "# HELP tidelease_extender_requests_total " in extender
    assert "tidelease_leasing_" not in extender
    assert "tidelease_controller_queue_depth" not in extender
    # Each controller of the process runs on the shared reconcile loop, under its own name
    # (once it leads: the loop is built for the term).
    names = ("leasing", "prewarm", "hot-restart-operator")

    def every_loop() -> str | None:
        text = get_text(url, token=cluster.token)
        ok = all(f'tidelease_controller_queue_depth{{controller="{n}"}}' in text for n in names)
        return text if ok else None

    wait_for(every_loop, what=f"the reconcile loops of {names} in /metrics", timeout=30)
