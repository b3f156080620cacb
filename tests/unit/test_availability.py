"""Availability over a rolling window, tiers, and the history's persistence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import InvalidInput
from common.model import Health, Tier
from nodeagent.tiering import DAY, History, TierSettings, assessment_due, tier_for

W = 14 * DAY
U = "GPU-0"


@pytest.mark.parametrize(
    ("avail", "tier"),
    [(1.0, Tier.HA), (0.99999, Tier.MA), (0.97, Tier.MA), (0.9699, Tier.LA), (0.0, Tier.LA)],
)
def test_tier_thresholds(avail: float, tier: Tier) -> None:
    assert tier_for(avail) is tier


def test_healthy_over_observed_and_agent_downtime_is_not_down() -> None:
    h = History()
    h.record(U, Health.HEALTHY, 0, 97 * 3600)
    # the agent was down for a day: nothing recorded
    h.record(U, Health.UNHEALTHY, 121 * 3600, 124 * 3600)
    now = 124 * 3600
    assert h.availability(U, now, W) == pytest.approx(97 / 100)
    assert h.assess([U], now, W) == {U: Tier.MA}


def test_unknown_is_not_observed() -> None:
    h = History()
    h.record(U, Health.HEALTHY, 0, 100)
    h.record(U, Health.UNKNOWN, 100, 10_000)
    assert h.availability(U, 10_000, W) == 1.0


def test_never_observed_is_fully_available() -> None:
    assert History().assess([U], 0, W) == {U: Tier.HA}


def test_window_rolls_and_prune_keeps_the_answer() -> None:
    h = History()
    h.record(U, Health.UNHEALTHY, 0, DAY)
    h.record(U, Health.HEALTHY, DAY, 20 * DAY)
    assert h.availability(U, 14 * DAY, W) < 1.0
    assert h.availability(U, 15 * DAY + 1, W) == 1.0  # the bad day left the window
    before = h.availability(U, 16 * DAY, W)
    h.prune(16 * DAY, W)
    assert h.availability(U, 16 * DAY, W) == before
    assert h.intervals(U)[0][0] == 2 * DAY


def test_contiguous_readings_merge() -> None:
    h = History()
    for t in range(0, 100, 5):
        h.record(U, Health.HEALTHY, t, t + 5)
    assert h.intervals(U) == [(0.0, 100.0, True)]
    h.record(U, Health.UNHEALTHY, 100, 105)
    h.record(U, Health.HEALTHY, 200, 205)  # a gap: a new interval
    assert len(h.intervals(U)) == 3


def test_json_round_trip_and_bad_input() -> None:
    h = History()
    h.record(U, Health.HEALTHY, 0, 10)
    h.record(U, Health.UNHEALTHY, 10, 20)
    again = History.from_json(h.to_json())
    assert again.intervals(U) == h.intervals(U)
    for bad in ([], {U: "x"}, {U: [[1, 2]]}, {U: [[5, 1, 1]]}, {U: [["a", 2, 1]]}):
        with pytest.raises(InvalidInput):
            History.from_json(bad)


intervals = st.lists(
    st.tuples(st.integers(0, 30 * 86_400), st.integers(1, 86_400), st.booleans()), max_size=30
)


@given(intervals, st.integers(0, 40 * 86_400))
def test_same_history_same_tier(items: list[tuple[int, int, bool]], now: int) -> None:
    def build() -> History:
        h = History()
        for start, length, healthy in sorted(items):
            h.record(U, Health.HEALTHY if healthy else Health.UNHEALTHY, start, start + length)
        return h

    first, second = build(), build()
    assert first.assess([U], now, W) == second.assess([U], now, W)
    assert first.assess([U], now, W) == History.from_json(first.to_json()).assess([U], now, W)
    assert 0.0 <= first.availability(U, now, W) <= 1.0


def test_assessment_schedule() -> None:
    s = TierSettings()
    assert assessment_due(None, 0, s)
    assert not assessment_due(0, 14 * DAY - 1, s)
    assert assessment_due(0, 14 * DAY, s)
