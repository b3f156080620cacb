"""How the GPUs of one node are connected, and how tight a group of them is. Pure.

The node agent reads the topology through NVML (:meth:`nodeagent.nvml.NvmlReader.topology`) and
publishes it as ``GpuNode.status.topology`` (:func:`to_json`); the control plane parses it back
(:func:`from_json`, through :func:`common.objects.parse_gpu_node`). Devices are named by their
NVML index, as in ``status.devices[]``.

The link between two GPUs is a :class:`Link`, ordered tightest first (NVIDIA's ``nvidia-smi topo
-m`` levels, NVLink above them all):

* ``NVLINK``: at least one active NVLink between them, direct or through an NVSwitch (the count
  of links tells NV4 from NV18);
* ``SAME_PCIE_SWITCH``: below one or more PCIe switches, no host bridge in between (NVML's
  ``NVML_TOPOLOGY_SINGLE`` and ``_MULTIPLE``; ``_INTERNAL``, two GPUs of one board, counts here);
* ``SAME_HOST_BRIDGE``: below one host bridge (``NVML_TOPOLOGY_HOSTBRIDGE``);
* ``SAME_NUMA_NODE``: across host bridges of one NUMA node (``NVML_TOPOLOGY_NODE``);
* ``ACROSS_SOCKETS``: across the CPUs' interconnect (``NVML_TOPOLOGY_SYSTEM``). A pair whose link
  is not known counts as this, the loosest.

A group's :class:`GroupScore` orders groups: the tightest group is the one with the least score.
:func:`choose` picks a pod's devices: the tightest group that takes exactly what placement
decided from each device class (placement's rules first: topology only chooses among devices
of one class), ties to the lowest indexes; :func:`within` says whether a group meets a pod's
``tidelease.io/gpu-topology`` (:data:`REQUIREMENTS`).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Final, NamedTuple

from common.coercion import whole
from common.errors import InvalidInput


class Link(enum.IntEnum):
    """The link between two GPUs of one node; a lower value is tighter."""

    NVLINK = 0
    SAME_PCIE_SWITCH = 1
    SAME_HOST_BRIDGE = 2
    SAME_NUMA_NODE = 3
    ACROSS_SOCKETS = 4


# Names in the GpuNode (status.topology.links[].link), as the CRD's enum lists them.
LINK_NAMES: Final = {
    Link.NVLINK: "NVLink",
    Link.SAME_PCIE_SWITCH: "SamePCIeSwitch",
    Link.SAME_HOST_BRIDGE: "SameHostBridge",
    Link.SAME_NUMA_NODE: "SameNUMANode",
    Link.ACROSS_SOCKETS: "AcrossSockets",
}
_LINKS_BY_NAME: Final = {name: link for link, name in LINK_NAMES.items()}

# A pod's tidelease.io/gpu-topology: the loosest link allowed between any two of its GPUs.
REQUIREMENTS: Final = {
    "nvlink": Link.NVLINK,
    "pcie-switch": Link.SAME_PCIE_SWITCH,
    "host-bridge": Link.SAME_HOST_BRIDGE,
    "numa-node": Link.SAME_NUMA_NODE,
}
REQUIREMENT_NAMES: Final = {link: name for name, link in REQUIREMENTS.items()}
# How a refusal names each requirement: "joined by <this> or closer".
REQUIREMENT_WORDS: Final = {
    Link.NVLINK: "NVLink",
    Link.SAME_PCIE_SWITCH: "one PCIe switch",
    Link.SAME_HOST_BRIDGE: "one host bridge",
    Link.SAME_NUMA_NODE: "one NUMA node",
}

MAX_PCIE_ROOT: Final = 64  # a string attribute's longest value in DRA
# The upstream form of a PCIe root complex, "pci<domain>:<bus>" (as sysfs names it).
_UPSTREAM_PCIE_ROOT: Final = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one device sits: its NUMA node and PCIe root complex, None when unknown."""

    index: int
    numa_node: int | None = None
    pcie_root: str | None = None


