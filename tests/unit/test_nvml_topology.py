"""NvmlReader.topology on the NVML fake's layouts, its failures, and the agent publishing it."""

from __future__ import annotations

import argparse
from itertools import combinations

import pynvml
import pytest

from common.topology import Link, from_json
from nodeagent.agent import AgentSettings, NodeView, plugin_devices
from nodeagent.main import flag_problems, register
from nodeagent.nvml import NullReader, NvmlReader
from nodeagent.nvmlfake import LAYOUTS, FakeNvml, full_gpu, layout

# The layouts as their description puts them, per GPU: (NUMA node, host bridge, PCIe switch,
# NVLink group, NVLinks to it). Written from the descriptions, not from the fake's code.
DESCRIBED = {
    # 8 GPUs on NVSwitches (18 links each), NUMA 0-3 / 4-7, 4 PCIe switches each on its bridge
    "nvswitch-8": [(i // 4, f"hb{i // 2}", f"sw{i // 2}", "fabric", 18) for i in range(8)],
    # 2 sockets (one host bridge each), 2 PCIe switches per socket, 2 GPUs per switch, no NVLink
    "pcie-2socket-8": [(i // 4, f"socket{i // 4}", f"sw{i // 2}", None, 0) for i in range(8)],
    # one socket, NVLink pairs 0-1 and 2-3 (4 links), the pairs on different switches/bridges
    "nvlink-pairs-4": [(0, f"hb{i // 2}", f"sw{i // 2}", f"pair{i // 2}", 4) for i in range(4)],
}


def expected_link(a: tuple[object, ...], b: tuple[object, ...]) -> tuple[Link, int]:
    numa_a, bridge_a, switch_a, group_a, links_a = a
    numa_b, bridge_b, switch_b, group_b, _ = b
    if group_a is not None and group_a == group_b:
        return Link.NVLINK, int(str(links_a))
    if switch_a == switch_b:
        return Link.SAME_PCIE_SWITCH, 0
    if bridge_a == bridge_b:
        return Link.SAME_HOST_BRIDGE, 0
    if numa_a == numa_b:
        return Link.SAME_NUMA_NODE, 0
    return Link.ACROSS_SOCKETS, 0


@pytest.mark.parametrize("name", sorted(DESCRIBED), ids=sorted(DESCRIBED))
def test_reader_gives_each_pair_its_described_link(name: str) -> None:
    described = DESCRIBED[name]
    reading = NvmlReader(FakeNvml(layout(name))).topology()
    assert reading.errors == ()
    assert reading.topology is not None
    got = {(p.a, p.b): (p.link, p.nvlinks) for p in reading.topology.links}
    want = {
        (a, b): expected_link(described[a], described[b])
        for a, b in combinations(range(len(described)), 2)
    }
    assert got == want
    assert [p.numa_node for p in reading.topology.placements] == [d[0] for d in described]


@pytest.mark.parametrize("name", sorted(DESCRIBED), ids=sorted(DESCRIBED))
def test_derived_pcie_roots_follow_the_host_bridges(name: str) -> None:
    described = DESCRIBED[name]
    topology = NvmlReader(FakeNvml(layout(name))).topology().topology
    assert topology is not None
    roots = [p.pcie_root for p in topology.placements]
    assert all(r is not None and r.startswith("nvml:") for r in roots)
    for a, b in combinations(range(len(described)), 2):
        assert (roots[a] == roots[b]) == (described[a][1] == described[b][1]), (a, b)


def test_every_layout_is_described_and_every_link_kind_appears() -> None:
    assert set(LAYOUTS) == set(DESCRIBED)
    seen: set[Link] = set()
    for name in LAYOUTS:
        topology = NvmlReader(FakeNvml(layout(name))).topology().topology
        assert topology is not None
        seen |= {p.link for p in topology.links}
    assert seen == set(Link)


def test_unplaced_fake_gpus_have_no_topology_as_before() -> None:
    reading = NvmlReader(FakeNvml()).topology()
    assert reading.topology is None
    assert reading.errors == ()
    assert NullReader().topology().topology is None


def test_a_link_down_is_not_counted() -> None:
    gpus = layout("nvlink-pairs-4")
    gpus[0].nvlinks[1] = None
    gpus[1].nvlinks[1] = None
    topology = NvmlReader(FakeNvml(gpus)).topology().topology
    assert topology is not None
    assert {(p.a, p.b): p.nvlinks for p in topology.links if p.link is Link.NVLINK} == {
        (0, 1): 3,
        (2, 3): 4,
    }


def test_failing_topology_calls_are_recorded_not_raised() -> None:
    gpus = layout("pcie-2socket-8")
    gpus[2].failures["nvmlDeviceGetTopologyCommonAncestor"] = pynvml.NVML_ERROR_UNKNOWN
    gpus[5].failures["nvmlDeviceGetNumaNodeId"] = pynvml.NVML_ERROR_NO_PERMISSION
    reading = NvmlReader(FakeNvml(gpus)).topology()
    assert reading.topology is not None
    pairs = {(p.a, p.b) for p in reading.topology.links}
    assert not any(2 in pair for pair in pairs)  # unknown: left out, scored as the loosest
    assert len(pairs) == 28 - 7
    placement = reading.topology.placement(5)
    assert placement is not None
    assert placement.numa_node is None
    assert any(e.startswith("nvmlDeviceGetTopologyCommonAncestor: ") for e in reading.errors)
    assert any(e.startswith("nvmlDeviceGetNumaNodeId: ") for e in reading.errors)


class _OldBinding:
    """A binding without the NUMA and NVLink functions (older nvidia-ml-py)."""

    def __init__(self, fake: FakeNvml) -> None:
        self._fake = fake

    def __getattr__(self, name: str) -> object:
        if name in {"nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNvLinkState"}:
            raise AttributeError(name)
        return getattr(self._fake, name)


def test_missing_binding_functions_do_not_crash() -> None:
    reading = NvmlReader(_OldBinding(FakeNvml(layout("nvlink-pairs-4")))).topology()
    assert reading.topology is not None
    assert all(p.numa_node is None for p in reading.topology.placements)  # silently none
    assert {(p.a, p.b): p.link for p in reading.topology.links}[(0, 1)] is Link.SAME_PCIE_SWITCH
    assert reading.errors == ("nvmlDeviceGetNvLinkState: not in this NVML binding",) * 4


def test_agent_publishes_topology_and_numa_to_the_device_plugin() -> None:
    reader = NvmlReader(FakeNvml(layout("pcie-2socket-8")))
    infos, topology = reader.devices(), reader.topology().topology
    view = NodeView(infos, AgentSettings(node="n1"), None, topology)
    status = view.status(0.0)
    assert from_json(status["topology"]) == topology
    assert [d.numa_node for d in plugin_devices(infos, view.health(), topology)] == [
        0,
        0,
        0,
        0,
        1,
        1,
        1,
        1,
    ]


def test_agent_without_topology_publishes_as_before() -> None:
    reader = NvmlReader(FakeNvml([full_gpu(0), full_gpu(1)]))
    infos = reader.devices()
    view = NodeView(infos, AgentSettings(node="n1"), None, reader.topology().topology)
    assert "topology" not in view.status(0.0)
    assert [d.numa_node for d in plugin_devices(infos, view.health())] == [None, None]


def _agent(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["agent", "--node", "n", *argv])


def test_fake_topology_flag_is_checked() -> None:
    assert flag_problems(_agent("--fake-topology", "nvlink-pairs-4", "--fake-gpus", "4")) == []
    assert flag_problems(_agent("--fake-topology", "nvlink-pairs-4")) == [
        "--fake-gpus: the layout nvlink-pairs-4 has 4 GPUs, got 8"
    ]
    unknown = flag_problems(_agent("--fake-topology", "ring-3"))
    assert unknown == ["--fake-topology: want none or one of " + ", ".join(LAYOUTS)]
    assert _agent().fake_topology == "none"
