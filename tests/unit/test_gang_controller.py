"""The gang controller's rule: once a member of a borrower gang is disrupted, the rest of the
gang that existed then goes (extender.gangs)."""

from __future__ import annotations

from typing import Any

from common import builders, contract
from common.gangs import parse_time
from common.model import Priority
from extender.gangs.controller import Gangs
from extender.gangs.policy import breaks, member_of

T0 = "2026-11-29T03:00:00Z"
DISRUPTED = "2026-11-29T04:00:00Z"
LATER = "2026-11-29T04:00:05Z"


def pod(
    name: str,
    *,
    namespace: str = "ml",
    node: str = "n1",
    group: str | None = "sweep",
    created: str = T0,
    priority: Priority = Priority.LOW,
) -> dict[str, Any]:
    obj = builders.pod(
        name,
        4,
        namespace=namespace,
        uid=f"{namespace}-{name}-{created}",
        priority=priority,
        node_name=node or None,
    )
    if group is not None:
        obj["metadata"]["annotations"][contract.ANN_POD_GROUP] = group
    obj["metadata"]["creationTimestamp"] = created
    return obj


def disrupted(obj: dict[str, Any], reason: str = "PreemptionByScheduler") -> dict[str, Any]:
    out = {**obj, "metadata": {**obj["metadata"]}, "status": {**obj.get("status", {})}}
    out["status"]["conditions"] = [
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "lastTransitionTime": DISRUPTED,
        }
    ]
    return out


def terminating(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "deletionTimestamp": DISRUPTED}}


NOW = parse_time(LATER) or 0.0  # the tests' clock: after every disruption


def names(gangs: Gangs, gang: str, now: float = NOW) -> list[str]:
    return [m.name for m in gangs.to_evict(gang, now)]


def test_a_disrupted_member_that_goes_takes_the_rest_of_its_gang() -> None:
    gangs = Gangs()
    a, b = pod("sweep-0"), pod("sweep-1", node="n2")
    unbound = pod("sweep-2", node="")
    online = pod("sweep-3", priority=Priority.HIGH)
    done = pod("sweep-4")
    done["status"]["phase"] = "Succeeded"
    stranger = pod("sweep-1", namespace="other")  # same group name, another namespace
    lone = pod("lone", group=None)
    for p in (a, b, unbound, online, done, stranger, lone):
        assert gangs.apply("ADDED", p, NOW) is None
    gang = "ml/pod-group/sweep"
    # Marked (kube-scheduler sets the condition first): not gone yet, nothing to do.
    assert gangs.apply("MODIFIED", disrupted(a), NOW) is None
    # Deleted with it: the member on n2 goes, nobody else.
    assert gangs.apply("DELETED", disrupted(a), NOW) == gang
    assert names(gangs, gang) == ["sweep-1"]
    assert names(gangs, "other/pod-group/sweep") == []
    # Once evicted (terminating), it is not evicted again.
    assert gangs.apply("MODIFIED", terminating(disrupted(b, "EvictionByEvictionAPI")), NOW) is None
    assert names(gangs, gang) == []


def test_a_member_preempted_in_the_second_it_was_made_still_takes_its_mates() -> None:
    """kube-scheduler may preempt a member within a second of the gang's creation (CI did):
    the mate made in that same second was there at the break, so it goes; a pod of a new
    attempt made in that second, seen after the break, stays."""
    gangs = Gangs()
    a, b = pod("sweep-0", created=DISRUPTED), pod("sweep-1", node="n2", created=DISRUPTED)
    gangs.apply("ADDED", a, NOW)
    gangs.apply("ADDED", b, NOW)
    assert gangs.apply("DELETED", disrupted(a), NOW) == "ml/pod-group/sweep"
    assert names(gangs, "ml/pod-group/sweep") == ["sweep-1"]
    again = pod("sweep-0", created=DISRUPTED)
    again["metadata"]["uid"] = "attempt-2"
    gangs.apply("ADDED", again, NOW)
    assert names(gangs, "ml/pod-group/sweep") == ["sweep-1"]


def test_a_tenant_of_another_namespace_cannot_break_a_gang_by_naming_it() -> None:
    """A tenant with the edit role in its own namespace names the same pod group (and the
    same Workload) as ml's gang and has its pod disrupted: ml's members stay; its own gang is
    its namespace's alone."""
    gangs = Gangs()
    a, b = pod("sweep-0"), pod("sweep-1", node="n2")
    intruder = pod("sweep-0", namespace="other")
    for p in (a, b, intruder):
        gangs.apply("ADDED", p, NOW)
    assert gangs.apply("DELETED", disrupted(intruder), NOW) is None
    assert names(gangs, "ml/pod-group/sweep") == []
    assert gangs.broken.keys() == set()


