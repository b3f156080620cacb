"""The soak run's invariant checkers (tests/soak/invariants.py): each passes a clean history and
catches a deliberately broken one, so that a green soak run means something."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from common import builders, contract
from common.model import Allocation, NodeName, Priority, Tier
from common.objects import gpu_allocation_object
from common.podrequest import parse_pod
from common.prewarmwire import Directive, ItemStatus
from extender.rightofreturn.lease import LeaseStatus, LentGroup, Trouble, lease_conditions
from tests.soak.invariants import (
    GANG_SIZE_LABEL,
    Checker,
    Deletion,
    GangWhole,
    LeakTrend,
    LedgerMatchesPods,
    NoDoubleHold,
    NoticeBeforeEviction,
    Observation,
    PendingWhileFree,
    PrewarmRecovers,
    ProcessSample,
    QueuedReleased,
    ReclaimEnds,
    Violation,
    check_history,
    pod_devices,
    slope_per_hour,
)

Obj = dict[str, Any]
uuid = builders.device_uuid


def node(name: str, *, ready: bool = True, taints: list[Obj] | None = None) -> Obj:
    status = "True" if ready else "False"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": taints or []},
        "status": {"conditions": [{"type": "Ready", "status": status}]},
    }


def bound(
    name: str,
    where: str,
    indices: range | list[int],
    *,
    namespace: str = "default",
    priority: Priority | None = None,
    owner: str | None = None,
    controller: tuple[str, str] | None = None,
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
) -> Obj:
    """A pod bound to ``where`` with devices ``indices`` of that node annotated, as bind does."""
    devices = ",".join(uuid(where, i) for i in indices)
    return builders.pod(
        name,
        len(indices),
        namespace=namespace,
        priority=priority,
        owner=owner,
        controller=controller,
        node_name=where,
        phase=phase,
        extra_annotations={
            contract.ANN_DEVICES: devices,
            contract.ANN_DEVICE_NODE: where,
            **(annotations or {}),
        },
    )


def ledger(where: str, *pods: Mapping[str, Any], devices: list[int] | None = None) -> Obj:
    """``where``'s ledger holding each pod's annotated devices (``devices``: these instead)."""
    entries = [
        Allocation(
            parse_pod(p).holder(),
            pod_devices(p) if devices is None else tuple(uuid(where, i) for i in devices),
        )
        for p in pods
    ]
    return gpu_allocation_object(NodeName(where), entries)


def lease(name: str, namespace: str, status: LeaseStatus, degraded: Trouble | None = None) -> Obj:
    obj = builders.gpu_lease(name, namespace, gpus_per_replica=2)
    obj["status"] = status.to_json() | {
        "conditions": lease_conditions(status, None, 1, 0.0, degraded)
    }
    return obj


def run(checker: Checker, *history: Observation) -> list[Violation]:
    return check_history([checker], history)


# --- (a) no device held by two pods at once ---


def test_double_hold_clean() -> None:
    pods = [
        bound("a", "n1", [0, 1]),
        bound("b", "n1", [2, 3]),
        bound("done", "n1", [0], phase="Succeeded"),  # finished: holds nothing any more
    ]
    obs = Observation(0.0, pods=pods, ledgers=[ledger("n1", pods[0], pods[1])])
    assert run(NoDoubleHold(), obs, Observation(1.0, pods=pods)) == []


def test_double_hold_catches_two_pods_with_one_uuid() -> None:
    pods = [bound("a", "n1", [0, 1]), bound("b", "n1", [1, 2])]
    found = run(NoDoubleHold(), *(Observation(t, pods=pods) for t in (0.0, 1.0, 2.0)))
    assert len(found) == 1  # once per episode, not once per observation
    assert found[0].obj == uuid("n1", 1)
    assert "default/a, default/b" in found[0].message


def test_double_hold_catches_a_uuid_in_two_ledger_entries() -> None:
    a, b = bound("a", "n1", [0]), bound("b", "n1", [1])
    obs = Observation(0.0, ledgers=[ledger("n1", a, b, devices=[3])])
    found = run(NoDoubleHold(), obs)
    assert [v.obj for v in found] == [uuid("n1", 3)]
    assert "ledger entries" in found[0].message


# --- (b) every ledger equals the devices of its bound pods ---


def test_ledger_clean_with_bind_and_release_inside_the_window() -> None:
    waiting = builders.pod("p", 2)
    placed = bound("p", "n1", [0, 1])
    entry = ledger("n1", placed)
    history = [
        Observation(0.0, pods=[waiting], ledgers=[entry]),  # bind wrote the ledger first
        Observation(1.0, pods=[placed], ledgers=[entry]),
        Observation(10.0, pods=[placed], ledgers=[entry]),
        Observation(11.0, pods=[], ledgers=[entry]),  # the pod is gone; the reaper comes
        Observation(14.0, pods=[], ledgers=[ledger("n1")]),
    ]
    assert run(LedgerMatchesPods(settle_s=5.0), *history) == []


def test_ledger_catches_a_skipped_ledger_write() -> None:
    placed = bound("p", "n1", [0, 1])
    history = [Observation(t, pods=[placed], ledgers=[ledger("n1")]) for t in (0.0, 3.0, 6.0, 9.0)]
    found = run(LedgerMatchesPods(settle_s=5.0), *history)
    assert [(v.t, v.obj) for v in found] == [(6.0, "/n1")]
    assert "default/p" in found[0].message
    assert "no entry" in found[0].message


def test_ledger_catches_a_gone_pods_stale_entry() -> None:
    entry = ledger("n1", bound("p", "n1", [0, 1]))
    found = run(LedgerMatchesPods(settle_s=5.0), *(Observation(t, ledgers=[entry]) for t in (0, 6)))
    assert len(found) == 1
    assert "stale entry: default/p" in found[0].message
    assert "is gone" in found[0].message


def test_ledger_catches_an_entry_with_other_devices() -> None:
    placed = bound("p", "n1", [0, 1])
    obs = [
        Observation(t, pods=[placed], ledgers=[ledger("n1", placed, devices=[0, 2])])
        for t in (0, 6)
    ]
    found = run(LedgerMatchesPods(settle_s=5.0), *obs)
    assert len(found) == 1
    assert "the pod holds" in found[0].message


# --- (c) every reclaim ends, each replica on its own devices or a standby stand-in ---

NS = "ml"
RECSYS = ("StatefulSet", "recsys")


def gpu_nodes(*, group_healthy: bool = True, returned: bool = False) -> list[Obj]:
    """n1: recsys-0's devices and recsys-1's lent group (tags cleared once ``returned``);
    n2: another job's lent group; n3: standby HA; n4: standby MA; n5: free untagged HA."""
    recsys_1 = (
        builders.devices("n1", 2, start=2, healthy=group_healthy)
        if returned
        else builders.devices(
            "n1", 2, start=2, owner="ml/recsys", replica="recsys-1", healthy=group_healthy
        )
    )
    return [
        builders.gpu_node("n1", [*builders.devices("n1", 2), *recsys_1]),
        builders.gpu_node("n2", builders.devices("n2", 2, owner="ads/ads", replica="ads-1")),
        builders.gpu_node("n3", builders.devices("n3", 2, standby=True)),
        builders.gpu_node("n4", builders.devices("n4", 2, standby=True, tier=Tier.MA)),
        builders.gpu_node("n5", builders.devices("n5", 2)),
    ]


