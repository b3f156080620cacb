"""The simulator's metric definitions, each on values worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common.model import Tier
from extender.leasingsim.controlling import ReclaimRecord, matched
from extender.leasingsim.metrics import Series, summarize

HA, MA, LA = Tier.HA, Tier.MA, Tier.LA


@pytest.mark.parametrize(
    ("due", "got", "want"),
    [
        ({("H20", HA): 2}, {("H20", HA): 2}, 2),
        ({("H20", MA): 2}, {("H20", HA): 2}, 2),  # better tiers match
        ({("H20", HA): 2}, {("H20", MA): 2}, 0),  # worse ones do not
        ({("H20", HA): 1, ("H20", LA): 1}, {("H20", HA): 1, ("H20", MA): 1}, 2),
        # the HA device goes to the HA due one first, not to the LA one
        ({("H20", LA): 1, ("H20", HA): 1}, {("H20", HA): 1, ("H20", LA): 1}, 2),
        ({("H20", HA): 2}, {("A100", HA): 2}, 0),  # another type never matches
        ({("H20", HA): 1, ("A100", MA): 2}, {("H20", HA): 3, ("A100", HA): 1}, 2),
        ({("H20", HA): 3}, {}, 0),
    ],
    ids=["same", "better", "worse", "mixed", "best-first", "type", "two-types", "nothing"],
)
def test_matched_same_type_equal_or_better_tier(
    due: dict[tuple[str, Tier], int], got: dict[tuple[str, Tier], int], want: int
) -> None:
    assert matched(due, got) == want


def record(**kw: object) -> ReclaimRecord:
    base = ReclaimRecord(
        minute=0,
        job="j",
        due=8,
        returned=8,
        backfilled=0,
        foreign=0,
        matched=8,
        lost=0,
        forfeited=0,
        evicted=0,
        duration_s=46.0,
        grace_s=45.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "full", "timely", "shortfall"),
    [
        ({}, True, True, 0),
        ({"duration_s": 55.0}, True, True, 0),  # grace + 10 s exactly
        ({"duration_s": 55.5}, False, False, 0),  # placed a step later
        ({"returned": 7, "backfilled": 1, "matched": 8, "lost": 1}, True, True, 0),
        ({"returned": 0, "backfilled": 8, "matched": 7, "lost": 1}, False, True, 1),
        ({"returned": 0, "foreign": 8, "matched": 0, "lost": 1}, False, True, 8),
    ],
    ids=["back", "just-in-time", "late", "stand-in", "worse-stand-in", "foreign"],
)
def test_a_full_reclaim_is_matched_and_timely(
    kw: dict[str, object], full: bool, timely: bool, shortfall: int
) -> None:
    r = record(**kw)
    assert (r.full, r.timely, r.shortfall) == (full, timely, shortfall)


def series(held: list[int], ha: list[int], *, own: list[int] | None = None) -> Series:
    n = len(held)
    s = Series()
    s.minute = [i * 360 for i in range(n)]  # four steps a day
    s.online_demand = list(held)
    s.online_wanted = list(held)
    s.online_held = list(held)
    s.online_own = list(own or held)
    s.online_ha = list(ha)
    s.requested = [10] * n
    s.running = [5 if h < max(held) else 2 for h in held]
    s.on_lent = [0] * n
    s.lent = [0] * n
    s.standby = [0] * n
    s.unhealthy = [0] * n
    return s


def summary_of(s: Series, reclaims: list[ReclaimRecord] | None = None, start: float = 0.75):  # type: ignore[no-untyped-def]
    return summarize(
        policy="p",
        standby_gpus=0,
        series=s,
        ha_start=start,
        cluster_ha=0.7,
        reclaims=reclaims or [],
        peak_gpus=max(s.online_held),
        total_gpus=100,
        step=360,
        evictions=0,
        finished=0,
        gave_up=0,
        elapsed_s=0.0,
    )


def test_ha_share_is_taken_at_each_days_peak_of_the_jobs_gpus() -> None:
    # two days: peaks at steps 2 (8 held, 6 HA) and 6 (8 held, 5 HA); troughs hold 4; step 3
    # holds 6 with 3 HA: the lowest share of any step, but not at a peak
    s = series([4, 6, 8, 6, 4, 6, 8, 6], [3, 4, 6, 3, 3, 4, 5, 4])
    assert s.daily_peaks() == [2, 6]
    out = summary_of(s)
    assert (out.ha_end, out.ha_min, out.ha_max) == (5 / 8, 5 / 8, 6 / 8)
    assert out.ha_drift == pytest.approx(0.75 - 5 / 8)
    assert out.ha_steps_drift == pytest.approx(0.75 - 3 / 6)


def test_ha_share_counts_lent_devices_with_the_held_ones() -> None:
    # right of return: the jobs' GPUs are 8 all day (held + lent), 6 of them HA
    s = series([4, 8, 4, 8], [6, 6, 6, 6], own=[8, 8, 8, 8])
    out = summary_of(s)
    assert s.ha_share() == [0.75] * 4
    assert (out.ha_drift, out.ha_steps_drift) == (0.0, 0.0)


def test_fulfilment_in_the_troughs_and_at_the_peaks() -> None:
    s = series([4, 6, 8, 6, 4, 6, 8, 6], [3] * 8)
    out = summary_of(s)
    assert out.fulfilment_trough == 0.5  # demand 4 (the lowest quarter): 5 of 10
    assert out.fulfilment_peak == 0.2  # demand 8: 2 of 10
    assert out.fulfilment_mean == pytest.approx((6 * 0.5 + 2 * 0.2) / 8)


def test_reclaim_totals_skip_reclaims_with_nothing_due() -> None:
    rs = [record(), record(due=0, returned=0, matched=0), record(matched=7, backfilled=8)]
    out = summary_of(series([4, 8], [3, 6]), rs)
    assert (out.reclaims, out.reclaims_full, out.shortfall, out.due) == (2, 1, 1, 16)
    assert out.reclaims_full_ratio == 0.5
