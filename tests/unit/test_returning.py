"""Right of return per replica: a StatefulSet replica taking back its lent group goes to the
node holding that group, binds exactly those devices, and no other replica's; where its group
cannot come back it falls back without touching the others' groups. Prewarm warms, for each
group, the node where that group's replica is placed."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from common import builders
from common.model import (
    Device,
    DeviceClass,
    GpuUuid,
    Holder,
    JobKey,
    NodeInventory,
    PodRequest,
    Priority,
    Tier,
)
from common.objects import parse_gpu_node
from common.podrequest import parse_pod
from common.tenancy import job_key
from extender.cluster.state import ClusterState
from extender.prewarm.policy import PrewarmSettings, WorkloadTemplate, plan_lease
from extender.rightofreturn.lease import parse_gpu_lease
from extender.scheduler.filtering import filter_nodes
from extender.scheduler.placement import Verdict, pick_devices, verdict
from extender.scheduler.returning import (
    RETURN_HOME,
    RETURN_HOME_UNOFFERED,
    RETURN_HOMES,
    return_homes,
)
from extender.scheduler.scoring import prioritize_nodes
from extender.scheduler.settings import ExtenderSettings
from extender.scheduler.victims import Proposal, preempt_nodes
from tests.unit.cluster import allocate, cluster, holder

OWNER = "recsys"
KEY = job_key("default", OWNER)
STATEFULSET = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": OWNER}
DEPLOYMENT = {**STATEFULSET, "kind": "Deployment"}


def group(node: str, replica: str, start: int, *, healthy: bool = True) -> list[Device]:
    return builders.devices(node, 4, owner=OWNER, replica=replica, start=start, healthy=healthy)


def reclaiming(
    state: ClusterState, groups: dict[str, list[Device]], workload: dict[str, str] | None = None
) -> dict[str, Any]:
    lease = {
        "metadata": {"namespace": "default", "name": OWNER, "resourceVersion": "7"},
        "spec": {
            "owner": OWNER,
            "workload": workload or STATEFULSET,
            "gpusPerReplica": 4,
            "desiredGPUs": 12,
        },
        "status": {
            "phase": "Reclaiming",
            "targetReplicas": 3,
            "lent": [
                {"replica": r, "devices": [d.uuid for d in devs]} for r, devs in groups.items()
            ],
            "reclaim": {"groups": sorted(groups)},
        },
    }
    state.apply_gpu_lease("MODIFIED", lease)
    return lease


def replica_pod(state: ClusterState, ordinal: int, **kw: Any) -> PodRequest:
    pod = builders.pod(
        f"{OWNER}-{ordinal}",
        4,
        priority=Priority.HIGH,
        owner=OWNER,
        pod_priority=1000,
        controller=("StatefulSet", OWNER),
        **kw,
    )
    return state.with_reclaim(parse_pod(pod))


def place(state: ClusterState, req: PodRequest, names: list[str]) -> tuple[str, tuple[Any, ...]]:
    """Filter, prioritize (best score), then bind's pick: the node and the devices."""
    decision = filter_nodes(state, req, names)
    assert decision.passed, decision
    scores = dict(prioritize_nodes(state, req, decision.passed, ExtenderSettings().weights))
    node = max(decision.passed, key=lambda n: (scores[n], n))
    node_state = state.get(node)
    assert node_state is not None
    allocated = [u for a in node_state.allocations.values() for u in a.devices]
    plan, devices = pick_devices(node_state.devices, allocated, req)
    assert plan.fits
    return node, tuple(d.uuid for d in devices)


def test_a_replica_takes_only_its_own_groups_devices() -> None:
    cls = DeviceClass("H20", Tier.HA, True, KEY, False, "recsys-1")
    own = PodRequest("default", "recsys-1", "u", 4, Priority.HIGH, owner=KEY)
    assert verdict(cls, own) is Verdict.USABLE  # no lent group: any of the job's tags
    assert verdict(cls, replace(own, lent_group="recsys-1")) is Verdict.USABLE
    other = PodRequest(
        "default", "recsys-2", "u", 4, Priority.HIGH, owner=KEY, lent_group="recsys-2"
    )
    assert verdict(cls, other) is Verdict.TAGGED_REPLICA
    borrower = PodRequest("default", "b", "u", 4, Priority.LOW)
    assert verdict(cls, borrower) is Verdict.USABLE