RECSYS_GROUP = LentGroup("recsys-1", (uuid("n1", 2), uuid("n1", 3)))
ADS = lease("ads", "ads", LeaseStatus(groups=(LentGroup("ads-1", (uuid("n2", 0), uuid("n2", 1))),)))
LENT = LeaseStatus(groups=(RECSYS_GROUP,), target_replicas=1)
RECLAIMING = LeaseStatus(
    phase="Reclaiming",
    groups=(RECSYS_GROUP,),
    target_replicas=2,
    reclaim_started=1000.0,
    reclaim_deadline=1002.0,
    reclaiming=("recsys-1",),
)
DONE = LeaseStatus(reclaims=1, returned=2, last_reclaim_s=2.0, target_replicas=2)


def reclaim_history(
    back_on: str,
    indices: list[int],
    *,
    group_healthy: bool = True,
    nodes: tuple[Obj, ...] = (),
    heartbeats: dict[str, float] | None = None,
) -> list[Observation]:
    """recsys lends recsys-1, takes it back, and recsys-1 ends on ``back_on``/``indices``.
    ``nodes``: the Node objects every observation lists (none: no node is Ready, so no group
    can come back whole and stand-ins are judged); ``heartbeats`` at wall time 1000."""
    zero = bound(
        "recsys-0",
        "n1",
        [0, 1],
        namespace=NS,
        priority=Priority.HIGH,
        owner="recsys",
        controller=RECSYS,
    )
    one = bound(
        "recsys-1",
        back_on,
        indices,
        namespace=NS,
        priority=Priority.HIGH,
        owner="recsys",
        controller=RECSYS,
    )
    devices = gpu_nodes(group_healthy=group_healthy)
    seen: dict[str, Any] = {"nodes": nodes, "heartbeats": heartbeats or {}, "wall": 1000.0}
    return [
        Observation(
            0.0, pods=[zero], gpu_nodes=devices, leases=[lease("recsys", NS, LENT), ADS], **seen
        ),
        Observation(
            1.0,
            pods=[zero],
            gpu_nodes=devices,
            leases=[lease("recsys", NS, RECLAIMING), ADS],
            **seen,
        ),
        Observation(
            3.0,
            pods=[zero, one],
            gpu_nodes=gpu_nodes(group_healthy=group_healthy, returned=back_on == "n1"),
            leases=[lease("recsys", NS, DONE), ADS],
            **seen,
        ),
    ]


