"""Right-of-return leasing on the local cluster: the real StatefulSet controller scales the owner,
the real kube-scheduler places every pod through the extender, and the leasing controller runs in
`tidelease controllers` in the chart's default mode (``dra.enabled: false``; the e2e cluster runs
it in DRA mode for test_leasing_dra.py, so this module starts it again without DRA for its
tests: ``Cluster.controllers_mode``).

An online job ``recsys`` (a StatefulSet of 4-GPU replicas) holds 16 GPUs; its GpuLease lends 8,
borrowers run on them, then the lease asks for 16 again: the borrowers get a notice, are evicted
after the grace period, and the owner's new replicas land on the very devices it lent. With one
lent device made unhealthy, the replica that held it gets standby devices of the same type and
tier instead. A CRD shaped like LeaderWorkerSet, whose replicas are groups of pods, lends whole
groups and takes each pod of each group back to its own devices.

Right of return per replica: a 3 x 4 GPU StatefulSet lends replicas 1 and 2 and takes them back
twenty times, borrowers on exactly the lent devices each time; every time each replica is back
on exactly the UUIDs it held before it was scaled down (compared per ordinal, against the
pods' bound devices as the API server has them, never against the controller's own record).
With a device of recsys-1's group made unhealthy, recsys-1 alone falls back to standby
devices, of the lent device's type and tier among standby pools of several types and tiers.

The local cluster gives borrowers GRACE_S seconds of notice (hack/cluster-up.sh sets the
extender's leasing_test_grace_s); the leases say 30 s, the CRD's minimum.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from common import builders
from common.model import Priority
from tests.e2e import groupworkload, leasingjob
from tests.e2e.harness import BORROWER, Cluster, NodeGroup, workload
from tests.e2e.kube import get_text, wait_for
from tests.e2e.leasingjob import GRACE_S, REPLICA_GPUS, Job, assert_stand_ins, standby_pools
from tests.processes import ProcessSpec

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module", autouse=True)
def default_mode(cluster: Cluster) -> Iterator[None]:
    """The chart's default controller mode for this module's tests, then DRA mode again."""
    with cluster.controllers_mode(dra=False) as pid:
        assert ProcessSpec.of(pid).env.get("TIDELEASE_EXTENDER_DRA") == "false"
        yield


@pytest.fixture
def job(cluster: Cluster, group: NodeGroup, namespace: str) -> Job:
    cluster.ensure_priority_class(BORROWER, 10)
    for suffix in ("n1", "n2"):
        group.add_node(suffix, lambda name: builders.devices(name, 8))
    standby = standby_pools(group)
    group.wait_ready()
    job = Job(cluster, group, namespace)
    job.standby = standby
    return job


def test_lend_borrow_reclaim_gives_the_owner_the_same_devices(job: Job) -> None:
    lent = job.lend_half()
    job.borrow(lent)

    start = time.monotonic()
    job.set_desired(16)
    status = job.wait_steady("the reclaim to finish", lambda s: s.get("reclaims"))
    took = time.monotonic() - start

    placed = job.wait_placed("recsys-", {f"recsys-{i}" for i in range(4)})
    job.assert_back_home(placed, "recsys-0", "recsys-1", "recsys-2", "recsys-3")
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
    job.assert_back_home(placed, "recsys-0", "recsys-1", "recsys-2", "recsys-3")
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
    job.lend_half()
    broken = job.before["recsys-2"][0]  # a device of the group recsys-2 lent
    node = next(n for n in job.group.nodes if broken in job.cluster.gpu_node_uuids(n))
    like = job.cluster.gpu_node_uuids(node)[broken]
    job.break_device(node, broken)

    job.set_desired(16)
    status = job.wait_steady("the reclaim to finish", lambda s: s.get("reclaims"))
    placed = job.wait_placed("recsys-", {f"recsys-{i}" for i in range(4)})
    # recsys-3's group was healthy: it is back on it; recsys-2 takes standby devices of the
    # broken one's type and tier (not the A100 pool, not the lower tier's).
    job.assert_back_home(placed, "recsys-0", "recsys-1", "recsys-3")
    assert len(placed["recsys-2"]) == REPLICA_GPUS
    assert_stand_ins(job, placed["recsys-2"], like)
    assert (status["returned"], status["backfilled"]) == (4, 4)


def test_a_deployment_lends_the_devices_of_the_pods_its_scale_down_removes(
    cluster: Cluster, group: NodeGroup, namespace: str
) -> None:
    """A Deployment of three 4-GPU pods lends two: the ReplicaSet removes exactly the pods whose
    devices the lease records as lent (the controller marks them with pod-deletion-cost; left
    to itself the ReplicaSet picks its own), the pod it keeps holds what it held, and at the
    reclaim the two new pods come back onto the lent groups, as a set."""
    cluster.ensure_priority_class(BORROWER, 10)
    for suffix in ("n1", "n2"):
        group.add_node(suffix, lambda name: builders.devices(name, 8))
    group.wait_ready()
    job = Job(cluster, group, namespace, replicas=3, kind="Deployment")

    def placed(n: int) -> dict[str, list[str]] | None:
        now = {name: sorted(d) for name, d in job.placed("recsys-").items()}
        return now if len(now) == n else None

    before = wait_for(lambda: placed(3), what="3 pods placed", describe=job.describe)
    job.set_desired(REPLICA_GPUS)
    status = job.wait_steady(
        "8 devices lent", lambda s: sum(len(g["devices"]) for g in s.get("lent") or []) == 8
    )
    groups = {g["replica"]: sorted(g["devices"]) for g in status["lent"]}
    after = wait_for(lambda: placed(1), what="one pod left", describe=job.describe)
    (kept,) = after
    assert kept not in groups, (kept, groups)
    assert after[kept] == before[kept]
    assert groups == {name: before[name] for name in before if name != kept}  # whole, exact

    job.set_desired(3 * REPLICA_GPUS)
    job.wait_steady("the reclaim to finish", lambda s: s.get("reclaims") == 1)
    back = wait_for(lambda: placed(3), what="3 pods placed again", describe=job.describe)
    new = sorted(d for name, d in back.items() if name != kept)
    assert new == sorted(groups.values()), (new, groups)  # the lent groups, as a set


@pytest.fixture
def small_job(cluster: Cluster, group: NodeGroup, namespace: str) -> Job:
    return leasingjob.small_job(cluster, group, namespace)


CYCLES = 20


def test_each_replica_gets_back_exactly_its_own_devices_every_cycle(small_job: Job) -> None:
    job = small_job
    for cycle in range(CYCLES):
        job.round_trip(cycle)  # per replica, against the pods' bound devices before the lend
        assert not job.placed(f"borrow-{cycle}-"), "the borrowers were not evicted"


def test_only_the_replica_whose_device_failed_falls_back_to_standby(small_job: Job) -> None:
    job = small_job
    before = {r: sorted(d) for r, d in job.replicas_placed(3).items()}
    groups = job.lend_groups(keep=1)
    assert groups == {r: before[r] for r in ("recsys-1", "recsys-2")}, groups
    job.borrow({u for devs in groups.values() for u in devs})
    broken = groups["recsys-1"][0]
    node = next(n for n in job.group.nodes if broken in job.cluster.gpu_node_uuids(n))
    job.break_device(node, broken)
    like = job.cluster.gpu_node_uuids(node)[broken]
    status = job.reclaim(reclaims=1)
    placed = job.replicas_placed(3)
    assert sorted(placed["recsys-2"]) == before["recsys-2"]  # untouched by the failure
    assert sorted(placed["recsys-0"]) == before["recsys-0"]
    assert len(placed["recsys-1"]) == REPLICA_GPUS
    assert_stand_ins(job, placed["recsys-1"], like)
    assert (status["returned"], status["backfilled"]) == (4, 4)
    # recsys-1's own devices stay lent, whole (they come back once repaired), named after a
    # replica that is down now that recsys-1 runs on stand-ins.
    assert [(g["replica"], sorted(g["devices"])) for g in status["lent"]] == [
        ("recsys-3", groups["recsys-1"])
    ]


def test_a_group_workload_takes_back_each_group_on_its_own_devices(
    cluster: Cluster, group: NodeGroup, namespace: str
) -> None:
    """A GpuLease on a CRD shaped like LeaderWorkerSet (its scale subresource counts groups of
    a leader and a worker, 2 GPUs each; the controllers may patch only its scale): 3 groups,
    2 lent whole; each pod's lent devices recorded for that pod, borrowers on exactly those;
    the reclaim brings every pod of every group back on exactly the UUIDs it held, compared
    per pod against the pods' bound devices before the lend."""
    groupworkload.ensure_crd(cluster.kube)
    cluster.ensure_priority_class(BORROWER, 10)
    group.add_node("n1", lambda name: builders.devices(name, 4))
    group.add_node("n2", lambda name: builders.devices(name, 8))
    group.wait_ready()
    job = Job(cluster, group, namespace, replicas=3, kind=groupworkload.KIND)
    assert job.groups is not None
    try:
        members = {g: job.groups.members(g) for g in range(3)}
        before = {n: sorted(d) for n, d in job.replicas_placed(3).items()}
        groups = job.lend_groups(keep=1)  # group 0's pods alone placed then
        assert groups == {n: before[n] for n in members[1] + members[2]}, groups
        lent = {u for d in groups.values() for u in d}
        for i in range(4):
            group.create_pod(
                namespace,
                f"borrow-{i}",
                REPLICA_GPUS // 2,
                priority=Priority.LOW,
                priority_class=BORROWER,
            )
        borrowed = job.wait_placed("borrow-", {f"borrow-{i}" for i in range(4)})
        assert {u for d in borrowed.values() for u in d} == lent, borrowed
        status = job.reclaim(reclaims=1)
        placed = job.replicas_placed(3)
        assert {n: sorted(d) for n, d in placed.items()} == before
        assert (status["returned"], status["backfilled"]) == (8, 0)
        assert not job.placed("borrow-"), "the borrowers were not evicted"
    finally:
        job.groups.stop()


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