@pytest.mark.parametrize("shared_node", [True, False], ids=["groups-on-one-node", "apart"])
def test_each_replica_goes_back_to_exactly_its_own_devices(shared_node: bool) -> None:
    if shared_node:
        g1, g2 = group("n1", "recsys-1", 0), group("n1", "recsys-2", 4)
        layout = [builders.gpu_node("n1", g1 + g2)]
    else:
        g1, g2 = group("n1", "recsys-1", 0), group("n2", "recsys-2", 0)
        layout = [
            builders.gpu_node("n1", g1 + builders.devices("n1", 4, start=4)),
            builders.gpu_node("n2", g2 + builders.devices("n2", 4, start=4)),
        ]
    # A free untagged node that caches nothing and packs as well: it must not win.
    state = cluster(*layout, builders.gpu_node("free"))
    reclaiming(state, {"recsys-1": g1, "recsys-2": g2})
    names = [s.node for s in state]
    # Replica 2 first: it must not take replica 1's devices although they come first by index.
    for ordinal, lent in ((2, g2), (1, g1)):
        req = replica_pod(state, ordinal)
        assert req.lent_group == f"{OWNER}-{ordinal}"
        node, devices = place(state, req, names)
        assert (node, devices) == (lent[0].node, tuple(d.uuid for d in lent))
        allocate(state, node, [(req.holder(), list(devices))])


def test_a_borrower_on_the_group_is_preempted_there_not_elsewhere() -> None:
    g2 = group("n2", "recsys-2", 0)
    state = cluster(
        builders.gpu_node("n2", g2 + builders.devices("n2", 4, start=4, owner="other")),
        builders.gpu_node("free"),
    )
    reclaiming(state, {"recsys-2": g2})
    borrower = holder("finetune", pod_priority=10)
    allocate(state, "n2", [(borrower, [d.uuid for d in g2[:2]])])
    req = replica_pod(state, 2)
    assert return_homes(state, req) == {"n2"}
    decision = filter_nodes(state, req, ["free", "n2"])
    assert decision.passed == []
    assert "n2" in decision.failed
    assert decision.unresolvable == {"free": RETURN_HOME.format(node="n2")}
    proposals = {"free": Proposal(()), "n2": Proposal((borrower.pod_uid,))}
    answer = preempt_nodes(state, req, proposals)
    assert answer == {"n2": Proposal((borrower.pod_uid,))}


def test_a_broken_group_falls_back_without_taking_another_replicas_group() -> None:
    """recsys-1's group has an unhealthy device: recsys-1 goes to the standby node, and
    recsys-2's group, free on the same node, is left for recsys-2."""
    g1 = group("n1", "recsys-1", 0)[:3] + group("n1", "recsys-1", 3, healthy=False)[:1]
    g2 = group("n1", "recsys-2", 4)
    state = cluster(
        builders.gpu_node("n1", g1 + g2),
        builders.gpu_node("s1", builders.devices("s1", 4, standby=True)),
    )
    reclaiming(state, {"recsys-1": g1, "recsys-2": g2})
    req = replica_pod(state, 1)
    assert not return_homes(state, req)
    node, devices = place(state, req, ["n1", "s1"])
    assert node == "s1"
    assert not set(devices) & {d.uuid for d in g1 + g2}
    allocate(state, node, [(req.holder(), list(devices))])
    node, devices = place(state, replica_pod(state, 2), ["n1", "s1"])
    assert (node, devices) == ("n1", tuple(d.uuid for d in g2))


