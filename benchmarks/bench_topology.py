"""The topology-aware device choice (common.topology.choose) on nodes of 16 GPUs of one class,
where it scores the most groups: its branch-and-bound search against the exhaustive search it
replaced (every group of ``product`` of ``combinations``, the baseline), measured in the same
run, the two alternated, each answer checked equal to the baseline's.

    python -m benchmarks.bench_topology [--repeat 5] [--smoke]

Prints, per layout and group size, the milliseconds per choice (median of ``--repeat`` runs
over the same free-device sets) of each search and their ratio. Every free set is a distinct
free state of a node, which the extender's memo answers once (extender.scheduler.placement):
this is the time that one answer holds the event loop. ``--smoke``: one repeat, two free sets
and group sizes 2 and 4, to check that the script still works.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from itertools import combinations, product

from common import topology as topo
from common.topology import Link, NodeTopology

Wants = list[tuple[list[int], int]]


def pcie_16(nvlink_pairs: bool = False) -> NodeTopology:
    """16 PCIe GPUs: four switches of four, two switches a socket; with ``nvlink_pairs``,
    GPUs 2i and 2i+1 joined by 4 NVLinks as well."""
    placements = [topo.Placement(i, i // 8, f"pci0000:{i // 4:02x}") for i in range(16)]
    links = []
    for a, b in combinations(range(16), 2):
        if nvlink_pairs and a // 2 == b // 2:
            links.append(topo.pair(a, b, Link.NVLINK, 4))
        elif a // 4 == b // 4:
            links.append(topo.pair(a, b, Link.SAME_PCIE_SWITCH))
        elif a // 8 == b // 8:
            links.append(topo.pair(a, b, Link.SAME_NUMA_NODE))
        else:
            links.append(topo.pair(a, b, Link.ACROSS_SOCKETS))
    return topo.make(placements, links)


def nvswitch_16() -> NodeTopology:
    """16 GPUs on NVSwitches, 18 links each, two sockets: every group ties."""
    placements = [topo.Placement(i, i // 8) for i in range(16)]
    links = [topo.pair(a, b, Link.NVLINK, 18) for a, b in combinations(range(16), 2)]
    return topo.make(placements, links)


LAYOUTS: dict[str, Callable[[], NodeTopology]] = {
    "pcie-4switch-16": pcie_16,
    "nvlink-pairs-16": lambda: pcie_16(nvlink_pairs=True),
    "nvswitch-16": nvswitch_16,
}


def exhaustive(top: NodeTopology, wants: Wants) -> tuple[tuple[int, ...], ...]:
    """The search choose() did before: every group scored, each pair's link and weight looked
    up in tables built once, the first of the least kept."""
    link, weight = topo.pair_tables(top, {i for candidates, _ in wants for i in candidates})
    best: tuple[int, int, tuple[tuple[int, ...], ...]] | None = None
    for picks in product(*(combinations(c, n) for c, n in wants)):
        pairs = list(combinations([i for p in picks for i in p], 2))
        worst = max(link[q] for q in pairs)
        summed = sum(weight[q] for q in pairs)
        if best is None or (worst, summed) < best[:2]:
            best = (worst, summed, picks)
    assert best is not None
    return best[2]


def timed(
    search: Callable[[NodeTopology, Wants], tuple[tuple[int, ...], ...]],
    top: NodeTopology,
    cases: Sequence[Wants],
) -> tuple[float, list[tuple[tuple[int, ...], ...]]]:
    """Milliseconds per choice over ``cases``, and the answers."""
    start = time.perf_counter()
    answers = [search(top, wants) for wants in cases]
    return 1000 * (time.perf_counter() - start) / len(cases), answers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    repeat, sets, sizes = (1, 2, (2, 4)) if args.smoke else (args.repeat, 6, (2, 4, 8))
    rng = random.Random(16)
    free_sets = [list(range(16))] + [
        sorted(rng.sample(range(16), rng.randint(10, 15))) for _ in range(sets - 1)
    ]
    print(f"16 GPUs of one class; {len(free_sets)} free sets, median of {repeat} repeats")
    print(f"{'layout':<18}{'gpus':>5}{'exhaustive ms':>15}{'choose ms':>12}{'ratio':>9}")
    for name, build in LAYOUTS.items():
        top = build()
        for k in sizes:
            cases: list[Wants] = [[(free, k)] for free in free_sets]
            base: list[float] = []
            ours: list[float] = []
            for r in range(repeat):  # alternated, the order flipped every other repeat
                runs = [(base, exhaustive), (ours, topo.choose)]
                for into, search in runs if r % 2 == 0 else runs[::-1]:
                    ms, answers = timed(search, top, cases)
                    into.append(ms)
                    if search is topo.choose:
                        mine = answers
                    else:
                        want = answers
                if mine != want:
                    raise SystemExit(f"{name}, {k} GPUs: choose differs from the exhaustive search")
            b, o = statistics.median(base), statistics.median(ours)
            print(f"{name:<18}{k:>5}{b:>15.3f}{o:>12.3f}{o / b:>8.3f}x")
    print("every answer equal to the exhaustive search's")


if __name__ == "__main__":
    main()