READY = tuple(node(f"n{i}") for i in range(1, 6))


def test_reclaim_clean_back_on_its_own_devices() -> None:
    assert run(ReclaimEnds(30.0, grace_s=2.0), *reclaim_history("n1", [2, 3])) == []


def test_reclaim_clean_on_standby_stand_ins_of_the_same_type_and_tier() -> None:
    history = reclaim_history("n3", [0, 1], group_healthy=False)
    assert run(ReclaimEnds(30.0, grace_s=2.0), *history) == []


def test_reclaim_catches_a_replica_on_another_jobs_lent_devices() -> None:
    found = run(ReclaimEnds(30.0, grace_s=2.0), *reclaim_history("n2", [0, 1]))
    assert [v.obj for v in found] == ["ml/recsys-1", "ml/recsys-1"]
    assert all("lent by ads/ads group ads-1" in v.message for v in found)


def test_reclaim_catches_a_stand_in_of_a_lower_tier() -> None:
    found = run(ReclaimEnds(30.0, grace_s=2.0), *reclaim_history("n4", [0, 1], group_healthy=False))
    assert len(found) == 2
    assert all("is MA, below the lent HA" in v.message for v in found)


def test_reclaim_catches_an_untagged_stand_in_unless_allowed() -> None:
    history = reclaim_history("n5", [0, 1], group_healthy=False)
    found = run(ReclaimEnds(30.0, grace_s=2.0), *history)
    assert len(found) == 2
    assert all("neither its own lent device nor a standby stand-in" in v.message for v in found)
    assert run(ReclaimEnds(30.0, grace_s=2.0, untagged_stand_ins=True), *history) == []


def test_reclaim_catches_a_stand_in_where_the_group_could_come_back_whole() -> None:
    # Every node Ready, recsys-1's group healthy throughout: it must come back to recsys-1.
    history = reclaim_history("n3", [0, 1], nodes=READY)
    found = run(ReclaimEnds(30.0, grace_s=2.0), *history)
    assert [v.obj for v in found] == ["ml/recsys-1", "ml/recsys-1"]
    assert all("could come back whole" in v.message for v in found)
    assert run(ReclaimEnds(30.0, grace_s=2.0), *reclaim_history("n1", [2, 3], nodes=READY)) == []


def test_reclaim_stand_ins_are_right_where_the_group_could_not_come_back() -> None:
    unhealthy = reclaim_history("n3", [0, 1], group_healthy=False, nodes=READY)
    assert run(ReclaimEnds(30.0, grace_s=2.0), *unhealthy) == []
    n1_down = (node("n1", ready=False), *READY[1:])
    assert run(ReclaimEnds(30.0, grace_s=2.0), *reclaim_history("n3", [0, 1], nodes=n1_down)) == []
    silent = reclaim_history("n3", [0, 1], nodes=READY, heartbeats={"n1": 900.0})
    assert run(ReclaimEnds(30.0, grace_s=2.0, fresh_s=5.0), *silent) == []
    heard = reclaim_history("n3", [0, 1], nodes=READY, heartbeats={"n1": 999.0})
    assert len(run(ReclaimEnds(30.0, grace_s=2.0, fresh_s=5.0), *heard)) == 2
    # recsys-1's group held by an online pod (the owner's own, left running): nothing frees it
    online = bound("web", "n1", [2, 3], namespace=NS, priority=Priority.HIGH, owner="web")
    history = reclaim_history("n3", [0, 1], nodes=READY)
    held = [dataclasses.replace(o, pods=[*o.pods, online]) for o in history[:2]] + history[2:]
    assert run(ReclaimEnds(30.0, grace_s=2.0), *held) == []


def test_reclaim_right_after_an_agent_is_heard_again_may_use_stand_ins() -> None:
    """n1's agent silent before the reclaim, heard again as it starts: the extender offers n1's
    GPUs only at its next liveness sweep, so stand-ins are right within ``settle_s`` of the
    last observation that saw n1 silent, and wrong after it."""
    back = reclaim_history("n3", [0, 1], nodes=READY, heartbeats={"n1": 999.0})
    before = dataclasses.replace(back[0], t=-1.0, heartbeats={"n1": 900.0})  # silent at t=-1
    history = [before, *back]
    assert run(ReclaimEnds(30.0, grace_s=2.0, fresh_s=5.0, settle_s=4.75), *history) == []
    # Without the allowance, or long after: the replica had to come back to its group.
    assert len(run(ReclaimEnds(30.0, grace_s=2.0, fresh_s=5.0), *history)) == 2
    assert len(run(ReclaimEnds(30.0, grace_s=2.0, fresh_s=5.0, settle_s=1.5), *history)) == 2


