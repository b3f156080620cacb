"""The filter decision over a cluster view: fit, preemption hints, standby kept for last."""

from __future__ import annotations

from common import builders
from common.model import NodeName, Priority, Tier
from common.podrequest import parse_pod
from extender.scheduler.filtering import (
    NO_INVENTORY,
    RECLAIM_OWN_FIRST,
    STANDBY_ELSEWHERE,
    STANDBY_KEPT,
    filter_nodes,
)
from extender.scheduler.placement import Verdict, pick_devices
from tests.unit.cluster import allocate, as_reclaim, cluster, holder

BEING = Verdict.BEING_RECLAIMED.value

U = builders.device_uuid


def test_unknown_nodes_are_unresolvable() -> None:
    d = filter_nodes(cluster(), parse_pod(builders.pod("p", 1)), ["ghost"])
    assert d.unresolvable == {"ghost": NO_INVENTORY}
    assert d.passed == []


def test_pod_without_gpus_passes_everywhere() -> None:
    d = filter_nodes(cluster(), parse_pod(builders.pod("p", 0)), ["a", "b"])
    assert d.passed == ["a", "b"]


def test_high_priority_a_never_lands_on_b_tags() -> None:
    state = cluster(
        builders.gpu_node("b-lent", builders.devices("b-lent", 8, owner="b")),
        builders.gpu_node("a-lent", builders.devices("a-lent", 8, owner="a")),
    )
    pod = builders.pod("p", 2, priority=Priority.HIGH, owner="a", pod_priority=100)
    d = filter_nodes(state, parse_pod(pod), ["b-lent", "a-lent"])
    assert d.passed == ["a-lent"]
    assert "another job" in d.unresolvable["b-lent"]


def test_low_priority_borrows_tagged_devices() -> None:
    state = cluster(builders.gpu_node("lent", builders.devices("lent", 8, owner="b")))
    assert filter_nodes(state, parse_pod(builders.pod("p", 8)), ["lent"]).passed == ["lent"]


def test_occupied_by_borrowers_is_resolvable_by_preemption() -> None:
    state = cluster(builders.gpu_node("n", builders.devices("n", 8, owner="a")))
    allocate(state, "n", [(holder("borrower"), [U("n", i) for i in range(8)])])
    owner = builders.pod("o", 4, priority=Priority.HIGH, owner="a", pod_priority=1000)
    d = filter_nodes(state, parse_pod(owner), ["n"])
    assert list(d.failed) == ["n"]
    other = builders.pod("x", 4, priority=Priority.HIGH, owner="x", pod_priority=1000)
    assert list(filter_nodes(state, parse_pod(other), ["n"]).unresolvable) == ["n"]


def test_reclaim_prefers_lent_devices_over_standby() -> None:
    state = cluster(
        builders.gpu_node("lent", builders.devices("lent", 4, owner="a")),
        builders.gpu_node("standby", builders.devices("standby", 4, standby=True)),
    )
    allocate(state, "lent", [(holder("borrower"), [U("lent", i) for i in range(4)])])
    pod = builders.pod(
        "o", 4, priority=Priority.HIGH, owner="a", reclaim=True, pod_priority=1000, tier=Tier.HA
    )
    d = filter_nodes(state, as_reclaim(pod), ["lent", "standby"])
    assert d.passed == []
    assert list(d.failed) == ["lent"]  # kube-scheduler preempts the borrower there
    assert d.unresolvable["standby"] == STANDBY_KEPT


def test_reclaim_backfills_from_standby_when_lent_devices_cannot_return() -> None:
    lent = builders.devices("lent", 3, owner="a") + builders.devices(
        "lent", 1, owner="a", healthy=False, start=3
    )
    state = cluster(
        builders.gpu_node("lent", lent),
        builders.gpu_node("standby", builders.devices("standby", 4, standby=True)),
        builders.gpu_node(
            "standby-ma", builders.devices("standby-ma", 4, standby=True, tier=Tier.MA)
        ),
    )
    pod = builders.pod(
        "o", 4, priority=Priority.HIGH, owner="a", reclaim=True, pod_priority=1000, tier=Tier.HA
    )
    d = filter_nodes(state, as_reclaim(pod), ["lent", "standby", "standby-ma"])
    assert d.passed == ["standby"]
    assert "below the required reliability tier" in d.unresolvable["standby-ma"]


