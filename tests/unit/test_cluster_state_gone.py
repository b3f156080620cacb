"""A pod seen gone frees its devices on every node whose ledger still holds it: its own, and a
stale allocation left on another (a bind that failed half-way, then a bind elsewhere), until the
reaper rewrites each ledger."""

from __future__ import annotations

from common import builders
from common.model import NodeName, PodUid
from tests.unit.cluster import allocate, cluster, holder

U = builders.device_uuid


def test_a_gone_pod_frees_its_devices_on_every_ledger_that_holds_it() -> None:
    state = cluster(
        builders.gpu_node("a", builders.devices("a", 2)),
        builders.gpu_node("b", builders.devices("b", 2)),
    )
    twice = holder("twice")
    allocate(state, "a", [(twice, [U("a", 0)])])  # the stale one
    allocate(state, "b", [(twice, [U("b", 0)])])
    assert [s.free_total for s in (state.get("a"), state.get("b")) if s] == [1, 1]

    state.pod_gone(PodUid("uid-twice"))
    assert [s.free_total for s in (state.get("a"), state.get("b")) if s] == [2, 2]

    # The reaper rewrites a's ledger first: the pod is still gone, b still frees its device.
    state.set_ledger(NodeName("a"), (), "2")
    assert PodUid("uid-twice") in state.gone
    b = state.get("b")
    assert b is not None
    assert b.free_total == 2
    assert "uid-twice" not in b.allocations
    # Once no ledger holds it, it is forgotten.
    state.set_ledger(NodeName("b"), (), "2")
    assert PodUid("uid-twice") not in state.gone