def test_a_stand_in_is_like_what_the_replica_lent() -> None:
    """recsys-1 lent H20 HA devices, one of which failed: among standby pools of another type
    (A100 HA), of a lower tier (H20 MA) and of its own (H20 HA), only the last may stand in,
    though the pod names no GPU type (the request takes the group's type and tier)."""
    g1 = group("n1", "recsys-1", 0)[:3] + group("n1", "recsys-1", 3, healthy=False)[:1]
    state = cluster(
        builders.gpu_node("n1", g1),
        builders.gpu_node("a100", builders.devices("a100", 4, standby=True, gpu_type="A100")),
        builders.gpu_node("ma", builders.devices("ma", 4, standby=True, tier=Tier.MA)),
        builders.gpu_node("h20", builders.devices("h20", 4, standby=True)),
    )
    reclaiming(state, {"recsys-1": g1})
    req = replica_pod(state, 1)
    assert (req.gpu_type, req.min_tier) == ("H20", Tier.HA)
    decision = filter_nodes(state, req, ["n1", "a100", "ma", "h20"])
    assert decision.passed == ["h20"], decision
    node, _ = place(state, req, ["n1", "a100", "ma", "h20"])
    assert node == "h20"


def test_a_pod_that_names_its_type_keeps_it_and_a_higher_tier_stays_required() -> None:
    g1 = group("n1", "recsys-1", 0)  # H20 HA
    state = cluster(builders.gpu_node("n1", g1))
    reclaiming(state, {"recsys-1": g1})
    req = replica_pod(state, 1, gpu_type="A100", tier=Tier.LA)
    assert (req.gpu_type, req.min_tier) == ("A100", Tier.HA)


def test_a_deployments_pods_take_the_groups_back_as_a_set() -> None:
    g1, g2 = group("n1", "recsys-1", 0), group("n2", "recsys-2", 0)
    state = cluster(builders.gpu_node("n1", g1), builders.gpu_node("n2", g2))
    deployment = {**STATEFULSET, "kind": "Deployment"}
    reclaiming(state, {"recsys-1": g1, "recsys-2": g2}, workload=deployment)
    req = state.with_reclaim(
        parse_pod(
            builders.pod(
                "recsys-7c9f-x2",
                4,
                priority=Priority.HIGH,
                owner=OWNER,
                controller=("ReplicaSet", f"{OWNER}-7c9f"),
            )
        )
    )
    assert (req.reclaim, req.lent_group) == (True, None)
    assert filter_nodes(state, req, ["n1", "n2"]).passed == ["n1", "n2"]


def deployment_pod(state: ClusterState) -> PodRequest:
    pod = builders.pod(
        "recsys-7c9f-x2",
        4,
        priority=Priority.HIGH,
        owner=OWNER,
        pod_priority=1000,
        controller=("ReplicaSet", f"{OWNER}-7c9f"),
    )
    return state.with_reclaim(parse_pod(pod))


def test_a_deployments_returning_pod_goes_where_its_groups_are_not_to_free_devices() -> None:
    """The hour's soak found it: a Deployment's returning pod was placed on free devices of
    another node while the borrower of its lent group was being evicted, so the borrower went
    for nothing and the group never came back. It goes only where a group being taken back is
    (kube-scheduler preempts the borrower there), never to a group that stays lent."""
    g1, g2 = group("n1", "recsys-1", 0), group("n2", "recsys-2", 0)
    state = cluster(
        builders.gpu_node("n1", g1), builders.gpu_node("n2", g2), builders.gpu_node("free")
    )
    borrower, other = holder("borrower"), holder("other")
    allocate(state, "n1", [(borrower, [d.uuid for d in g1])])
    allocate(state, "n2", [(other, [d.uuid for d in g2])])
    lease = reclaiming(state, {"recsys-1": g1, "recsys-2": g2}, workload=DEPLOYMENT)
    lease["status"]["reclaim"]["groups"] = ["recsys-1"]  # recsys-2's group stays lent
    state.apply_gpu_lease("MODIFIED", lease)
    req = deployment_pod(state)
    assert return_homes(state, req) == {"n1"}
    decision = filter_nodes(state, req, ["n1", "n2", "free"])
    assert decision.passed == []
    assert decision.unresolvable["free"] == RETURN_HOMES.format(nodes="n1")
    assert "n2" not in decision.failed
    proposals = {
        "free": Proposal(()),
        "n1": Proposal((borrower.pod_uid,)),
        "n2": Proposal((other.pod_uid,)),
    }
    assert preempt_nodes(state, req, proposals) == {"n1": Proposal((borrower.pod_uid,))}