def test_reclaim_takes_standby_before_evicting_borrowers_of_other_devices() -> None:
    """Algorithm 1: a reclaim's usable devices are the free ones and its own lent ones; room
    made by evicting borrowers of untagged devices is not reclaiming, standby comes first."""
    state = cluster(
        builders.gpu_node("busy", builders.devices("busy", 4)),
        builders.gpu_node("standby", builders.devices("standby", 4, standby=True)),
    )
    allocate(state, "busy", [(holder("borrower"), [U("busy", i) for i in range(4)])])
    pod = builders.pod("o", 4, priority=Priority.HIGH, owner="a", reclaim=True, pod_priority=1000)
    d = filter_nodes(state, as_reclaim(pod), ["busy", "standby"])
    assert d.passed == ["standby"]
    # Borrowers of the owner's own lent devices are reclaimed before standby is spent.
    state = cluster(
        builders.gpu_node("lent", builders.devices("lent", 4, owner="a")),
        builders.gpu_node("busy", builders.devices("busy", 4)),
        builders.gpu_node("standby", builders.devices("standby", 4, standby=True)),
    )
    allocate(state, "lent", [(holder("b1"), [U("lent", i) for i in range(4)])])
    allocate(state, "busy", [(holder("b2"), [U("busy", i) for i in range(4)])])
    d = filter_nodes(state, as_reclaim(pod), ["lent", "busy", "standby"])
    assert (d.passed, list(d.failed)) == ([], ["lent"])
    assert d.unresolvable["busy"] == RECLAIM_OWN_FIRST
    assert d.unresolvable["standby"] == STANDBY_KEPT


def test_a_stand_in_takes_the_node_with_the_most_standby_devices_of_the_best_tiers() -> None:
    state = cluster(
        builders.gpu_node(
            "mixed",
            builders.devices("mixed", 2, standby=True) + builders.devices("mixed", 2, start=2),
        ),
        builders.gpu_node("ma", builders.devices("ma", 4, standby=True, tier=Tier.MA)),
        builders.gpu_node("ha", builders.devices("ha", 4, standby=True)),
    )
    busy = [(holder(f"b{i}"), [U("busy", i)]) for i in range(4)]
    state.apply_gpu_node("ADDED", builders.gpu_node("busy", builders.devices("busy", 4)))
    allocate(state, "busy", busy)
    pod = builders.pod("o", 4, priority=Priority.HIGH, owner="a", reclaim=True, pod_priority=1000)
    d = filter_nodes(state, as_reclaim(pod), ["mixed", "ma", "ha", "busy"])
    assert d.passed == ["ha"]
    assert d.unresolvable["ma"] == STANDBY_ELSEWHERE
    assert d.unresolvable["mixed"] == STANDBY_ELSEWHERE


def lease(node: str, renewed: str) -> dict:
    return {
        "metadata": {"name": f"tidelease-agent-{node}", "namespace": "tidelease-system"},
        "spec": {"holderIdentity": node, "renewTime": renewed, "leaseDurationSeconds": 60},
    }


def test_silent_agent_node_is_not_offered_until_it_renews() -> None:
    from datetime import datetime

    from extender.scheduler.filtering import AGENT_SILENT

    state = cluster(builders.gpu_node("a"), builders.gpu_node("b"))
    t0 = datetime.fromisoformat("2026-11-21T10:00:00.000000Z").timestamp()
    state.apply_lease("ADDED", lease("a", "2026-11-21T10:00:00.000000Z"))
    pod = parse_pod(builders.pod("p", 1))
    assert state.sweep(t0 + 60, 60) == []  # exactly the timeout: still fine
    assert filter_nodes(state, pod, ["a", "b"]).passed == ["a", "b"]
    assert state.sweep(t0 + 61, 60) == ["a"]
    d = filter_nodes(state, pod, ["a", "b"])
    assert d.passed == ["b"]  # b has no Lease: not judged
    assert d.unresolvable == {"a": AGENT_SILENT}
    state.apply_lease("MODIFIED", lease("a", "2026-11-21T10:01:05.000000Z"))
    assert state.sweep(t0 + 66, 60) == ["a"]
    assert filter_nodes(state, pod, ["a", "b"]).passed == ["a", "b"]
    state.sweep(t0 + 1000, 60)
    state.apply_lease("DELETED", lease("a", "2026-11-21T10:01:05.000000Z"))
    assert filter_nodes(state, pod, ["a"]).passed == ["a"]


