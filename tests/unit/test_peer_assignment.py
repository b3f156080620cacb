"""Shard assignment: earliest completion equals brute force; the shard-size rule; stealing."""

from __future__ import annotations

import itertools
import random

import pytest

from nodeagent.pulling.assignment import (
    LinkModel,
    Shard,
    assign,
    choose_shard_size,
    cut_shards,
    lower_bound,
    makespan,
    shard_size_window,
    steal,
)

MIB = 1 << 20


def brute_force(shards: list[Shard], links: list[LinkModel]) -> float:
    best = float("inf")
    for choice in itertools.product(range(len(links)), repeat=len(shards)):
        queues: dict[str, list[Shard]] = {link.name: [] for link in links}
        for shard, i in zip(shards, choice, strict=True):
            queues[links[i].name].append(shard)
        best = min(best, makespan(queues, links))
    return best


def random_links(rng: random.Random, n: int) -> list[LinkModel]:
    return [
        LinkModel(
            f"l{i}",
            rate=rng.choice([10, 25, 40, 100, 333]) * MIB,
            latency_s=rng.choice([0.0, 0.001, 0.02, 0.3]),
            start_s=rng.choice([0.0, 0.0, 0.05, 1.0]),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", range(60))
def test_earliest_completion_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n_links = rng.randint(1, 3)
    pieces = rng.randint(1, 7)
    piece = MIB
    size = pieces * piece - (rng.randint(1, piece - 1) if rng.random() < 0.5 else 0)
    shards = list(cut_shards(range(pieces), size=size, piece_size=piece, shard_pieces=1))
    links = random_links(rng, n_links)
    got = assign(shards, links)
    assert sorted(s.first_piece for q in got.queues.values() for s in q) == list(range(pieces))
    assert got.makespan_s == pytest.approx(makespan(dict(got.queues), links))
    assert got.makespan_s == pytest.approx(brute_force(shards, links), rel=1e-12)


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        pytest.param([100, 100], {"l0": 3, "l1": 3}, id="equal-links-split-evenly"),
        pytest.param([200, 100], {"l0": 4, "l1": 2}, id="twice-the-rate-twice-the-shards"),
        pytest.param([1000, 1], {"l0": 6, "l1": 0}, id="hopeless-link-gets-nothing"),
    ],
)
def test_assignment_follows_rates(rates: list[int], expected: dict[str, int]) -> None:
    shards = cut_shards(range(6), size=6 * MIB, piece_size=MIB, shard_pieces=1)
    links = [LinkModel(f"l{i}", rate=r * MIB) for i, r in enumerate(rates)]
    got = assign(shards, links)
    assert {k: len(v) for k, v in got.queues.items()} == expected


def test_mixed_sizes_assign_everything_once() -> None:
    shards = cut_shards([0, 1, 2, 5, 6, 9], size=10 * MIB, piece_size=MIB, shard_pieces=2)
    assert [(s.first_piece, s.pieces) for s in shards] == [(0, 2), (2, 1), (5, 2), (9, 1)]
    links = [LinkModel("a", rate=MIB), LinkModel("b", rate=2 * MIB)]
    got = assign(shards, links)
    assert sorted(s.first_piece for q in got.queues.values() for s in q) == [0, 2, 5, 9]
    assert got.makespan_s >= lower_bound(6 * MIB, links) - 1e-9


def test_cut_shards_last_piece_short() -> None:
    shards = cut_shards(range(3), size=2 * MIB + 10, piece_size=MIB, shard_pieces=2)
    assert [(s.offset, s.length) for s in shards] == [(0, 2 * MIB), (2 * MIB, 10)]


def test_lower_bound_is_fluid_optimum() -> None:
    links = [LinkModel("a", rate=100.0, latency_s=1.0), LinkModel("b", rate=100.0)]
    # b alone for 1 s (100 bytes), then both: 200 bytes/s.
    assert lower_bound(300, links) == pytest.approx(2.0)
    assert lower_bound(50, links) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("total", "latency_s", "rate", "links", "window"),
    [
        # 5 ms at 100 MiB/s: 0.5 MiB delay-bandwidth, /5 % = 10 MiB; 1 GiB / (4 * 3) = 85 MiB.
        pytest.param(1 << 30, 0.005, 100 * MIB, 3, (12 * MIB, 84 * MIB), id="room-to-choose"),
        pytest.param(8 * MIB, 0.005, 100 * MIB, 3, (12 * MIB, 4 * MIB), id="small-file-empty"),
        pytest.param(1 << 30, 0.0, 100 * MIB, 2, (4 * MIB, 128 * MIB), id="no-latency"),
    ],
)
def test_shard_size_window(
    total: int, latency_s: float, rate: float, links: int, window: tuple[int, int]
) -> None:
    models = [LinkModel(f"l{i}", rate=rate, latency_s=latency_s) for i in range(links)]
    assert shard_size_window(total, models, piece_size=4 * MIB) == window


def test_shard_size_choice_inside_window_and_best_predicted() -> None:
    links = [
        LinkModel("a", rate=40 * MIB, latency_s=0.01),
        LinkModel("b", rate=80 * MIB, latency_s=0.005),
        LinkModel("c", rate=160 * MIB, latency_s=0.002),
    ]
    total = 1 << 30
    choice = choose_shard_size(total, links, piece_size=4 * MIB)
    low, high = shard_size_window(total, links, piece_size=4 * MIB)
    assert low <= choice.shard_bytes <= high
    assert choice.shard_bytes % (4 * MIB) == 0
    assert choice.reason == "window"
    # Overhead rule holds on every link, and there are several shards per link.
    for link in links:
        assert link.latency_s <= 0.05 * choice.shard_bytes / link.rate + 1e-12
    assert total / choice.shard_bytes >= 4 * len(links)
    # Within 5 % of the fluid bound, and no other piece multiple in the window predicts better.
    assert choice.predicted_s <= 1.05 * lower_bound(total, links)
    for s in range(low, high + 1, 4 * MIB):
        shards = cut_shards(range(256), size=total, piece_size=4 * MIB, shard_pieces=s // (4 * MIB))
        assert assign(shards, links).makespan_s >= choice.predicted_s * 0.97


def test_shard_size_choice_falls_back_when_window_empty() -> None:
    links = [LinkModel("a", rate=100 * MIB, latency_s=0.05)]
    choice = choose_shard_size(8 * MIB, links, piece_size=MIB)
    assert choice.reason.startswith("no size")
    assert choice.shard_bytes == 8 * MIB  # one request: latency dominates


def test_steal_moves_last_shard_when_it_finishes_earlier() -> None:
    shards = list(cut_shards(range(4), size=4 * MIB, piece_size=MIB, shard_pieces=1))
    links = {"slow": LinkModel("slow", rate=MIB), "fast": LinkModel("fast", rate=10 * MIB)}
    queues = {"slow": shards[:3], "fast": []}
    moved = steal(links["fast"], queues, links, 0.0, {"slow": 1.0})
    assert moved == ("slow", shards[2])


def test_steal_leaves_shard_that_would_finish_later() -> None:
    shards = list(cut_shards(range(2), size=2 * MIB, piece_size=MIB, shard_pieces=1))
    links = {"fast": LinkModel("fast", rate=10 * MIB), "slow": LinkModel("slow", rate=MIB)}
    assert steal(links["slow"], {"fast": shards, "slow": []}, links, 0.0, {}) is None