def test_reclaim_seen_only_by_the_watch_between_two_lists_is_judged() -> None:
    def versioned(status: LeaseStatus, version: int) -> Obj:
        obj = lease("recsys", NS, status)
        obj["metadata"]["resourceVersion"] = str(version)
        return obj

    history = reclaim_history("n2", [0, 1])
    lent, reclaiming, done = (versioned(s, v) for s, v in ((LENT, 5), (RECLAIMING, 6), (DONE, 7)))
    first = Observation(
        0.0, pods=history[0].pods, gpu_nodes=history[0].gpu_nodes, leases=[lent, ADS]
    )
    # The next list shows the reclaim over; the watch saw it begin (and the list's state too).
    second = Observation(
        3.0,
        pods=history[2].pods,
        gpu_nodes=history[2].gpu_nodes,
        leases=[done, ADS],
        lease_history=[reclaiming, done],
    )
    found = run(ReclaimEnds(30.0, grace_s=2.0), first, second)
    assert [v.obj for v in found] == ["ml/recsys-1", "ml/recsys-1"]
    assert all("lent by ads/ads group ads-1" in v.message for v in found)
    assert (
        run(ReclaimEnds(30.0, grace_s=2.0), first, dataclasses.replace(second, lease_history=[]))
        == []
    )


def stuck(degraded: Trouble | None) -> list[Observation]:
    nodes = gpu_nodes()
    return [
        Observation(t, gpu_nodes=nodes, leases=[lease("recsys", NS, RECLAIMING, degraded)])
        for t in (1.0, 20.0, 40.0, 60.0)
    ]


def test_reclaim_catches_one_that_never_ends() -> None:
    found = run(ReclaimEnds(30.0, grace_s=2.0), *stuck(None))
    assert [(v.t, v.obj) for v in found] == [(40.0, "ml/recsys")]
    assert "not Degraded" in found[0].message


def test_reclaim_overdue_but_degraded_with_a_reason_passes() -> None:
    trouble = Trouble("ReclaimOverdue", "the reclaim of recsys-1 is 120 s past the notice")
    assert run(ReclaimEnds(30.0, grace_s=2.0), *stuck(trouble)) == []


def test_reclaim_grace_defaults_to_the_leases() -> None:
    # graceSeconds 45 (the default): 45 + 30 s from t=1 is not passed at t=60.
    assert run(ReclaimEnds(30.0), *stuck(None)) == []


# --- (d) no borrower evicted without its notice ---


def borrower(indices: list[int], **kw: Any) -> Obj:
    return bound("ft", "n1", indices, namespace="tenant", priority=Priority.LOW, **kw)


def deleted(pod: Obj, *, status: LeaseStatus = LENT, node_gone: bool = False) -> list[Observation]:
    """``pod`` seen at t=0, its deletion at t=1, ``status`` the recsys lease's at both."""
    nodes, leases = gpu_nodes(), [lease("recsys", NS, status)]
    gone = [Deletion.of(pod, node_gone=node_gone)]
    return [
        Observation(0.0, pods=[pod], gpu_nodes=nodes, leases=leases),
        Observation(1.0, gpu_nodes=nodes, leases=leases, deletions=gone),
    ]


def test_notice_clean() -> None:
    noticed = borrower([2, 3], annotations={contract.ANN_RECLAIM_NOTICE: "2026-01-01T00:00:02Z"})
    assert run(NoticeBeforeEviction(), *deleted(noticed, status=RECLAIMING)) == []
    assert run(NoticeBeforeEviction(), *deleted(borrower([2, 3]), node_gone=True)) == []
    assert run(NoticeBeforeEviction(), *deleted(borrower([0, 1]))) == []  # untagged devices
    finished = borrower([2, 3], phase="Failed")  # finished on its own, then deleted
    assert run(NoticeBeforeEviction(), *deleted(finished)) == []


def test_notice_catches_a_borrower_evicted_without_one() -> None:
    found = run(NoticeBeforeEviction(), *deleted(borrower([2, 3]), status=RECLAIMING))
    assert [v.obj for v in found] == ["tenant/ft"]
    assert "lent by ml/recsys" in found[0].message


def test_notice_judges_the_last_state_not_a_terminal_phase_the_kubelet_wrote() -> None:
    pod = borrower([2, 3])
    gone = borrower([2, 3], phase="Failed")  # evicted: the kubelet ends it, then it is removed
    history = deleted(pod, status=RECLAIMING)
    history[1] = Observation(1.0, gpu_nodes=gpu_nodes(), deletions=[Deletion.of(gone)])
    assert len(run(NoticeBeforeEviction(), *history)) == 1