def test_a_replica_waits_for_its_groups_borrower_rather_than_preempt_elsewhere() -> None:
    """The hour's soak found it too: the borrower on recsys-1's group could not be preempted
    there (here: a higher pod priority; there: already being evicted after its notice), so the
    filter let the other nodes through and kube-scheduler preempted a borrower on another
    node, without notice and for nothing (the replica was then bound to its own group). Now
    every other node is unresolvable: no preemption anywhere, the replica waits for the
    eviction that the leasing controller runs."""
    g1 = group("n1", "recsys-1", 0)
    state = cluster(builders.gpu_node("n1", g1), builders.gpu_node("n2"))
    strong = holder("strong", pod_priority=5000)  # the group's borrower: not preemptible
    weak = holder("weak")  # n2's: preemptible
    allocate(state, "n1", [(strong, [d.uuid for d in g1])])
    allocate(state, "n2", [(weak, [builders.device_uuid("n2", i) for i in range(8)])])
    reclaiming(state, {"recsys-1": g1})
    req = replica_pod(state, 1)
    assert return_homes(state, req) == {"n1"}
    decision = filter_nodes(state, req, ["n1", "n2"])
    assert (decision.passed, decision.failed) == ([], {})
    assert decision.unresolvable["n2"] == RETURN_HOME.format(node="n1")
    assert "n1" in decision.unresolvable  # no preemption can help there: it waits


def test_a_replica_waits_while_kube_scheduler_offers_not_its_groups_node() -> None:
    """The fourth hour found it (seed 7, t=1533 s and 1555 s): the group's borrower was being
    evicted, kube-scheduler's own resource fit still counted it, so kube-scheduler offered
    every node but the group's; the filter, judging none of the replica's home, let the
    others through and the replica took free devices elsewhere, its group left lent. Now it
    waits (the borrower's deletion makes kube-scheduler try it again), until the reclaim is
    overdue: then a stand-in is better than no place."""
    g1 = group("n1", "recsys-1", 0)
    state = cluster(builders.gpu_node("n1", g1), builders.gpu_node("free"))
    allocate(state, "n1", [(holder("leaving"), [d.uuid for d in g1])])
    lease = reclaiming(state, {"recsys-1": g1})
    req = replica_pod(state, 1)
    assert (req.reclaim, req.reclaim_overdue) == (True, False)
    assert return_homes(state, req) == {"n1"}

    decision = filter_nodes(state, req, ["free"])  # n1 not offered
    assert (decision.passed, decision.failed) == ([], {})
    assert decision.unresolvable == {"free": RETURN_HOME_UNOFFERED.format(nodes="n1")}

    lease["status"]["conditions"] = [
        {"type": "Reclaiming", "status": "True", "reason": "Reclaiming"},
        {"type": "Degraded", "status": "True", "reason": "ReclaimOverdue"},
    ]
    state.apply_gpu_lease("MODIFIED", lease)
    overdue = replica_pod(state, 1)
    assert (overdue.reclaim, overdue.lent_group, overdue.reclaim_overdue) == (
        True,
        "recsys-1",
        True,
    )
    assert filter_nodes(state, overdue, ["free"]).passed == ["free"]
    # Offered, its group's node is still the only place, overdue or not.
    assert filter_nodes(state, overdue, ["n1", "free"]).passed == []
    assert filter_nodes(state, overdue, ["n1", "free"]).unresolvable["free"] == RETURN_HOME.format(
        node="n1"
    )


def test_a_degraded_lease_of_another_reason_keeps_the_replica_waiting() -> None:
    """Only ReclaimOverdue releases the wait: a lease Degraded for another reason (a group
    that cannot come back, say) is not a reclaim past its bound."""
    g1 = group("n1", "recsys-1", 0)
    state = cluster(builders.gpu_node("n1", g1), builders.gpu_node("free"))
    allocate(state, "n1", [(holder("leaving"), [d.uuid for d in g1])])
    lease = reclaiming(state, {"recsys-1": g1})
    lease["status"]["conditions"] = [
        {"type": "Degraded", "status": "True", "reason": "StandbyShort"},
        {"type": "Degraded", "status": "False", "reason": "ReclaimOverdue"},
    ]
    state.apply_gpu_lease("MODIFIED", lease)
    req = replica_pod(state, 1)
    assert req.reclaim_overdue is False
    assert filter_nodes(state, req, ["free"]).passed == []


