"""The preempt verb's choice: only victims that free usable devices, borrowers first."""

from __future__ import annotations

from common import builders
from common.model import Priority, Tier
from common.podrequest import parse_pod
from extender.scheduler.victims import Proposal, choose_victims, preempt_nodes, resolvable
from tests.unit.cluster import allocate, cluster, holder

U = builders.device_uuid


def owner_pod(gpus: int, **kw):  # type: ignore[no-untyped-def]
    return parse_pod(
        builders.pod("own", gpus, priority=Priority.HIGH, owner="a", pod_priority=1000, **kw)
    )


def test_borrowers_of_the_owners_devices_go_first() -> None:
    devs = builders.devices("n", 4) + builders.devices("n", 4, owner="a", start=4)
    state = cluster(builders.gpu_node("n", devs))
    allocate(
        state,
        "n",
        [
            (holder("plain", pod_priority=10), [U("n", i) for i in range(4)]),
            (holder("borrower", pod_priority=50), [U("n", i) for i in range(4, 8)]),
        ],
    )
    node = state.get("n")
    victims = choose_victims(node.devices, list(node.allocations.values()), owner_pod(4))
    assert victims is not None
    assert [v.name for v in victims] == ["borrower"]


def test_high_priority_pods_are_never_victims() -> None:
    state = cluster(builders.gpu_node("n", builders.devices("n", 4)))
    allocate(
        state,
        "n",
        [(holder("hp", priority=Priority.HIGH, pod_priority=10), [U("n", i) for i in range(4)])],
    )
    node = state.get("n")
    assert choose_victims(node.devices, list(node.allocations.values()), owner_pod(1)) is None
    assert not resolvable(node.devices, list(node.allocations.values()), owner_pod(1))


def test_equal_or_higher_pod_priority_is_never_a_victim() -> None:
    state = cluster(builders.gpu_node("n", builders.devices("n", 2)))
    allocate(state, "n", [(holder("same", pod_priority=1000), [U("n", 0), U("n", 1)])])
    node = state.get("n")
    assert choose_victims(node.devices, list(node.allocations.values()), owner_pod(1)) is None


def test_victims_must_free_devices_the_preemptor_may_use() -> None:
    devs = builders.devices("n", 2, tier=Tier.LA) + builders.devices("n", 2, start=2)
    state = cluster(builders.gpu_node("n", devs))
    allocate(
        state,
        "n",
        [
            (holder("on-la"), [U("n", 0), U("n", 1)]),
            (holder("on-ha"), [U("n", 2), U("n", 3)]),
        ],
    )
    node = state.get("n")
    victims = choose_victims(
        node.devices, list(node.allocations.values()), owner_pod(2, tier=Tier.HA)
    )
    assert [v.name for v in victims or ()] == ["on-ha"]


def test_the_fewest_victims_are_kept() -> None:
    state = cluster(builders.gpu_node("n", builders.devices("n", 8)))
    allocate(
        state,
        "n",
        [
            (holder("one", pod_priority=1), [U("n", 0)]),
            (holder("big", pod_priority=2), [U("n", i) for i in range(1, 5)]),
            (holder("two", pod_priority=1), [U("n", 5), U("n", 6)]),
        ],
    )
    node = state.get("n")
    victims = choose_victims(node.devices, list(node.allocations.values()), owner_pod(4))
    # 'one' and 'two' come first by priority but free only 3 (+1 free = 4): enough.
    assert sorted(v.name for v in victims or ()) == ["one", "two"]


def test_no_victims_needed_when_it_already_fits() -> None:
    state = cluster(builders.gpu_node("n"))
    node = state.get("n")
    assert choose_victims(node.devices, [], owner_pod(2)) == ()


