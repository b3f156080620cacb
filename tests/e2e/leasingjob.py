"""An online job for the e2e leasing tests: a StatefulSet of 4-GPU replicas (or a Deployment,
or a group workload shaped like LeaderWorkerSet: groups of two 2-GPU pods) with its GpuLease
in a namespace of its own, on a node group of its own, and the steps of a lend and a reclaim,
each waited for; every return checked per replica against the devices the replica's pod was
bound to before (the API server's truth, never the controller's record)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common import builders, contract
from common.model import Priority, Tier
from tests.e2e import groupworkload
from tests.e2e.groupworkload import GroupController
from tests.e2e.harness import BORROWER, ONLINE, Cluster, NodeGroup, devices_of, workload
from tests.e2e.kube import wait_for

GRACE_S = 2  # TL_CLUSTER_LEASING_GRACE_S's default
REPLICA_GPUS = 4
GROUP_SIZE = 2  # pods per replica of a group workload (groupworkload.KIND)


def lent_devices(lease: dict[str, Any]) -> set[str]:
    return {
        u for g in (lease.get("status") or {}).get("lent") or [] for u in g.get("devices") or []
    }


class Job:
    """The owner's StatefulSet and GpuLease in one namespace, on one node group."""

    def __init__(
        self,
        cluster: Cluster,
        group: NodeGroup,
        namespace: str,
        *,
        replicas: int = 4,
        kind: str = "StatefulSet",
    ) -> None:
        self.cluster, self.group, self.ns = cluster, group, namespace
        self.replicas = replicas
        self.before: dict[str, list[str]] = {}  # each replica's devices before a lend
        self.standby: list[str] = []  # the standby nodes
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
        self.groups: GroupController | None = None
        if kind == groupworkload.KIND:
            # Groups of a leader and a worker, each half the replica's GPUs.
            self.groups = GroupController(
                kube,
                namespace,
                "recsys",
                replicas,
                GROUP_SIZE,
                lambda name: group.pod(
                    namespace,
                    name,
                    REPLICA_GPUS // GROUP_SIZE,
                    priority=Priority.HIGH,
                    owner="recsys",
                    tier=Tier.HA,
                    priority_class=ONLINE,
                ),
            )
        else:
            kube.create(workload(kind, "recsys", namespace, template, replicas=replicas))
        lease = builders.gpu_lease(
            "recsys",
            namespace,
            gpus_per_replica=REPLICA_GPUS,
            desired_gpus=replicas * REPLICA_GPUS,
            grace_s=30,
        )
        lease["spec"]["workload"]["kind"] = kind
        if self.groups is not None:
            lease["spec"]["workload"]["apiVersion"] = groupworkload.API_VERSION
        kube.create(lease)

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
        """16 GPUs placed, then 8 lent: the devices lent (tagged for the owner). What each
        replica held before is kept in :attr:`before` (the pods' bound devices); each lent
        group is checked against it, per replica."""
        self.before = {
            r: sorted(d)
            for r, d in self.wait_placed("recsys-", {f"recsys-{i}" for i in range(4)}).items()
        }
        self.set_desired(8)
        status = self.wait_steady("8 devices lent", lambda s: len(lent_devices({"status": s})) == 8)
        self.wait_placed("recsys-", {"recsys-0", "recsys-1"})
        groups = {g["replica"]: sorted(g["devices"]) for g in status["lent"]}
        assert groups == {r: self.before[r] for r in ("recsys-2", "recsys-3")}, groups
        return lent_devices({"status": status})

    def assert_back_home(self, placed: dict[str, list[str]], *replicas: str) -> None:
        """Each of ``replicas`` holds exactly the UUIDs it held before it lent them."""
        got = {r: sorted(placed[r]) for r in replicas}
        assert got == {r: self.before[r] for r in replicas}, f"back on {got}, held {self.before}"

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
        """The pods of the first ``count`` replicas (of a group workload: every member of
        those groups), once they alone are placed."""
        if self.groups is not None:
            names = {n for g in range(count) for n in self.groups.members(g)}
        else:
            names = {f"recsys-{i}" for i in range(count)}
        return self.wait_placed("recsys-", names)

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

    def round_trip(
        self, cycle: int, *, what: str = "", before_lend: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """One cycle of a 3-replica job: replicas 1 and 2 lend their devices (each group what
        its replica's pod was bound to), borrowers take exactly those, the job takes them back
        (``cycle + 1`` reclaims in all), and each replica is back on exactly the devices its pod
        held before; ``before_lend`` runs first. The lease's status."""
        what = what or f"cycle {cycle}"
        before = {r: sorted(d) for r, d in self.replicas_placed(3).items()}
        if before_lend is not None:
            before_lend()
        groups = self.lend_groups(keep=1)
        assert groups == {r: before[r] for r in ("recsys-1", "recsys-2")}, (what, groups)
        self.borrow({u for d in groups.values() for u in d}, prefix=f"borrow-{cycle}-")
        status = self.reclaim(reclaims=cycle + 1)
        placed = self.replicas_placed(3)
        got = {r: sorted(placed[r]) for r in before}
        assert got == before, f"{what}: replicas back on {got}, held {before}"
        assert (status["returned"], status["backfilled"]) == (8 * (cycle + 1), 0), what
        return status


def standby_pools(group: NodeGroup) -> list[str]:
    """Standby nodes of several types and tiers: s1 of the job's (H20, HA), s2 of another type
    (A100, HA), s3 of the job's type at a lower tier (H20, MA). A stand-in must come from s1."""
    return [
        group.add_node("s1", lambda name: builders.devices(name, 4, standby=True)),
        group.add_node(
            "s2",
            lambda name: builders.devices(name, 4, standby=True, gpu_type="A100"),
            gpu_type="A100",
        ),
        group.add_node("s3", lambda name: builders.devices(name, 4, standby=True, tier=Tier.MA)),
    ]


def assert_stand_ins(job: Job, held: list[str], like: dict[str, Any]) -> None:
    """Every device of ``held`` is a standby device of ``like``'s GPU type and tier."""
    standby: dict[str, dict[str, Any]] = {}
    for node in job.standby:
        standby.update(job.cluster.gpu_node_uuids(node))
    assert held
    assert set(held) <= set(standby), (held, sorted(standby))
    for u in held:
        got = (standby[u]["type"], standby[u]["tier"])
        assert got == (like["type"], like["tier"]), f"stand-in {u} is {got}, lent was {like}"


def small_job(cluster: Cluster, group: NodeGroup, namespace: str) -> Job:
    """3 x 4 GPUs on a 4-GPU and an 8-GPU node (no free device beside the job's), and the
    standby pools of :func:`standby_pools`."""
    cluster.ensure_priority_class(BORROWER, 10)
    group.add_node("n1", lambda name: builders.devices(name, 4))
    group.add_node("n2", lambda name: builders.devices(name, 8))
    standby = standby_pools(group)
    group.wait_ready()
    job = Job(cluster, group, namespace, replicas=3)
    job.standby = standby
    return job