def test_a_replica_returns_home_before_the_view_sees_its_lease_reclaiming() -> None:
    """The second hour found it (seed 7, t=239 s, the extenders' network slowed): the
    controller wrote Reclaiming, noticed and evicted the borrower and scaled up, and the
    replica came to an extender whose lease watch had not caught up; it took free devices
    elsewhere and its group stayed lent. A replica whose own group is tagged is that group's
    return whatever the lease's phase in the view; another replica of the job is not."""
    g1 = group("n1", "recsys-1", 0)
    state = cluster(builders.gpu_node("n1", g1), builders.gpu_node("free"))
    lease = reclaiming(state, {"recsys-1": g1})
    lease["status"] = {  # the view's last news: lent, not yet Reclaiming
        "phase": "Lending",
        "targetReplicas": 1,
        "lent": [{"replica": "recsys-1", "devices": [d.uuid for d in g1]}],
    }
    state.apply_gpu_lease("MODIFIED", lease)
    req = replica_pod(state, 1)
    assert (req.reclaim, req.lent_group) == (True, "recsys-1")
    assert return_homes(state, req) == {"n1"}
    assert filter_nodes(state, req, ["n1", "free"]).passed == ["n1"]
    other = replica_pod(state, 0)
    assert (other.reclaim, other.lent_group) == (False, None)


def test_a_deployments_returning_pod_takes_no_device_of_a_group_that_stays_lent() -> None:
    """The fourth hour found it: a Deployment's returning pod, sent to the node of the group
    being taken back, took a free device there of another group of its job that stays lent, so
    that group's record named a device the owner held. It takes only what its lease takes
    back."""
    g1 = group("n1", "recsys-1", 0)
    g2 = group("n1", "recsys-2", 4)  # stays lent, free, first... if it were allowed
    state = cluster(builders.gpu_node("n1", g2 + g1))
    lease = reclaiming(state, {"recsys-1": g1, "recsys-2": g2}, workload=DEPLOYMENT)
    lease["status"]["reclaim"]["groups"] = ["recsys-1"]
    state.apply_gpu_lease("MODIFIED", lease)
    req = deployment_pod(state)
    assert req.lent_groups == {"recsys-1"}
    cls = g2[0].cls
    assert verdict(cls, req) is Verdict.TAGGED_REPLICA
    node, devices = place(state, req, ["n1"])
    assert (node, devices) == ("n1", tuple(d.uuid for d in g1))


def test_a_pod_of_another_namespace_named_as_a_lent_replica_returns_nothing() -> None:
    """What a tenant with ``edit`` in another namespace can write: a pod named as the owner's
    lent replica, the same owner annotation, a StatefulSet of the same name as controller. Its
    owner is its own namespace's job, so it is no return of the group: no reclaim, no home,
    none of the group's devices (tagged for another job)."""
    g1 = group("n1", "recsys-1", 0)
    state = cluster(builders.gpu_node("n1", g1), builders.gpu_node("free"))
    lease = reclaiming(state, {"recsys-1": g1})
    lease["status"] = {"phase": "Lending", "targetReplicas": 1, "lent": [
        {"replica": "recsys-1", "devices": [d.uuid for d in g1]}]}  # fmt: skip
    state.apply_gpu_lease("MODIFIED", lease)
    pod = builders.pod(
        f"{OWNER}-1",
        4,
        namespace="tenant",
        priority=Priority.HIGH,
        owner=OWNER,
        pod_priority=1000,
        controller=("StatefulSet", OWNER),
    )
    req = state.with_reclaim(parse_pod(pod))
    assert (req.reclaim, req.lent_group, req.lent_groups) == (False, None, frozenset())
    assert not return_homes(state, req)
    assert verdict(g1[0].cls, req) is Verdict.TAGGED_OTHER