def test_preempt_nodes_drops_hopeless_nodes_and_keeps_pdb_counts() -> None:
    state = cluster(
        builders.gpu_node("good"),
        builders.gpu_node("hopeless", builders.devices("hopeless", 8, owner="b")),
    )
    allocate(state, "good", [(holder("b1"), [U("good", i) for i in range(8)])])
    allocate(state, "hopeless", [(holder("b2"), [U("hopeless", i) for i in range(8)])])
    answer = preempt_nodes(
        state,
        owner_pod(8),
        {
            "good": Proposal(("uid-b1",), 1),
            "hopeless": Proposal(("uid-b2",), 0),
            "unknown": Proposal(("x",), 0),
        },
    )
    assert answer == {"good": Proposal(("uid-b1",), 1)}


def test_a_node_that_needs_no_victims_is_not_returned() -> None:
    """The pod fits the node as the ledger has it (a borrower kube-scheduler still counts is
    gone from it): kube-scheduler fails the whole preemption when an extender returns a node
    without victims (seen in the soak: "expected at least one victim pod on node real-0"), so
    no such node is returned."""
    state = cluster(builders.gpu_node("free"), builders.gpu_node("busy"))
    allocate(state, "busy", [(holder("b1"), [U("busy", i) for i in range(8)])])
    proposals = {"free": Proposal(("uid-gone",), 0), "busy": Proposal(("uid-b1",), 0)}
    assert preempt_nodes(state, owner_pod(4), proposals) == {"busy": Proposal(("uid-b1",), 0)}
    assert preempt_nodes(state, owner_pod(4), {"free": Proposal(("uid-gone",), 0)}) == {}


def test_reclaim_preemption_agrees_with_the_filter_about_standby() -> None:
    """Standby free on the node, a borrower on the owner's lent devices: the filter sends
    kube-scheduler to preemption (borrowers before standby), so preempt must name the borrower
    rather than answer 'no victims needed'."""
    from extender.scheduler.filtering import filter_nodes

    devs = builders.devices("n", 2, standby=True) + builders.devices("n", 2, owner="a", start=2)
    state = cluster(builders.gpu_node("n", devs))
    allocate(state, "n", [(holder("borrower", pod_priority=5), [U("n", 2), U("n", 3)])])
    req = parse_pod(
        builders.pod(
            "own",
            1,
            priority=Priority.HIGH,
            owner="a",
            reclaim=True,
            pod_priority=1000,
            tier=Tier.HA,
        )
    )
    assert list(filter_nodes(state, req, ["n"]).failed) == ["n"]
    answer = preempt_nodes(state, req, {"n": Proposal((), 0)})
    assert answer == {"n": Proposal(("uid-borrower",), 0)}


def test_only_the_cheapest_node_is_proposed_borrowers_of_own_devices_first() -> None:
    state = cluster(
        builders.gpu_node("x", builders.devices("x", 8, owner="a")),
        builders.gpu_node("y"),
    )
    allocate(state, "x", [(holder("borrower", pod_priority=10), [U("x", i) for i in range(8)])])
    allocate(state, "y", [(holder("other", pod_priority=1), [U("y", i) for i in range(8)])])
    answer = preempt_nodes(
        state, owner_pod(8), {"x": Proposal(("uid-borrower",)), "y": Proposal(("uid-other",))}
    )
    assert answer == {"x": Proposal(("uid-borrower",), 0)}


def test_a_deleted_pods_devices_are_free_at_once_and_never_victims() -> None:
    from common.model import PodUid
    from extender.scheduler.filtering import filter_nodes

    state = cluster(builders.gpu_node("n", builders.devices("n", 4)))
    allocate(state, "n", [(holder("gone", pod_priority=1), [U("n", i) for i in range(4)])])
    req = owner_pod(4)
    assert filter_nodes(state, req, ["n"]).passed == []
    state.pod_gone(PodUid("uid-gone"))
    assert filter_nodes(state, req, ["n"]).passed == ["n"]
    # Nothing to evict: no node (kube-scheduler refuses one without victims), never the gone pod.
    assert preempt_nodes(state, req, {"n": Proposal(("uid-gone",))}) == {}
    node = state.get("n")
    assert node is not None
    assert list(node.ledger) == ["uid-gone"]  # still stored until the reaper writes
    state.set_ledger(node.node, (), "2")
    assert not state.gone