def test_reclaim_goes_back_to_its_own_lent_devices() -> None:
    from extender.scheduler.filtering import LENT_ELSEWHERE

    state = cluster(
        builders.gpu_node("free", checkpoints=["ck"]),  # untagged, caches the checkpoint
        builders.gpu_node("lent", builders.devices("lent", 4, owner="a")),
        builders.gpu_node(
            "half", builders.devices("half", 2, owner="a") + builders.devices("half", 2, start=2)
        ),
    )
    pod = builders.pod(
        "o", 4, priority=Priority.HIGH, owner="a", reclaim=True, pod_priority=1000, checkpoint="ck"
    )
    d = filter_nodes(state, as_reclaim(pod), ["free", "lent", "half"])
    assert d.passed == ["lent"]
    assert d.unresolvable == {"free": LENT_ELSEWHERE, "half": LENT_ELSEWHERE}
    # Without a reclaim, the same pod may go anywhere it fits.
    plain = builders.pod("o", 4, priority=Priority.HIGH, owner="a", pod_priority=1000)
    assert filter_nodes(state, parse_pod(plain), ["free", "lent", "half"]).passed == [
        "free",
        "lent",
        "half",
    ]


def test_a_reclaiming_lease_makes_the_owners_pods_reclaims() -> None:
    state = cluster(builders.gpu_node("s", builders.devices("s", 4, standby=True)))
    replica = ("StatefulSet", "a")
    pod = parse_pod(
        builders.pod("o", 4, priority=Priority.HIGH, owner="a", pod_priority=9, controller=replica)
    )
    assert filter_nodes(state, state.with_reclaim(pod), ["s"]).passed == []
    lease = {
        "metadata": {"namespace": "default", "name": "a"},
        "spec": {"owner": "a", "workload": {"kind": "StatefulSet", "name": "a"}},
        "status": {"phase": "Reclaiming"},
    }
    state.apply_gpu_lease("MODIFIED", lease)
    assert state.with_reclaim(pod).reclaim
    # A pod of the job that is not one of the workload's replicas takes nothing back (nor the
    # standby pool), whatever it declares.
    stray = builders.pod("s", 4, priority=Priority.HIGH, owner="a", reclaim=True, pod_priority=9)
    assert not state.with_reclaim(parse_pod(stray)).reclaim
    other_set = builders.pod(
        "t", 4, priority=Priority.HIGH, owner="a", controller=("StatefulSet", "b")
    )
    assert not state.with_reclaim(parse_pod(other_set)).reclaim
    assert filter_nodes(state, state.with_reclaim(parse_pod(stray)), ["s"]).passed == []
    assert filter_nodes(state, state.with_reclaim(pod), ["s"]).passed == ["s"]
    lease["status"] = {"phase": "Steady"}
    state.apply_gpu_lease("MODIFIED", lease)
    assert not state.with_reclaim(pod).reclaim
    other_ns = parse_pod(
        builders.pod("o", 4, namespace="x", priority=Priority.HIGH, owner="a", controller=replica)
    )
    state.apply_gpu_lease("MODIFIED", {**lease, "status": {"phase": "Reclaiming"}})
    assert not state.with_reclaim(other_ns).reclaim


def test_a_borrower_is_kept_off_devices_whose_owner_is_reclaiming_them() -> None:
    """Borrowers may use lent devices, but not while the owner takes them back: else a
    borrower's replacement (a Deployment's, a Job's) lands on them each time the reclaim evicts
    one, and the reclaim never ends. Devices lent by other jobs stay open."""
    state = cluster(
        builders.gpu_node("a-lent", builders.devices("a-lent", 4, owner="a")),
        builders.gpu_node("b-lent", builders.devices("b-lent", 4, owner="b")),
    )
    borrower = parse_pod(builders.pod("x", 4, priority=Priority.LOW))
    lease = {
        "metadata": {"namespace": "default", "name": "a"},
        "spec": {"owner": "a", "workload": {"kind": "StatefulSet", "name": "a"}},
        "status": {"phase": "Reclaiming"},
    }
    state.apply_gpu_lease("MODIFIED", lease)
    d = filter_nodes(state, state.with_reclaim(borrower), ["a-lent", "b-lent"])
    assert d.passed == ["b-lent"]
    assert d.unresolvable == {"a-lent": f"tidelease: not enough usable GPUs, free ones are {BEING}"}
    # The bind's own pick follows the same rule.
    held: list[str] = []
    plan, _ = pick_devices(
        state.nodes[NodeName("a-lent")].devices, held, state.with_reclaim(borrower)
    )
    assert not plan.fits
    lease["status"] = {"phase": "Steady"}
    state.apply_gpu_lease("MODIFIED", lease)
    d = filter_nodes(state, state.with_reclaim(borrower), ["a-lent", "b-lent"])
    assert d.passed == ["a-lent", "b-lent"]