@dataclass(frozen=True, slots=True)
class PairLink:
    """The link between devices ``a`` < ``b``; ``nvlinks``: how many NVLinks (0 unless NVLINK)."""

    a: int
    b: int
    link: Link
    nvlinks: int = 0


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """A node's topology: its devices' placements and the links of the pairs known, both
    sorted (by index, by pair), so that equal topologies compare equal. Build with :func:`make`."""

    placements: tuple[Placement, ...] = ()
    links: tuple[PairLink, ...] = ()

    def placement(self, index: int) -> Placement | None:
        """Where device ``index`` sits; None when the topology does not list it."""
        return next((p for p in self.placements if p.index == index), None)


def make(placements: Iterable[Placement], links: Iterable[PairLink]) -> NodeTopology:
    """A topology in its canonical order."""
    return NodeTopology(
        tuple(sorted(placements, key=lambda p: p.index)),
        tuple(sorted(links, key=lambda p: (p.a, p.b))),
    )


def pair(a: int, b: int, link: Link, nvlinks: int = 0) -> PairLink:
    """The :class:`PairLink` of two distinct devices, given in either order."""
    if a == b:
        raise ValueError(f"a device has no link to itself ({a})")
    return PairLink(min(a, b), max(a, b), link, nvlinks)


def is_upstream_pcie_root(root: str) -> bool:
    """Whether ``root`` has the upstream form ``pci<domain>:<bus>`` (Kubernetes' standard DRA
    attribute ``resource.kubernetes.io/pcieRoot``), rather than one tidelease derived."""
    return _UPSTREAM_PCIE_ROOT.fullmatch(root) is not None


# --- scoring ---


class GroupScore(NamedTuple):
    """How tight a group of devices is; a lesser score is tighter (tuples compare in order):

    1. ``worst``: the loosest link inside the group;
    2. ``total``: the sum of its pairs' links (as :class:`Link` values), fewer loose pairs first;
    3. ``fewer_nvlinks``: minus the NVLinks between its pairs, more bandwidth first.

    A group of one device (no pairs) scores ``(NVLINK, 0, 0)``: nothing is tighter.
    """

    worst: Link
    total: int
    fewer_nvlinks: int


def link_table(topology: NodeTopology) -> dict[tuple[int, int], PairLink]:
    """The topology's links by pair ``(a, b)``, ``a < b``; build once to score many groups."""
    return {(p.a, p.b): p for p in topology.links}


def link_between(table: Mapping[tuple[int, int], PairLink], a: int, b: int) -> PairLink:
    """The link between two devices; ACROSS_SOCKETS (the loosest) when it is not known."""
    key = (min(a, b), max(a, b))
    return table.get(key) or PairLink(key[0], key[1], Link.ACROSS_SOCKETS)


def group_score(table: Mapping[tuple[int, int], PairLink], group: Iterable[int]) -> GroupScore:
    """The :class:`GroupScore` of the devices ``group`` (indexes) with the links of ``table``."""
    pairs = [link_between(table, a, b) for a, b in combinations(sorted(set(group)), 2)]
    if not pairs:
        return GroupScore(Link.NVLINK, 0, 0)
    return GroupScore(
        worst=max(p.link for p in pairs),
        total=sum(int(p.link) for p in pairs),
        fewer_nvlinks=-sum(p.nvlinks for p in pairs),
    )


# Groups :func:`choose` searches at most, per choice: every request on a node of 16 GPUs of one
# class (C(16, 8) = 12,870 groups; the search cuts most: 0.5-5 ms on one core, against 40-55 ms
# scoring them all, benchmarks/bench_topology.py). Past it, the lowest indexes (the choice
# without topology).
MAX_GROUPS: Final = 13_000
# More NVLinks than the pairs of any group have together (NVLink 5: 18 a GPU), so that a group's
# total and NVLinks fold into one number.
_NVLINK_SPAN: Final = 1 << 20


def choose(
    topology: NodeTopology | None, wants: Sequence[tuple[Sequence[int], int]]
) -> tuple[tuple[int, ...], ...]:
    """The devices to take, per class: ``wants`` lists, per device class of a placement plan,
    the free devices' indexes (in the order to prefer, lowest first) and how many to take.
    The answer takes exactly that many of each class, each class's indexes in the order given:
    of all such groups, the one with the least :func:`group_score`, a tie going to the group
    whose indexes come first (class by class).

    So a node without topology, a group of one device, or a class taken whole gets the first
    indexes of each class, as placement picked before topology was known. Where there are more
    than :data:`MAX_GROUPS` groups to score, the first indexes too (documented: a node of more
    than 16 GPUs of one class, or several large classes). Raises ValueError where a class has
    fewer candidates than asked."""
    for candidates, n in wants:
        if n < 0 or n > len(candidates):
            raise ValueError(f"{n} devices asked of {len(candidates)}")
    first = tuple(tuple(candidates[:n]) for candidates, n in wants)
    total = sum(n for _, n in wants)
    groups = math.prod(math.comb(len(candidates), n) for candidates, n in wants)
    if topology is None or total <= 1 or groups <= 1 or groups > MAX_GROUPS:
        return first
    link, weight = pair_tables(topology, {i for candidates, _ in wants for i in candidates})
    return _search(wants, link, weight)


