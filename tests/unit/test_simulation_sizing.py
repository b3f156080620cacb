"""The standby sizing search: which size answers, when the sweep stops, what it reports; and a
small generated run sized for real."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from extender.leasingsim.controlling import Policy
from extender.leasingsim.metrics import Series, summarize
from extender.leasingsim.scenario import Scenario, draw_failures
from extender.leasingsim.simulating import RunResult, SimSettings, simulate
from extender.leasingsim.sizing import (
    CAP_SHARE,
    SizingPoint,
    answer_of,
    default_sizes,
    point,
    sweep,
)
from extender.leasingsim.tides import default_cluster, default_trace


def fake(size: int, full: int, reclaims: int = 1000, *, seed: int = 1) -> RunResult:
    summary = summarize(
        policy="right-of-return",
        standby_gpus=size,
        series=Series(),
        ha_start=0.74,
        cluster_ha=0.7,
        reclaims=[],
        peak_gpus=0,
        total_gpus=100,
        step=5,
        evictions=0,
        finished=0,
        gave_up=0,
        elapsed_s=0.0,
    )
    summary = replace(summary, reclaims=reclaims, reclaims_full=full)
    settings = SimSettings(Policy.RIGHT_OF_RETURN, seed=seed, standby_gpus=size)
    return RunResult(settings, summary, Series(), [], {}, {}, {})


class Runs:
    """Answers ``run(sizes)`` from a table of full reclaims per size; records what it ran."""

    def __init__(self, full: dict[int, int]) -> None:
        self.full = full
        self.asked: list[list[int]] = []

    def __call__(self, sizes: Sequence[int]) -> list[RunResult]:
        self.asked.append(list(sizes))
        return [fake(s, self.full[s]) for s in sizes]


def pt(size: int, full: int) -> SizingPoint:
    return point(fake(size, full))


@pytest.mark.parametrize(
    ("fulls", "answer"),
    [
        ({0: 990, 8: 999, 16: 1000}, 8),
        ({0: 990, 8: 999, 16: 998, 24: 999, 32: 1000}, 24),  # 8 alone is not confirmed
        ({0: 990, 8: 995}, None),
        ({0: 990, 8: 999}, 8),  # the largest swept size, nothing to confirm it with
        ({0: 1000, 8: 1000}, 0),
    ],
    ids=["first", "confirmed", "none", "largest", "zero"],
)
def test_answer_is_the_smallest_size_confirmed_by_the_next(
    fulls: dict[int, int], answer: int | None
) -> None:
    assert answer_of([pt(s, f) for s, f in fulls.items()], 0.999) == answer


def test_sweep_stops_once_confirmed_and_reports_the_same_whatever_the_batch() -> None:
    fulls = {0: 900, 8: 990, 16: 999, 24: 1000, 32: 1000, 48: 1000}
    one = Runs(fulls)
    by_one = sweep(one, list(fulls), target=0.999, batch=1)
    assert by_one.answer == 16
    assert [p.size for p in by_one.points] == [0, 8, 16, 24]
    assert one.asked == [[0], [8], [16], [24]]
    three = Runs(fulls)
    by_three = sweep(three, list(fulls), target=0.999, batch=3)
    assert three.asked == [[0, 8, 16], [24, 32, 48]]
    assert by_three.answer == 16
    assert [p.size for p in by_three.points] == [0, 8, 16, 24]
    assert by_three.result_for(16) is not None
    assert by_three.result_for(32) is None


def test_sweep_without_an_answer_reports_every_size() -> None:
    runs = Runs({0: 900, 8: 950})
    out = sweep(runs, [8, 0, 8], target=0.999)
    assert out.answer is None
    assert [p.size for p in out.points] == [0, 8]


def test_default_sizes_are_whole_nodes_up_to_the_cap() -> None:
    assert default_sizes(10_000) == (
        *(0, 32, 56, 80, 104, 152, 200, 304, 400, 504),  # finer below 2 %, up to 5 % as before
        *(600, 704, 800, 904, 1000, 1104, 1200, 1304, 1400, 1504),  # whole percents ...
        *(1600, 1704, 1800, 1904, 2000),  # ... on to the cap
    )
    assert default_sizes(1_000) == (
        *(0, 8, 16, 24, 32, 40, 56, 64, 72, 80, 96, 104),
        *(112, 120, 136, 144, 152, 160, 176, 184, 192, 200),
    )
    assert all(s % 4 == 0 for s in default_sizes(1_000, node_gpus=4))
    assert max(default_sizes(10_000)) == CAP_SHARE * 10_000


def test_several_seeds_sweep_every_fourth_percent() -> None:
    assert default_sizes(10_000, seeds=3) == (0, 400, 800, 1200, 1600, 2000)
    assert default_sizes(10_000, seeds=1) == default_sizes(10_000)


def test_the_sweep_goes_past_five_percent_until_an_answer() -> None:
    sizes = default_sizes(1_000, seeds=3)
    fulls = {s: 990 if s < 100 else 1000 for s in sizes}
    runs = Runs(fulls)
    out = sweep(runs, sizes, target=0.999)
    assert out.answer == 120 > 0.10 * 1_000
    assert max(p.size for p in out.points) == 160  # confirmed by the next, then it stops
    assert [s for batch in runs.asked for s in batch] == [s for s in sizes if s <= 160]
    assert max(sizes) == 200 > 160


def small() -> Scenario:
    spec = default_cluster(0.05)  # 63 nodes, 504 GPUs
    nodes = spec.expand(2)
    trace = default_trace(list(nodes), days=3, seed=2)
    # failures four times as often as the model's, so that lent devices fail in three days
    model = replace(
        spec.failure_model,
        rates_per_day=tuple((t, 4 * r) for t, r in spec.failure_model.rates_per_day),
    )
    return Scenario(nodes, trace, draw_failures(nodes, model, trace.minutes, 2))


def test_a_standby_pool_stands_in_for_failed_lent_devices() -> None:
    """Without standby, a replica whose lent devices failed takes whatever it finds (foreign
    devices: a match only where of the same type and an equal or better tier, returned in
    kind); with a pool of whole nodes it takes standby devices on loan instead."""
    scenario = small()

    def run(sizes: Sequence[int]) -> list[RunResult]:
        return [
            simulate(scenario, SimSettings(Policy.RIGHT_OF_RETURN, seed=2, standby_gpus=s))
            for s in sizes
        ]

    out = sweep(run, [0, 32], target=0.999)
    none, pool = out.points
    assert (none.size, pool.size) == (0, 32)
    assert (none.lost > 0, none.foreign > 0, none.backfilled) == (True, True, 0)
    assert pool.backfilled > 0
    assert pool.foreign < none.foreign
    # Lost devices without a pool are matched in kind by what the replicas found, not all.
    assert 0 < none.shortfall < none.lost
    assert none.forfeited == pool.forfeited == 0  # nothing lent is ever given up
