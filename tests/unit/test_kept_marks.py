"""Lent GPUs kept for a Kueue workload (common/keptmarks.py): the GpuNode's mark read by the
extender's view, and what placement and binding make of it, per request: another owner's
borrower does not get a kept device (here and in the bind's choice of UUIDs), the workload's own
pods, online pods and reclaims do, and a lapsed or unreadable mark keeps nothing."""

from __future__ import annotations

from typing import Any

import pytest

from common import builders, contract
from common.keptmarks import NO_MARK, KeptMark, decode, encode, key_of
from common.model import GpuUuid, NodeName, Priority
from common.podrequest import parse_pod
from extender.scheduler.filtering import KEPT_FOR_KUEUE, filter_nodes
from extender.scheduler.placement import pick_devices
from tests.unit.cluster import as_reclaim, cluster

NOW = 1796011500.0
OWNER = "team-a/Job/finetune"


def U(node: str, i: int) -> str:
    return builders.devices(node, i + 1, owner="online")[i].uuid


def marked(node: str, kept: dict[str, str], until: float) -> dict[str, Any]:
    obj = builders.gpu_node(node, builders.devices(node, 8, owner="online"))
    obj["metadata"]["annotations"] = {contract.ANN_KEPT_FOR_KUEUE: encode(kept, until)}  # type: ignore[arg-type]
    return obj


def finetune_pod(name: str = "finetune-0", gpus: int = 4, **kw: Any) -> dict[str, Any]:
    return builders.pod(name, gpus, namespace="team-a", controller=("Job", "finetune"), **kw)


def test_the_mark_round_trips_and_bad_ones_are_refused() -> None:
    kept = {GpuUuid("GPU-1"): OWNER, GpuUuid("GPU-2"): "b/Job/x"}
    assert decode(encode(kept, NOW)) == KeptMark(kept, NOW)
    assert decode(None) is NO_MARK
    for bad in ("{", "[]", '{"until": 5, "devices": {}}',
                '{"until": "2026-11-30T00:00:00Z", "devices": {"GPU-1": "no-slashes"}}',
                '{"until": "2026-11-30T00:00:00Z", "devices": []}'):  # fmt: skip
        with pytest.raises(ValueError):  # noqa: PT011 (each says what is wrong)
            decode(bad)


def test_who_is_barred_from_kept_devices() -> None:
    mark = KeptMark({GpuUuid("GPU-1"): OWNER}, NOW + 60)
    mine = parse_pod(finetune_pod())
    assert key_of(mine) == OWNER
    same_name_elsewhere = parse_pod(
        builders.pod("x", 4, namespace="team-b", controller=("Job", "finetune"))
    )
    loose = parse_pod(builders.pod("y", 4, namespace="team-a"))  # no controller
    online = parse_pod(builders.pod("o", 4, priority=Priority.HIGH, owner="online"))
    reclaim = as_reclaim(builders.pod("r", 4, owner="online"))
    assert mark.barred(mine, NOW) == frozenset()
    assert mark.barred(same_name_elsewhere, NOW) == {"GPU-1"}
    assert mark.barred(loose, NOW) == {"GPU-1"}
    assert mark.barred(online, NOW) == frozenset()
    assert mark.barred(reclaim, NOW) == frozenset()
    assert mark.barred(loose, NOW + 60) == frozenset()  # lapsed


def test_a_borrower_of_another_owner_is_kept_off_the_kept_devices() -> None:
    node = "n"
    kept = {GpuUuid(U(node, i)): OWNER for i in range(4)}
    state = cluster(marked(node, kept, NOW + 60))
    other = parse_pod(builders.pod("other", 8, namespace="team-b"))
    d = filter_nodes(state, other, [node], now=NOW)
    assert d.passed == []
    assert KEPT_FOR_KUEUE in {**d.failed, **d.unresolvable}[node]
    # four are not kept: a borrower of four fits, and the bind's choice takes none kept
    small = parse_pod(builders.pod("small", 4, namespace="team-b"))
    assert filter_nodes(state, small, [node], now=NOW).passed == [node]
    at = state.get(node)
    assert at is not None
    plan, chosen = pick_devices(at.devices, at.unavailable_to(small, NOW), small)
    assert plan.fits
    assert not {d.uuid for d in chosen} & set(kept)
    # the workload's own pod gets all eight; so do an online pod and a reclaim
    assert filter_nodes(state, parse_pod(finetune_pod(gpus=8)), [node], now=NOW).passed == [node]
    high = parse_pod(builders.pod("o", 8, priority=Priority.HIGH, owner="online", pod_priority=9))
    assert filter_nodes(state, high, [node], now=NOW).passed == [node]
    assert filter_nodes(state, as_reclaim(builders.pod("r", 8, owner="online")), [node],
                        now=NOW).passed == [node]  # fmt: skip
    # once the mark lapses (its controller gone), nothing is kept
    assert filter_nodes(state, other, [node], now=NOW + 61).passed == [node]


def test_an_unreadable_mark_keeps_nothing() -> None:
    obj = builders.gpu_node("n", builders.devices("n", 8, owner="online"))
    obj["metadata"]["annotations"] = {contract.ANN_KEPT_FOR_KUEUE: "{not json"}
    state = cluster(obj)
    at = state.get(NodeName("n"))
    assert at is not None
    assert at.kept is NO_MARK
    other = parse_pod(builders.pod("other", 8, namespace="team-b"))
    assert filter_nodes(state, other, ["n"], now=NOW).passed == ["n"]
