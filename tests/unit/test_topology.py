"""common.topology: scoring groups, the GpuNode's JSON, and what the GpuNode parser and the DRA
slice make of it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from common import builders
from common import deviceattributes as da
from common.errors import InvalidInput
from common.model import NodeInventory, NodeName
from common.objects import gpu_node_object, parse_gpu_node
from common.topology import (
    GroupScore,
    Link,
    NodeTopology,
    Placement,
    choose,
    from_json,
    group_score,
    link_table,
    make,
    pair,
    to_json,
)

# Two NVLink pairs (0-1 with 4 links, 2-3 with 12) on one NUMA node, 4 alone across the socket;
# 3-4 unknown.
TOPOLOGY = make(
    [
        Placement(0, 0, "pci0000:15"),
        Placement(1, 0, "pci0000:15"),
        Placement(2, 0, "pci0000:26"),
        Placement(3, 0, "pci0000:26"),
        Placement(4, 1, "nvml:00000000:90:00.0"),
    ],
    [
        pair(1, 0, Link.NVLINK, 4),
        pair(0, 2, Link.SAME_NUMA_NODE),
        pair(0, 3, Link.SAME_NUMA_NODE),
        pair(1, 2, Link.SAME_NUMA_NODE),
        pair(1, 3, Link.SAME_NUMA_NODE),
        pair(2, 3, Link.NVLINK, 12),
        pair(0, 4, Link.ACROSS_SOCKETS),
        pair(1, 4, Link.ACROSS_SOCKETS),
        pair(2, 4, Link.ACROSS_SOCKETS),
    ],
)


@pytest.mark.parametrize(
    ("group", "want"),
    [
        ([0], GroupScore(Link.NVLINK, 0, 0)),
        ([1, 0], GroupScore(Link.NVLINK, 0, -4)),
        ([2, 3], GroupScore(Link.NVLINK, 0, -12)),
        ([0, 2], GroupScore(Link.SAME_NUMA_NODE, 3, 0)),
        ([0, 1, 2, 3], GroupScore(Link.SAME_NUMA_NODE, 12, -16)),
        ([3, 4], GroupScore(Link.ACROSS_SOCKETS, 4, 0)),  # unknown: the loosest
    ],
    ids=["one", "nv4", "nv12", "numa", "four", "unknown"],
)
def test_group_score(group: list[int], want: GroupScore) -> None:
    assert group_score(link_table(TOPOLOGY), group) == want


def test_the_choice_prefers_worst_link_then_bandwidth_then_indexes() -> None:
    assert choose(TOPOLOGY, [([0, 1, 2, 3], 2)]) == ((2, 3),)  # more NVLinks than 0-1
    assert choose(TOPOLOGY, [([0, 2, 4], 2)]) == ((0, 2),)  # 4 is across the socket
    assert choose(TOPOLOGY, [([1, 0], 1)]) == ((1,),)  # one device: the first given
    assert Link.NVLINK < Link.SAME_PCIE_SWITCH < Link.SAME_HOST_BRIDGE < Link.SAME_NUMA_NODE
    assert Link.SAME_NUMA_NODE < Link.ACROSS_SOCKETS


def test_a_device_has_no_link_to_itself() -> None:
    with pytest.raises(ValueError, match="itself"):
        pair(2, 2, Link.NVLINK, 1)


def test_json_round_trip() -> None:
    data = to_json(TOPOLOGY)
    assert data["links"][0] == {"a": 0, "b": 1, "link": "NVLink", "nvlinks": 4}
    assert data["links"][1] == {"a": 0, "b": 2, "link": "SameNUMANode"}
    assert from_json(data) == TOPOLOGY
    assert from_json(None) is None
    assert to_json(make([Placement(0)], [])) == {"devices": [{"index": 0}], "links": []}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda t: t.update(devices="x"), "topology.devices must be a list"),
        (lambda t: t["devices"].append({"index": 0}), "topology.devices[5].index 0 appears twice"),
        (lambda t: t["devices"][0].update(index=-1), "index must be a non-negative integer"),
        (lambda t: t["devices"][0].update(numaNode=True), "numaNode must be a non-negative"),
        (lambda t: t["devices"][0].update(pcieRoot="r" * 65), "pcieRoot must be a string of 1"),
        (lambda t: t["links"][0].update(link="Ethernet"), "link must be one of NVLink, "),
        (lambda t: t["links"][0].update(b=9), "two distinct indexes listed in devices"),
        (lambda t: t["links"][0].update(b=0), "two distinct indexes listed in devices"),
        (lambda t: t["links"][0].pop("nvlinks"), "nvlinks must be a positive integer for NVLink"),
        (lambda t: t["links"][1].update(nvlinks=2), "nvlinks must be a positive integer"),
        (lambda t: t["links"].append({"a": 1, "b": 0, "link": "NVLink", "nvlinks": 1}), "0-1"),
        (lambda t: t["links"].append(7), "topology.links[9] must be an object"),
    ],
    ids=[
        "devices-not-list",
        "index-twice",
        "index-negative",
        "numa-bool",
        "root-long",
        "link-name",
        "unknown-device",
        "self-link",
        "nvlink-no-count",
        "count-without-nvlink",
        "pair-twice",
        "link-not-object",
    ],
)
def test_bad_topology_is_rejected(change: Any, problem: str) -> None:
    data = to_json(TOPOLOGY)
    change(data)
    with pytest.raises(InvalidInput) as raised:
        from_json(data)
    # the first problem is the change's (links to a device left out are problems too)
    assert problem in raised.value.problems[0]


def test_not_an_object_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="topology must be an object"):
        from_json([1, 2])


def _inventory() -> NodeInventory:
    return NodeInventory(NodeName("n1"), tuple(builders.devices("n1", 5)))


def _gpunode(topology: NodeTopology | None = None) -> dict[str, Any]:
    obj = gpu_node_object(_inventory())
    if topology is not None:
        obj["status"]["topology"] = to_json(topology)
    return obj


def test_old_gpunodes_parse_as_before() -> None:
    obj = _gpunode()
    assert "topology" not in obj["status"]
    inv = parse_gpu_node(obj)
    assert inv.topology is None
    assert inv == _inventory()
    assert gpu_node_object(inv) == obj  # nothing added on the way back


def test_gpunode_carries_its_topology() -> None:
    inv = parse_gpu_node(_gpunode(TOPOLOGY))
    assert inv.topology == TOPOLOGY
    assert gpu_node_object(inv)["status"]["topology"] == to_json(TOPOLOGY)


def test_malformed_topology_is_invalid_input_naming_the_node() -> None:
    obj = _gpunode(TOPOLOGY)
    obj["status"]["topology"]["links"][0]["link"] = "Carrier pigeon"
    with pytest.raises(InvalidInput) as raised:
        parse_gpu_node(obj)
    assert raised.value.problems == [
        "GpuNode n1: status.topology.links[0].link must be one of NVLink, SamePCIeSwitch, "
        "SameHostBridge, SameNUMANode, AcrossSockets"
    ]


def test_slice_carries_the_standard_attributes() -> None:
    devices = da.slice_devices(_gpunode(TOPOLOGY))
    attributes = [d["attributes"] for d in devices]
    assert da.ATTR_NUMA_NODE == "resource.kubernetes.io/numaNode"
    assert da.ATTR_PCIE_ROOT == "resource.kubernetes.io/pcieRoot"
    assert [a.get(da.ATTR_NUMA_NODE) for a in attributes] == [{"int": n} for n in (0, 0, 0, 0, 1)]
    assert [a.get(da.ATTR_PCIE_ROOT) for a in attributes] == [
        {"string": "pci0000:15"},
        {"string": "pci0000:15"},
        {"string": "pci0000:26"},
        {"string": "pci0000:26"},
        None,  # derived from NVML alone: no upstream form, not published
    ]


def test_slice_without_topology_is_unchanged() -> None:
    obj = _gpunode()
    plain = da.slice_devices(obj)
    assert all(
        not any(k.startswith("resource.kubernetes.io/") for k in d["attributes"]) for d in plain
    )
    assert plain == [da.device_entry(d) for d in parse_gpu_node(copy.deepcopy(obj)).devices]