def test_a_gang_started_again_after_the_disruption_is_a_new_attempt() -> None:
    gangs = Gangs()
    a = pod("sweep-0")
    gangs.apply("ADDED", a, NOW)
    gangs.apply("DELETED", disrupted(a), NOW)
    # The job's controller makes the gang again: its pods stay.
    assert gangs.apply("ADDED", pod("sweep-0", created=LATER), NOW) is None
    assert gangs.apply("ADDED", pod("sweep-1", created=LATER, node="n2"), NOW) is None
    assert names(gangs, "ml/pod-group/sweep") == []


def test_members_with_a_reclaim_notice_go_at_its_time_not_before() -> None:
    """A reclaim notices a gang whole and evicts it at the notice's time, one member after the
    other: the first one gone does not make this rule evict the others sooner. But a reclaim
    that ends before that time (kube-scheduler preempted the member on the lent devices) evicts
    no more: at the notice's time this rule evicts the rest (the soak found a member left
    holding its GPUs, its mates gone)."""
    gangs = Gangs()
    notice = "2026-11-29T04:00:30Z"
    due = parse_time(notice) or 0.0
    a, b, c = pod("sweep-0"), pod("sweep-1", node="n2"), pod("sweep-2", node="n3")
    for p in (a, b):
        p["metadata"]["annotations"][contract.ANN_RECLAIM_NOTICE] = notice
    for p in (a, b, c):
        gangs.apply("ADDED", p, NOW)
    gang = "ml/pod-group/sweep"
    # The one without a notice goes at once; the noticed one is due at its notice's time.
    assert gangs.apply("DELETED", disrupted(a, "PreemptionByScheduler"), NOW) == gang
    assert names(gangs, gang) == ["sweep-2"]
    assert gangs.next_notice(gang, NOW) == due
    assert names(gangs, gang, due - 1) == ["sweep-2"]
    assert names(gangs, gang, due) == ["sweep-1", "sweep-2"]
    assert gangs.next_notice(gang, due) is None
    # A notice that does not parse is due at once.
    d = pod("other-0")
    d["metadata"]["annotations"][contract.ANN_POD_GROUP] = "other"
    e = pod("other-1", node="n2")
    e["metadata"]["annotations"][contract.ANN_POD_GROUP] = "other"
    e["metadata"]["annotations"][contract.ANN_RECLAIM_NOTICE] = "soon"
    gangs.apply("ADDED", d, NOW)
    gangs.apply("ADDED", e, NOW)
    assert gangs.apply("DELETED", disrupted(d), NOW) == "ml/pod-group/other"
    assert names(gangs, "ml/pod-group/other") == ["other-1"]


def test_noticed_members_of_a_broken_gang_bring_its_key_back_at_their_time() -> None:
    """Only noticed members left: the gang is still handed to the loop (which requeues it for
    the notice's time), not forgotten."""
    gangs = Gangs()
    a, b = pod("sweep-0"), pod("sweep-1", node="n2")
    b["metadata"]["annotations"][contract.ANN_RECLAIM_NOTICE] = "2026-11-29T04:00:30Z"
    gangs.apply("ADDED", a, NOW)
    gangs.apply("ADDED", b, NOW)
    assert gangs.apply("DELETED", disrupted(a), NOW) == "ml/pod-group/sweep"
    assert names(gangs, "ml/pod-group/sweep") == []


def test_a_member_that_ends_without_a_disruption_breaks_nothing() -> None:
    gangs = Gangs()
    a, b = pod("sweep-0"), pod("sweep-1", node="n2")
    gangs.apply("ADDED", a, NOW)
    gangs.apply("ADDED", b, NOW)
    assert gangs.apply("MODIFIED", terminating(a), NOW) is None  # its own controller deleted it
    assert gangs.apply("DELETED", a, NOW) is None
    assert names(gangs, "ml/pod-group/sweep") == []
    member = member_of(disrupted(b))
    assert member is not None
    assert not breaks(member, deleted=False)
    assert breaks(member, deleted=True)


def test_the_last_member_gone_forgets_the_gang() -> None:
    gangs = Gangs()
    a, b = pod("sweep-0"), pod("sweep-1", node="n2")
    gangs.apply("ADDED", a, NOW)
    gangs.apply("ADDED", b, NOW)
    gangs.apply("DELETED", disrupted(a), NOW)
    gangs.apply("DELETED", terminating(disrupted(b, "EvictionByEvictionAPI")), NOW)
    assert gangs.members == {}
    assert gangs.broken == {}
