"""tidelease.io/gpu-topology (parsed, refused with a reason where a node cannot meet it) and the
node score's topology tie-break."""

from __future__ import annotations

from typing import Any

import pytest

from common import builders, contract
from common.errors import InvalidInput
from common.model import Device, NodeInventory, NodeName, Tier
from common.objects import gpu_node_object
from common.podrequest import parse_pod
from common.topology import Link, NodeTopology
from extender.scheduler.filtering import filter_nodes
from extender.scheduler.placement import pick_devices, placement_shape
from extender.scheduler.scoring import ScoreWeights, prioritize_nodes
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, layout
from tests.unit.cluster import allocate, cluster, holder

W = ScoreWeights()


def fake_topology(name: str) -> NodeTopology:
    reading = NvmlReader(FakeNvml(layout(name))).topology()
    assert reading.topology is not None
    return reading.topology


def node(name: str, fake: str | None, count: int = 8, **kw: Any) -> dict[str, Any]:
    """A GpuNode of ``count`` devices publishing the fake layout's topology (None: none)."""
    devs: list[Device] = builders.devices(name, count, **kw)
    topology = fake_topology(fake) if fake else None
    return gpu_node_object(NodeInventory(NodeName(name), tuple(devs), topology=topology))


def pod(gpus: int, need: str | None = None, **kw: Any) -> dict[str, Any]:
    extra = {contract.ANN_GPU_TOPOLOGY: need} if need is not None else {}
    return builders.pod("p", gpus, extra_annotations=extra, **kw)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("nvlink", Link.NVLINK),
        ("pcie-switch", Link.SAME_PCIE_SWITCH),
        ("host-bridge", Link.SAME_HOST_BRIDGE),
        ("numa-node", Link.SAME_NUMA_NODE),
        (None, None),
    ],
    ids=["nvlink", "pcie-switch", "host-bridge", "numa-node", "absent"],
)
def test_the_annotation_is_parsed_into_the_request(value: str | None, want: Link | None) -> None:
    req = parse_pod(pod(2, value))
    assert req.gpu_topology is want
    assert want in placement_shape(req) or want is None


