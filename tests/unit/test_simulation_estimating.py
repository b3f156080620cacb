"""Figures over seeds: the mean, the Student-t interval (against the printed t table), and the
one-seed case that reads as a single run."""

from __future__ import annotations

import math

import pytest

from extender.leasingsim.estimating import (
    band,
    estimate,
    seeds_for,
    seeds_from,
    share,
    t_quantile,
)


@pytest.mark.parametrize(
    ("n", "t"),
    [(2, 12.706), (3, 4.303), (5, 2.776), (10, 2.262), (31, 2.042)],
    ids=lambda v: str(v),
)
def test_t_quantiles_match_the_table(n: int, t: float) -> None:
    assert t_quantile(n) == pytest.approx(t, abs=5e-4)


def test_one_value_has_no_interval() -> None:
    e = estimate([0.9993])
    assert (e.mean, e.low, e.high, e.half, e.n, e.spread) == (0.9993, 0.9993, 0.9993, 0.0, 1, False)


def test_interval_by_hand() -> None:
    e = estimate([1.0, 2.0, 3.0])  # mean 2, s = 1, t(2) = 4.303
    assert e.mean == pytest.approx(2.0)
    assert e.half == pytest.approx(4.3027 / math.sqrt(3), abs=1e-4)
    assert (e.low, e.high) == pytest.approx((2.0 - e.half, 2.0 + e.half))
    assert e.spread


def test_shares_are_clipped_to_one() -> None:
    e = share([1.0, 0.998, 1.0])
    assert e.high == 1.0
    assert e.low < e.mean < 1.0


def test_equal_values_have_an_empty_interval() -> None:
    e = estimate([5.0, 5.0, 5.0])
    assert (e.low, e.high, e.half) == (5.0, 5.0, 0.0)


def test_band_is_the_estimate_column_by_column() -> None:
    rows = [[1.0, 10.0], [2.0, 10.0], [4.0, 13.0]]
    mean, low, high = band(rows)
    for j in range(2):
        e = estimate([r[j] for r in rows])
        assert (mean[j], low[j], high[j]) == pytest.approx((e.mean, e.low, e.high))
    one = band([[3.0, 4.0]])
    assert [list(x) for x in one] == [[3.0, 4.0]] * 3


def test_seeds_count_up_from_the_first() -> None:
    assert seeds_from(1, 3) == (1, 2, 3)
    assert seeds_from(7, 1) == (7,)


def test_seeds_for_projects_the_seeds_that_would_confirm_a_mean() -> None:
    values = [0.9990, 0.9996, 0.9999]  # mean 0.9995, interval below 0.999 with three seeds
    assert estimate(values).low < 0.999 <= estimate(values).mean
    n = seeds_for(values, 0.999)
    assert n is not None
    assert n > 3
    e = estimate(values)
    sd = e.half * math.sqrt(3) / t_quantile(3)
    assert e.mean - t_quantile(n) * sd / math.sqrt(n) >= 0.999
    assert e.mean - t_quantile(n - 1) * sd / math.sqrt(n - 1) < 0.999
    assert seeds_for([0.9995, 0.9996, 0.9997], 0.999) == 3  # confirmed already
    assert seeds_for([0.998, 0.999, 0.9985], 0.999) is None  # the mean is below
    assert seeds_for([0.9995], 0.999) is None  # one seed: no spread to project