def test_notice_scheduler_preemption_is_no_reclaim_unless_the_owner_reclaims() -> None:
    pod = borrower([2, 3])
    pod["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    ]
    assert run(NoticeBeforeEviction(), *deleted(pod)) == []
    assert len(run(NoticeBeforeEviction(), *deleted(pod, status=RECLAIMING))) == 1


def test_notice_a_gang_broken_is_no_reclaim_unless_the_owner_reclaims() -> None:
    """The gang controller evicts the rest of a gang one of whose members went: a member on
    another job's lent devices goes without a notice, and that is no reclaim (the soak's hour:
    gang-0057-0 on online-1's lent devices, its mate preempted elsewhere); while the lender
    reclaims, a member evicted without its notice is still one. A borrower alone evicted so
    is not exempt."""
    pod = member(borrower([2, 3]))
    pod["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    assert run(NoticeBeforeEviction(), *deleted(pod)) == []
    assert len(run(NoticeBeforeEviction(), *deleted(pod, status=RECLAIMING))) == 1
    alone = borrower([2, 3])
    alone["status"]["conditions"] = pod["status"]["conditions"]
    assert len(run(NoticeBeforeEviction(), *deleted(alone))) == 1


def test_notice_a_gang_that_lost_a_member_with_its_node_is_no_reclaim() -> None:
    """A member lost with its node (pod GC deletes it) breaks the gang; the gang controller
    evicts the rest at once, whatever their lenders do (the hour: two members evicted in the
    second their lender began to reclaim). A mate evicted without that loss still counts."""
    lost = member(bound("g-0", "n2", [0, 1], namespace="tenant", priority=Priority.LOW))
    lost["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}
    ]
    mate = member(borrower([2, 3]))
    mate["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    history = deleted(mate, status=RECLAIMING)
    history[1] = dataclasses.replace(
        history[1], deletions=[Deletion.of(lost), *history[1].deletions]
    )
    assert run(NoticeBeforeEviction(), *history) == []
    assert len(run(NoticeBeforeEviction(), *deleted(mate, status=RECLAIMING))) == 1


# --- (e) no pod Pending beyond a bound while devices it may use are free ---


def waiting(**kw: Any) -> Obj:
    return builders.pod("wait", 2, **kw)


def pending(pod: Obj, times: tuple[float, ...] = (0.0, 5.0, 11.0), **kw: Any) -> list[Observation]:
    obs: dict[str, Any] = {
        "gpu_nodes": [builders.gpu_node("n1", builders.devices("n1", 4))],
        "nodes": [node("n1")],
    }
    also = kw.pop("pods_also", None)
    obs.update(kw)
    return [Observation(t, pods=[pod, *([also] if also else [])], **obs) for t in times]


def test_pending_clean() -> None:
    checker = PendingWhileFree(10.0)
    placed = bound("wait", "n1", [0, 1])
    history = pending(waiting(), (0.0, 5.0)) + pending(placed, (11.0,))
    assert run(checker, *history) == []
    gated = waiting()
    gated["spec"]["schedulingGates"] = [{"name": contract.SCHEDULING_GATE}]
    assert run(PendingWhileFree(10.0), *pending(gated)) == []
    assert run(PendingWhileFree(10.0), *pending(waiting(), nodes=[node("n1", ready=False)])) == []
    assert run(PendingWhileFree(10.0), *pending(waiting(gpu_type="A100"))) == []
    taint = {"key": "gpu", "value": "x", "effect": "NoSchedule"}
    assert (
        run(PendingWhileFree(10.0), *pending(waiting(), nodes=[node("n1", taints=[taint])])) == []
    )
    lent = [builders.gpu_node("n1", builders.devices("n1", 4, owner="ml/recsys"))]
    assert run(PendingWhileFree(10.0), *pending(waiting(), gpu_nodes=lent)) == []
    others = [bound("x", "n1", [0, 1]), bound("y", "n1", [2])]
    full = [ledger("n1", *others)]
    assert run(PendingWhileFree(10.0), *pending(waiting(), ledgers=full)) == []
    # A gang's member waits for the gang (judged by gang-whole).
    assert run(PendingWhileFree(10.0), *pending(member(waiting()))) == []


def test_pending_catches_a_pod_waiting_beside_free_devices() -> None:
    found = run(PendingWhileFree(10.0), *pending(waiting()))
    assert [(v.t, v.obj) for v in found] == [(11.0, "default/wait")]
    assert "n1 has enough free GPUs" in found[0].message


def test_pending_counts_only_an_unbroken_run() -> None:
    busy = [ledger("n1", bound("x", "n1", [0, 1, 2]))]
    free = pending(waiting(), (0.0,)) + pending(waiting(), (5.0,), ledgers=busy)
    later = pending(waiting(), (6.0, 15.0, 16.0))
    found = run(PendingWhileFree(10.0), *free, *later)
    assert [v.t for v in found] == [16.0]


def test_pending_leaves_out_a_node_whose_agent_is_silent() -> None:
    def beat(age_s: float) -> dict[str, Any]:
        return {"heartbeats": {"n1": 1000.0 - age_s}, "wall": 1000.0}

    assert run(PendingWhileFree(10.0, fresh_s=5.0), *pending(waiting(), **beat(30.0))) == []
    found = run(PendingWhileFree(10.0, fresh_s=5.0), *pending(waiting(), **beat(2.0)))
    assert [v.obj for v in found] == ["default/wait"]


def test_pending_leaves_room_a_nomination_holds() -> None:
    """A gang member waiting at kube-scheduler's Permit holds its node's GPUs in the scheduler's
    cache, with no ledger entry, and is nominated for the node: its GPUs are not room. (The
    seed-7 hour met it: two members nominated for the node beside the pod judged.) The pod's
    own nomination is room for itself."""
    at_permit = member(builders.pod("mate", 3))  # n1 has 4: 1 left beside it
    at_permit["spec"].pop("nodeName", None)
    at_permit["status"] = {"phase": "Pending", "nominatedNodeName": "n1"}
    both = pending(waiting(), pods_also=at_permit)
    assert run(PendingWhileFree(10.0), *both) == []
    elsewhere = {**at_permit, "status": {"phase": "Pending", "nominatedNodeName": "n9"}}
    assert len(run(PendingWhileFree(10.0), *pending(waiting(), pods_also=elsewhere))) == 1
    itself = waiting()
    itself["status"] = {"phase": "Pending", "nominatedNodeName": "n1"}
    assert len(run(PendingWhileFree(10.0), *pending(itself))) == 1


# --- (f) the shared queues release what they must ---


def queued(name: str = "wait", job_class: str | None = None, gpus: int = 2) -> Obj:
    extra = {contract.ANN_JOB_CLASS: job_class} if job_class else None
    pod = builders.pod(name, gpus, extra_annotations=extra)
    pod["spec"]["schedulingGates"] = [{"name": contract.SCHEDULING_GATE}]
    return pod


def held(*pods: Obj, times: tuple[float, ...] = (0.0, 5.0, 11.0), **kw: Any) -> list[Observation]:
    return [dataclasses.replace(o, pods=list(pods)) for o in pending(pods[0], times, **kw)]


def test_queued_clean() -> None:
    released = waiting()  # its gate removed: PendingWhileFree's from here
    history = held(queued(), times=(0.0, 5.0)) + held(released, times=(11.0,))
    assert run(QueuedReleased(10.0), *history) == []
    busy = [ledger("n1", bound("x", "n1", [0, 1, 2]))]
    assert run(QueuedReleased(10.0), *held(queued(), ledgers=busy)) == []  # no room: it waits
    # Two held: the one ahead keeps the room (the queues' order), neither is judged.
    assert run(QueuedReleased(10.0), *held(queued("a"), queued("b"))) == []
    other_gate = queued("interactive")
    other_gate["spec"]["schedulingGates"].append({"name": "example.com/other"})
    assert run(QueuedReleased(10.0), *held(other_gate)) == []  # someone else's gate holds it


def test_queued_catches_an_interactive_pod_never_released() -> None:
    busy = [ledger("n1", bound("x", "n1", [0, 1, 2, 3]))]
    pods = (queued("chat", "interactive"), queued("b"))
    found = run(QueuedReleased(10.0), *held(*pods, ledgers=busy))  # released, room or not
    assert [(v.t, v.obj) for v in found] == [(11.0, "default/chat")]
    assert "interactive" in found[0].message


def test_queued_catches_a_lone_pod_held_beside_room() -> None:
    found = run(QueuedReleased(10.0), *held(queued("b", "batch")))
    assert [(v.t, v.obj) for v in found] == [(11.0, "default/b")]
    assert "n1 has room" in found[0].message
    assert run(PendingWhileFree(10.0), *held(queued("b", "batch"))) == []  # gated: not its


# --- (g) no leak trend ---


def samples(rss: list[int], fds: list[int], step_s: float = 60.0) -> list[Observation]:
    return [
        Observation(i * step_s, processes={"extender": ProcessSample(r, f)})
        for i, (r, f) in enumerate(zip(rss, fds, strict=True))
    ]


def test_slope_per_hour() -> None:
    assert slope_per_hour([(0.0, 5.0), (1800.0, 10.0), (3600.0, 15.0)]) == pytest.approx(10.0)
    assert slope_per_hour([(0.0, 5.0)]) == 0.0


def test_leak_clean_flat_with_noise_and_a_warm_up() -> None:
    rss = [100 << 20, 180 << 20] + [(200 << 20) + (1 << 20) * (i % 3) for i in range(60)]
    found = run(
        LeakTrend(rss_bytes_per_hour=16 << 20, fds_per_hour=5, warmup_s=120.0),
        *samples(rss, [40 + i % 2 for i in range(62)]),
    )
    assert found == []


def test_leak_catches_a_steadily_rising_rss_and_fds() -> None:
    rss = [(200 << 20) + i * (1 << 20) for i in range(60)]  # 1 MiB a minute: 60 MiB/h
    found = run(
        LeakTrend(rss_bytes_per_hour=16 << 20, fds_per_hour=5),
        *samples(rss, [40 + i for i in range(60)]),
    )
    assert [v.obj for v in found] == ["extender", "extender"]
    assert "RSS grows 60.0 MiB/h" in found[0].message
    assert "open fds grow 60.0/h" in found[1].message


def test_leak_not_judged_over_a_short_span() -> None:
    rss = [(200 << 20) + i * (1 << 20) for i in range(5)]
    checker = LeakTrend(rss_bytes_per_hour=16 << 20, fds_per_hour=5, min_span_s=3600.0)
    assert run(checker, *samples(rss, [40] * 5)) == []


# --- all of them over a clean stretch ---


def test_all_checkers_pass_a_clean_reclaim() -> None:
    checkers: list[Checker] = [
        NoDoubleHold(),
        LedgerMatchesPods(settle_s=5.0),
        ReclaimEnds(30.0, grace_s=2.0),
        NoticeBeforeEviction(),
        PendingWhileFree(10.0),
    ]
    history = reclaim_history("n1", [2, 3])
    with_ledgers = [
        Observation(
            o.t,
            pods=o.pods,
            gpu_nodes=o.gpu_nodes,
            leases=o.leases,
            nodes=[node(n) for n in ("n1", "n2", "n3", "n4", "n5")],
            ledgers=[ledger("n1", *o.pods)],
        )
        for o in history
    ]
    assert check_history(checkers, with_ledgers) == []


# --- (g) a gang holds devices whole or not at all ---


def member(pod: Obj, gang: str = "sweep", size: int = 2) -> Obj:
    pod["spec"]["workloadRef"] = {"name": gang, "podGroup": "workers"}
    pod["metadata"].setdefault("labels", {})[GANG_SIZE_LABEL] = str(size)
    return pod


def gang_history(*states: tuple[float, list[Obj]]) -> list[Observation]:
    return [Observation(t, pods=pods) for t, pods in states]


def test_gang_whole_clean_placed_together_and_gone_together() -> None:
    a, b = member(bound("a", "n1", [0])), member(bound("b", "n2", [0]))
    pa, pb = member(builders.pod("a", 1)), member(builders.pod("b", 1))
    history = gang_history(
        (0.0, [pa, pb]),  # both waiting
        (30.0, [pa, pb]),
        (31.0, [a, pb]),  # bound a moment apart
        (32.0, [a, b]),
        (90.0, [a, b]),
        (91.0, [a]),  # one evicted, the other a moment later
        (95.0, []),
    )
    assert run(GangWhole(10.0), *history) == []
    # A pod in no gang, or of a gang without its size, is not judged.
    assert run(GangWhole(10.0), *gang_history((0.0, [bound("c", "n1", [1])]), (20.0, []))) == []


def test_gang_whole_catches_a_member_left_running_after_the_other_went() -> None:
    a, b = member(bound("a", "n1", [0])), member(bound("b", "n2", [0]))
    gone = dict(b, metadata={**b["metadata"], "deletionTimestamp": "2026-11-29T04:00:00Z"})
    history = gang_history((0.0, [a, b]), (5.0, [a, gone]), (10.0, [a]), (16.0, [a]))
    found = run(GangWhole(10.0), *history)
    assert [(v.t, v.obj) for v in found] == [(16.0, "default/workload/sweep/workers")]
    assert "1 of its 2 members hold devices: default/a" in found[0].message


def test_gang_whole_catches_a_gang_placed_in_part() -> None:
    a, pb = member(bound("a", "n1", [0])), member(builders.pod("b", 1))
    found = run(GangWhole(10.0), *gang_history((0.0, [a, pb]), (11.0, [a, pb])))
    assert len(found) == 1


# --- prewarm-recovers ---

NO_ROOM = (
    "no space for checkpoints/job.step-2: needs 8388608 bytes, 0 free on /cache's filesystem, "
    "4194304 kept in reserve (evicting what the cache may evict would not make room)"
)


def prewarming(
    name: str, state: str, reason: str, *, not_before: float = 1000.0, item: str = "job.step-2"
) -> Obj:
    """GpuNode ``name`` asked to prewarm a checkpoint from ``not_before`` (epoch seconds), its
    agent reporting the item ``state`` for ``reason``."""
    directive = Directive(
        lease="online/job",
        role="Lent",
        images=(),
        checkpoints=(item,),
        not_before=not_before,
        deadline=not_before + 5,
        window_s=5.0,
    )
    status = ItemStatus("online/job", "checkpoint", item, state, reason)  # type: ignore[arg-type]
    return {
        "metadata": {"name": name},
        "spec": {"prewarm": [directive.to_json()]},
        "status": {"prewarm": {"items": [status.to_json()]}},
    }


def test_prewarm_recovers_excuses_no_space_while_the_disk_is_full_and_a_settle_after() -> None:
    c = PrewarmRecovers(bound_s=120.0, settle_s=30.0)
    full = frozenset({"real-0"})
    pending = prewarming("real-0", "Pending", "fetching")
    failing = prewarming("real-0", "Pending", f"attempt 1 failed: {NO_ROOM}; retrying in 15 s")
    failed = prewarming("real-0", "Failed", NO_ROOM)
    history = [
        Observation(t=1.0, gpu_nodes=[pending], wall=1001.0, full_disks=full),
        Observation(t=2.0, gpu_nodes=[failing], wall=1002.0, full_disks=full),
        Observation(t=20.0, gpu_nodes=[failing], wall=1020.0),  # the disk freed at t=3
        Observation(t=31.0, gpu_nodes=[failed], wall=1031.0),  # the last attempt: 28 s after
        # The Failed report stays up: it is about that attempt, not the disk as it is now (the
        # first hour of seed 7 reported it again 30 s after the disk had room).
        Observation(t=90.0, gpu_nodes=[failed], wall=1090.0),
    ]
    assert check_history([c], history) == []


def test_prewarm_recovers_sees_a_cache_that_stays_full_after_the_disk_has_room() -> None:
    """The ``sticky-full`` mutation's history: the disk had room again at t=3, and at the next
    scale-up, minutes later, the agent still fails for want of space."""
    c = PrewarmRecovers(bound_s=120.0, settle_s=30.0)
    full = frozenset({"real-0"})
    history = [
        Observation(t=2.0, gpu_nodes=[prewarming("real-0", "Failed", NO_ROOM)], full_disks=full),
        Observation(
            t=200.0, gpu_nodes=[prewarming("real-0", "Failed", NO_ROOM, item="job.step-3")]
        ),
    ]
    found = check_history([c], history)
    assert [(v.checker, v.obj) for v in found] == [("prewarm-recovers", "/real-0")]
    assert "last full at t=2.0" in found[0].message
    # A node whose disk was never full may not fail for want of space at all; once per reason.
    c = PrewarmRecovers(bound_s=120.0, settle_s=30.0)
    never = [Observation(t=t, gpu_nodes=[prewarming("kwok-0", "Failed", NO_ROOM)]) for t in (1, 2)]
    found = check_history([c], never)
    assert len(found) == 1
    assert "never full" in found[0].message
    # Other failures (a peer away) are not this checker's.
    c = PrewarmRecovers(bound_s=120.0, settle_s=30.0)
    other = prewarming("kwok-0", "Failed", "no peer holds checkpoints/job.step-2")
    assert check_history([c], [Observation(t=1.0, gpu_nodes=[other])]) == []


def test_prewarm_recovers_sees_an_item_pending_past_its_bound() -> None:
    c = PrewarmRecovers(bound_s=120.0, settle_s=30.0)
    stuck = prewarming("real-0", "Pending", "fetching", not_before=1000.0)
    done = prewarming("real-0", "Done", "pulled", not_before=1000.0)
    ok = [Observation(t=1.0, gpu_nodes=[stuck], wall=1119.0), Observation(t=2, gpu_nodes=[done])]
    assert check_history([c], ok) == []
    # A directive first seen after its notBefore is due from then.
    c = PrewarmRecovers(bound_s=120.0, settle_s=30.0)
    seen_late = [Observation(t=1.0, gpu_nodes=[stuck], wall=w) for w in (1500.0, 1600.0)]
    assert check_history([c], seen_late) == []
    c = PrewarmRecovers(bound_s=120.0, settle_s=30.0)
    late = [Observation(t=float(i), gpu_nodes=[stuck], wall=1000.0 + 60 * i) for i in (0, 1, 2, 3)]
    found = check_history([c], late)
    assert len(found) == 1
    assert "still Pending 180 s after it was due" in found[0].message