@pytest.mark.parametrize("value", ["NVLink", "socket", "", "nvlink,numa-node"])
def test_an_unknown_value_is_refused_naming_the_annotation(value: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_pod(pod(2, value))
    assert str(caught.value).count(f"annotation {contract.ANN_GPU_TOPOLOGY}: invalid value ") == 1
    assert "(want host-bridge or numa-node or nvlink or pcie-switch)" in str(caught.value)


def test_requests_apart_only_in_the_annotation_have_different_shapes() -> None:
    assert placement_shape(parse_pod(pod(2))) != placement_shape(parse_pod(pod(2, "nvlink")))


def test_filter_refuses_with_the_reason_where_the_group_cannot_meet_it() -> None:
    state = cluster(
        node("fabric", "nvswitch-8"),
        node("pairs", "nvlink-pairs-4", 4),
        node("plain", None),
        node("sockets", "pcie-2socket-8"),
    )
    # on "pairs", one device of each NVLink pair is taken: no two free ones are NVLinked
    allocate(state, "pairs", [(holder("x"), [builders.device_uuid("pairs", i) for i in (0, 2)])])
    names = ["fabric", "pairs", "plain", "sockets"]
    d = filter_nodes(state, parse_pod(pod(2, "nvlink")), names)
    assert d.passed == ["fabric"]
    assert d.failed == {}
    assert d.unresolvable == {
        "pairs": "tidelease: no 2 free GPUs joined by NVLink or closer on this node "
        "(tidelease.io/gpu-topology: nvlink)",
        "plain": "tidelease: node publishes no GPU topology, the pod requires nvlink",
        "sockets": "tidelease: no 2 free GPUs joined by NVLink or closer on this node "
        "(tidelease.io/gpu-topology: nvlink)",
    }
    # one PCIe switch: the two-socket node's switches hold two GPUs each
    d = filter_nodes(state, parse_pod(pod(2, "pcie-switch")), names)
    assert sorted(d.passed) == ["fabric", "sockets"]
    d = filter_nodes(state, parse_pod(pod(4, "numa-node")), names)
    assert sorted(d.passed) == ["fabric", "sockets"]
    # five: on the two-socket node some pair crosses the sockets; NVSwitch joins all eight
    d = filter_nodes(state, parse_pod(pod(5, "numa-node")), names)
    assert d.passed == ["fabric"]
    assert d.unresolvable["sockets"] == (
        "tidelease: no 5 free GPUs joined by one NUMA node or closer on this node "
        "(tidelease.io/gpu-topology: numa-node)"
    )
    # without the annotation every node with room passes, as before
    d = filter_nodes(state, parse_pod(pod(2)), names)
    assert sorted(d.passed) == names


def test_a_one_gpu_pod_meets_any_requirement_even_without_topology() -> None:
    state = cluster(node("plain", None))
    assert filter_nodes(state, parse_pod(pod(1, "nvlink")), ["plain"]).passed == ["plain"]


def test_the_refusal_follows_the_free_devices() -> None:
    """Remembered per topology and free devices: a release is seen at once."""
    state = cluster(node("sockets", "pcie-2socket-8"))
    taken = [builders.device_uuid("sockets", i) for i in (1, 3, 5, 7)]
    allocate(state, "sockets", [(holder("x"), taken)])
    req = parse_pod(pod(2, "pcie-switch"))
    assert filter_nodes(state, req, ["sockets"]).passed == []
    state.set_ledger(NodeName("sockets"), (), "2")
    assert filter_nodes(state, req, ["sockets"]).passed == ["sockets"]


def test_tiers_are_not_traded_to_meet_the_requirement() -> None:
    """An LA-tolerant pod takes the LA devices (0-3, one socket's switches apart by pairs);
    HA devices 4-7 would be tighter for nothing: placement's preference stands."""
    devs = builders.devices("n", 4, tier=Tier.LA) + builders.devices("n", 4, start=4)
    inv = NodeInventory(NodeName("n"), tuple(devs), topology=fake_topology("pcie-2socket-8"))
    state = cluster(gpu_node_object(inv))
    allocate(state, "n", [(holder("x"), [builders.device_uuid("n", i) for i in (1, 2)])])
    req = parse_pod(pod(2, "pcie-switch"))
    d = filter_nodes(state, req, ["n"])
    assert d.passed == []  # LA devices 0 and 3 are on different switches
    st = state.get("n")
    assert st is not None
    plan, chosen = pick_devices(st.devices, st.taken_for(req.uid), req, st.topology)
    assert not plan.fits
    assert plan.reason == d.unresolvable["n"]
    # the same pod asking HA devices gets a pair on one switch
    req = parse_pod(pod(2, "pcie-switch", tier=Tier.HA))
    plan, chosen = pick_devices(st.devices, st.taken_for(req.uid), req, st.topology)
    assert plan.fits
    assert [c.index for c in chosen] == [4, 5]


def scores(state: Any, p: dict[str, Any], names: list[str]) -> dict[str, int]:
    return dict(prioritize_nodes(state, parse_pod(p), names, W))


def test_a_tighter_group_scores_higher_among_equals() -> None:
    state = cluster(
        node("tight", "nvlink-pairs-4", 4),
        node("loose", "nvlink-pairs-4", 4),
        node("plain", None, 4),
    )
    allocate(state, "tight", [(holder("x"), [builders.device_uuid("tight", i) for i in (2, 3)])])
    allocate(state, "loose", [(holder("y"), [builders.device_uuid("loose", i) for i in (1, 3)])])
    allocate(state, "plain", [(holder("z"), [builders.device_uuid("plain", i) for i in (1, 3)])])
    names = ["tight", "loose", "plain"]
    s = scores(state, pod(2), names)
    assert s["tight"] == s["plain"] + 1
    assert s["loose"] == s["plain"]  # across host bridges: too loose to lift a whole point
    # one GPU: links do not matter, every score as without topology
    s1 = scores(state, pod(1), names)
    assert s1["tight"] == s1["loose"] == s1["plain"]


def test_the_tie_break_never_lifts_a_node_past_a_better_one() -> None:
    """A borrower prefers untagged devices (the return part): a tight group of lent devices
    never scores above loose untagged ones."""
    state = cluster(
        node("lent", "nvswitch-8", owner="a"),
        node("untagged", "pcie-2socket-8"),
    )
    far = [builders.device_uuid("untagged", i) for i in (1, 2, 3, 5, 6, 7)]
    allocate(state, "untagged", [(holder("x"), far)])  # free: 0 and 4, across sockets
    allocate(state, "lent", [(holder("y"), [builders.device_uuid("lent", i) for i in range(6)])])
    s = scores(state, pod(2), ["lent", "untagged"])
    assert s["untagged"] >= s["lent"]


def test_scores_follow_the_free_devices_of_nodes_with_topology() -> None:
    state = cluster(node("n", "nvlink-pairs-4", 4))
    allocate(state, "n", [(holder("x"), [builders.device_uuid("n", i) for i in (2, 3)])])
    before = scores(state, pod(2), ["n"])["n"]
    state.set_ledger(NodeName("n"), (), "2")
    allocate(state, "n", [(holder("x"), [builders.device_uuid("n", i) for i in (1, 3)])])
    assert scores(state, pod(2), ["n"])["n"] == before - 1  # same counts, looser group
