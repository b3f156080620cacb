"""The built-in cluster and trace: sizes, tier mix, the tide's shape, failures by tier."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import numpy as np
import pytest

from common.model import Tier
from extender.leasingsim.scenario import Role, draw_failures
from extender.leasingsim.tides import TideModel, default_cluster, default_trace, tide


def test_default_cluster_is_10k_gpus_with_more_reliable_online_nodes() -> None:
    nodes = default_cluster().expand(1)
    assert len(nodes) == 1250
    assert sum(n.gpus for n in nodes) == 10_000
    tiers = Counter(t for n in nodes for t in n.tiers)
    assert tiers[Tier.HA] / 10_000 == pytest.approx(0.70, abs=0.001)
    online = [t for n in nodes if n.role is Role.ONLINE for t in n.tiers]
    assert len(online) == 4800  # 48 % (weflex 4.3.1)
    assert online.count(Tier.HA) / len(online) == pytest.approx(0.74)
    assert default_cluster().expand(1) == nodes  # deterministic


def test_default_trace_sizes_online_jobs_to_the_online_nodes() -> None:
    nodes = list(default_cluster(0.1).expand(1))
    trace = default_trace(nodes, days=3, seed=1)
    online = sum(n.gpus for n in nodes if n.role is Role.ONLINE)
    assert sum(j.peak for j in trace.online) == online
    assert trace.minutes == 3 * 1440
    assert all(b.arrival < trace.minutes for b in trace.borrowers)
    assert {b.gpus for b in trace.borrowers} <= {1, 2, 4, 8}


def test_tide_peak_is_at_least_four_times_the_trough() -> None:
    trace = default_trace(list(default_cluster().expand(1)), days=14, seed=1)
    assert len(trace.online) == 12
    for job in trace.online:
        series = [job.demand_at(m) for m in range(0, trace.minutes, trace.step)]
        assert max(series) == job.peak
        assert max(series) >= 4 * min(series), job.name


def test_tide_daily_and_weekly_shape_with_noise() -> None:
    model = TideModel()
    rng = np.random.default_rng(5)
    demand = tide(14 * 1440, 5, peak=800, trough=0.2, phase=0.0, model=model, rng=rng)
    per_day = demand.reshape(14, 288)
    hour_of_low = per_day.argmin(axis=1) * 5 / 60
    assert all(2 <= h <= 6 for h in hour_of_low)  # the trough at night (UTC)
    assert all(day.max() > 3.5 * day.min() for day in per_day)
    start = datetime.fromtimestamp(1767571200, UTC)
    assert start.weekday() == 0  # minute 0 is a Monday
    weekday_high = per_day[:5].max(axis=1).mean()
    weekend_high = per_day[5:7].max(axis=1).mean()
    assert weekend_high < 0.92 * weekday_high
    assert len({tuple(day) for day in per_day[:5]}) == 5  # noise: no two weekdays alike


def test_generation_is_deterministic_in_the_seed() -> None:
    nodes = list(default_cluster(0.05).expand(1))
    a = default_trace(nodes, days=2, seed=7)
    assert default_trace(nodes, days=2, seed=7) == a
    assert default_trace(nodes, days=2, seed=8) != a


def test_failures_by_tier_la_most_ha_least() -> None:
    spec = default_cluster()
    nodes = spec.expand(1)
    failures = draw_failures(nodes, spec.failure_model, 14 * 1440, seed=1)
    tier_of = {(n.name, i): t for n in nodes for i, t in enumerate(n.tiers)}
    devices = Counter(tier_of.values())
    failed = Counter(tier_of[(f.node, f.index)] for f in failures)
    rate = {t: failed[t] / devices[t] / 14 for t in Tier}  # failures a device-day
    assert rate[Tier.LA] > 2 * rate[Tier.MA] > 4 * rate[Tier.HA] > 0
    # As the model says, within the draws' spread (over 1,000 failures a tier: about 3 %).
    for tier in Tier:
        assert rate[tier] == pytest.approx(spec.failure_model.rate(tier), rel=0.15), tier
    lo, hi = spec.failure_model.repair_hours
    assert all(lo * 60 <= f.repair <= hi * 60 for f in failures)
    assert failures == draw_failures(nodes, spec.failure_model, 14 * 1440, seed=1)