def test_a_deployments_pod_falls_back_where_no_group_can_come_back() -> None:
    g1 = group("n1", "recsys-1", 0)[:3] + group("n1", "recsys-1", 3, healthy=False)[:1]
    state = cluster(builders.gpu_node("n1", g1), builders.gpu_node("free"))
    reclaiming(state, {"recsys-1": g1}, workload=DEPLOYMENT)
    req = deployment_pod(state)
    assert not return_homes(state, req)
    assert filter_nodes(state, req, ["n1", "free"]).passed == ["free"]


def test_a_group_tag_survives_the_gpunode_round_trip() -> None:
    devs = group("n1", "recsys-1", 0) + builders.devices("n1", 4, start=4)
    inv = parse_gpu_node(builders.gpu_node("n1", devs))
    assert [d.cls.replica for d in inv.devices] == ["recsys-1"] * 4 + [None] * 4
    bad = builders.gpu_node("n1", devs)
    bad["spec"]["devices"][0].pop("owner")
    with pytest.raises(Exception, match="replica must be a pod name, with an owner"):
        parse_gpu_node(bad)


# --- prewarm and placement agree ---


def test_prewarm_warms_for_each_group_the_node_its_replica_is_bound_to() -> None:
    """Four groups lent over three nodes, one node holding two; three come back. recsys-3's
    group is broken and the reclaim took it as it is (as the controller does where no group
    that stays lent can stand in), so recsys-3 stands in on the standby node. For every group,
    the node prewarm chose is the node filter, prioritize and bind put that group's replica
    on."""
    g1, g2 = group("n1", "recsys-1", 0), group("n2", "recsys-2", 0)
    g3 = group("n2", "recsys-3", 4)[:3] + group("n2", "recsys-3", 7, healthy=False)
    g4 = group("n3", "recsys-4", 0)
    objects = [
        builders.gpu_node("n1", g1),
        builders.gpu_node("n2", g2 + g3),
        builders.gpu_node("n3", g4),
        builders.gpu_node("s1", builders.devices("s1", 4, standby=True)),
    ]
    state = cluster(*objects)
    groups = {"recsys-1": g1, "recsys-2": g2, "recsys-3": g3, "recsys-4": g4}
    raw = reclaiming(state, groups)
    raw["status"]["targetReplicas"] = 4
    raw["status"]["reclaim"]["groups"] = ["recsys-1", "recsys-2", "recsys-3"]
    state.apply_gpu_lease("MODIFIED", raw)
    lease = parse_gpu_lease(raw)
    nodes: dict[str, NodeInventory] = {o["metadata"]["name"]: parse_gpu_node(o) for o in objects}
    template = WorkloadTemplate(
        replicas=1, images=("registry.example/train:v1",), checkpoint="ck", image_bytes=1e9
    )
    settings = PrewarmSettings(spare_standby_replicas=0)
    plan = plan_lease(lease, template, nodes, {}, settings, now=1.8e9)
    warmed = {g: d.node for d in plan.nodes for g in d.groups}
    standby = [d.node for d in plan.nodes if d.role == "Standby"]
    assert warmed == {"recsys-1": "n1", "recsys-2": "n2"}
    assert standby == ["s1"]
    names = [s.node for s in state]
    bound: dict[str, str] = {}
    for ordinal in (3, 2, 1):
        req = replica_pod(state, ordinal)
        node, devices = place(state, req, names)
        bound[req.name] = node
        allocate(state, node, [(req.holder(), list(devices))])
        if req.name in groups and req.name in warmed:
            assert devices == tuple(d.uuid for d in groups[req.name])
    assert {g: bound[g] for g in warmed} == warmed
    assert bound["recsys-3"] in standby
    held = Counter(u for s in state for a in s.allocations.values() for u in a.devices)
    assert max(held.values()) == 1


def test_holders_of_a_group_decide_whether_it_comes_back() -> None:
    g1 = group("n1", "recsys-1", 0)
    state = cluster(builders.gpu_node("n1", g1 + builders.devices("n1", 4, start=4)))
    reclaiming(state, {"recsys-1": g1})
    squatter = Holder(holder("hp").pod_uid, "default", "hp", Priority.HIGH, 5000, JobKey("other"))
    allocate(state, "n1", [(squatter, [GpuUuid(g1[0].uuid)])])
    assert not return_homes(state, replica_pod(state, 1))