def pair_tables(
    topology: NodeTopology, devices: Iterable[int]
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """For every ordered pair of ``devices``: its link, and its weight, one number ordering
    like a GroupScore's total and NVLinks (the sum over a group is (total, fewer_nvlinks) in
    one integer; its loosest link apart)."""
    table = link_table(topology)
    link: dict[tuple[int, int], int] = {}
    weight: dict[tuple[int, int], int] = {}
    for a, b in combinations(sorted(set(devices)), 2):
        known = link_between(table, a, b)
        link[a, b] = link[b, a] = int(known.link)
        weight[a, b] = weight[b, a] = int(known.link) * _NVLINK_SPAN - known.nvlinks
    return link, weight


def _search(
    wants: Sequence[tuple[Sequence[int], int]],
    link: Mapping[tuple[int, int], int],
    weight: Mapping[tuple[int, int], int],
) -> tuple[tuple[int, ...], ...]:
    """:func:`choose`'s answer: the least (loosest link, summed weight) over the groups, the
    first of equals in the order ``product`` of each class's ``combinations`` lists them.

    Depth first in that very order, a device at a time, so that a branch can be cut: the
    loosest link of a group only grows as devices join it, and the devices still to come add
    at least the least of their weights to the group so far (each the sum over its members,
    class quotas aside) and the least pair weight among themselves. A branch that cannot beat
    the best group found, or only equal it, holds groups that come later in the order: none of
    them would be the answer. So the answer is the exhaustive search's, found in a tenth of its
    time or less for 8 of 16 GPUs (benchmarks/bench_topology.py).
    """
    total = sum(n for _, n in wants)
    least = min(weight.values())
    group: list[int] = []
    picks: list[list[int]] = [[] for _ in wants]
    best: list[tuple[int, int, tuple[tuple[int, ...], ...]]] = []

    def extend(cls: int, start: int, worst: int, summed: int) -> None:
        while cls < len(wants) and len(picks[cls]) == wants[cls][1]:
            cls, start = cls + 1, 0
        if cls == len(wants):
            if not best or (worst, summed) < best[0][:2]:
                best[:] = [(worst, summed, tuple(tuple(p) for p in picks))]
            return
        candidates, n = wants[cls]
        need = n - len(picks[cls])
        size = len(group) + 1
        rest = total - size  # devices still to come once d joins
        among = rest * (rest - 1) // 2 * least  # their pairs among themselves, at least
        for j in range(start, len(candidates) - need + 1):
            d = candidates[j]
            w, s = worst, summed
            for c in group:
                w = max(w, link[d, c])
                s += weight[d, c]
            if best:
                if w > best[0][0]:
                    continue
                if rest:
                    joined = [*group, d]
                    later = [*candidates[j + 1 :], *(i for c, _ in wants[cls + 1 :] for i in c)]
                    costs = sorted(sum(weight[e, c] for c in joined) for e in later)
                    bound = s + sum(costs[:rest]) + among
                else:
                    bound = s
                if (w, bound) >= best[0][:2]:
                    continue
            group.append(d)
            picks[cls].append(d)
            extend(cls, j + 1, w, s)
            group.pop()
            picks[cls].pop()

    extend(0, 0, 0, 0)
    return best[0][2]


def within(topology: NodeTopology | None, group: Iterable[int], loosest: Link) -> bool:
    """Whether every two devices of ``group`` are joined by ``loosest`` or tighter; a group of
    one device always is, a larger one never on a node without topology."""
    indexes = sorted(set(group))
    if len(indexes) <= 1:
        return True
    if topology is None:
        return False
    return group_score(link_table(topology), indexes).worst <= loosest


def tightness(score: GroupScore, size: int) -> float:
    """A group's score as a number in [0, 1], 1 the tightest (every pair NVLinked), 0 the
    loosest (every pair across sockets): 3/4 its loosest link, 1/4 its mean link."""
    pairs = size * (size - 1) // 2
    if pairs == 0:
        return 1.0
    loosest = float(Link.ACROSS_SOCKETS)
    return 1.0 - (0.75 * score.worst + 0.25 * score.total / pairs) / loosest


# --- the GpuNode's JSON (status.topology) ---


def to_json(topology: NodeTopology) -> dict[str, Any]:
    """``status.topology``: ``devices`` (``index``, ``numaNode``, ``pcieRoot``, each left out when
    unknown) and ``links`` (``a``, ``b``, ``link``, ``nvlinks`` when NVLinked)."""
    devices = [
        {
            "index": p.index,
            **({"numaNode": p.numa_node} if p.numa_node is not None else {}),
            **({"pcieRoot": p.pcie_root} if p.pcie_root is not None else {}),
        }
        for p in topology.placements
    ]
    links = [
        {
            "a": p.a,
            "b": p.b,
            "link": LINK_NAMES[p.link],
            **({"nvlinks": p.nvlinks} if p.link is Link.NVLINK else {}),
        }
        for p in topology.links
    ]
    return {"devices": devices, "links": links}


def from_json(value: object, where: str = "topology") -> NodeTopology | None:
    """Parse ``status.topology``: None when absent; raise :class:`InvalidInput` naming every
    problem when it does not parse."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where} must be an object")
    problems: list[str] = []
    placements = _placements(value.get("devices"), f"{where}.devices", problems)
    known = {p.index for p in placements}
    links = _links(value.get("links"), f"{where}.links", known, problems)
    if problems:
        raise InvalidInput(problems)
    return make(placements, links)


def _entries(value: object, where: str, problems: list[str]) -> list[tuple[str, Mapping[str, Any]]]:
    """The objects of a list field, each with where it is; problems for anything else."""
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where} must be a list")
        return []
    found: list[tuple[str, Mapping[str, Any]]] = []
    for i, entry in enumerate(value):
        if isinstance(entry, Mapping):
            found.append((f"{where}[{i}]", entry))
        else:
            problems.append(f"{where}[{i}] must be an object")
    return found


def _placements(value: object, where: str, problems: list[str]) -> list[Placement]:
    found: dict[int, Placement] = {}
    for at, entry in _entries(value, where, problems):
        index, numa, root = entry.get("index"), entry.get("numaNode"), entry.get("pcieRoot")
        if not whole(index) or index < 0:
            problems.append(f"{at}.index must be a non-negative integer")
            continue
        if index in found:
            problems.append(f"{at}.index {index} appears twice")
            continue
        if numa is not None and not (whole(numa) and numa >= 0):
            problems.append(f"{at}.numaNode must be a non-negative integer")
            continue
        if root is not None and not (isinstance(root, str) and 0 < len(root) <= MAX_PCIE_ROOT):
            problems.append(f"{at}.pcieRoot must be a string of 1 to {MAX_PCIE_ROOT} characters")
            continue
        found[index] = Placement(index, numa, root)
    return list(found.values())


def _links(value: object, where: str, known: set[int], problems: list[str]) -> list[PairLink]:
    found: dict[tuple[int, int], PairLink] = {}
    for at, entry in _entries(value, where, problems):
        a, b, name = entry.get("a"), entry.get("b"), entry.get("link")
        nvlinks = entry.get("nvlinks", 0)
        link = _LINKS_BY_NAME.get(name) if isinstance(name, str) else None
        if not (whole(a) and whole(b) and a in known and b in known and a != b):
            problems.append(f"{at}: a and b must be two distinct indexes listed in devices")
            continue
        if link is None:
            problems.append(f"{at}.link must be one of {', '.join(_LINKS_BY_NAME)}")
            continue
        if not whole(nvlinks) or nvlinks < 0 or (nvlinks > 0) != (link is Link.NVLINK):
            problems.append(f"{at}.nvlinks must be a positive integer for NVLink, else absent")
            continue
        p = pair(a, b, link, nvlinks)
        if (p.a, p.b) in found:
            problems.append(f"{at}: the pair {p.a}-{p.b} appears twice")
            continue
        found[(p.a, p.b)] = p
    return list(found.values())
