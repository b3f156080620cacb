"""Kale 3.2-3.4: the worked examples, the NNLS fit, the forecaster, the plan and its output."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common import builders
from common.errors import InvalidInput
from extender.planner.autoscaling import Measurements, OnlineSettings, Reason, plan_online
from extender.planner.directives import (
    LeaseDirective,
    desired_patch,
    gpus_for,
    schedule_from_plan,
)
from extender.planner.forecasting import DAY_S, HOUR_S, WEEK_S, LastValue, Seasonal, fold
from extender.planner.stabilizing import stabilize, stabilize_with_reasons
from extender.planner.throughput import (
    CapacityTable,
    Form,
    Observation,
    ThroughputModel,
    fit_throughput,
    min_workers,
)
from extender.rightofreturn.lease import parse_gpu_lease

# Kale 3.4.1's example: synchronous job, M = 16,384, theta0..theta3 as printed.
EXAMPLE = ThroughputModel(Form.SYNC, (0.00035, 2.5726, 0.9824, 0.02786), scale=16384)


def test_kale_example_ten_workers_carry_30000_samples() -> None:
    # The paper prints f_sync(10) = 30,007.3; its rounded thetas give 30,005.5 (0.006 % off).
    assert EXAMPLE.predict(10) == pytest.approx(30007.3, rel=1e-4)
    assert EXAMPLE.predict(9) < 30000 < EXAMPLE.predict(10)
    assert min_workers(EXAMPLE, 30000) == 10
    assert CapacityTable.build(EXAMPLE, 1, 64).min_workers(30000) == 10


def test_eq10_none_when_no_count_is_enough() -> None:
    # This job peaks near 10 workers (the theta3 * w term): 40,000 samples/s is out of reach.
    assert min_workers(EXAMPLE, 40000, highest=256) is None
    assert CapacityTable.build(EXAMPLE, 1, 256).min_workers(40000) is None


@pytest.mark.parametrize(
    ("plan", "tau_s", "rho", "expected"),
    [
        pytest.param(
            [4, 4, 5, 6, 6, 6], 900, 1, (4, 4, 6, 6, 6, 6), id="kale-case-study-tau-15min"
        ),
        pytest.param([4, 4, 5, 6, 6, 6], 600, 1, (4, 4, 5, 6, 6, 6), id="default-tau-keeps-10min"),
        pytest.param([4, 4, 5, 6, 6, 6], 900, 2, (4, 4, 5, 6, 6, 6), id="rho-2-ignores-steps-of-1"),
        pytest.param([6, 6, 4, 6, 6], 900, 1, (6, 6, 6, 6, 6), id="short-dip-filled"),
        pytest.param([4, 4, 8, 4, 4], 900, 1, (4, 4, 4, 4, 4), id="short-burst-flattened"),
        pytest.param([4, 4, 8, 8, 4], 900, 1, (4, 4, 8, 8, 4), id="20min-run-kept"),
        pytest.param([4, 4, 4, 4, 8], 900, 1, (4, 4, 4, 4, 8), id="run-at-the-end-kept"),
    ],
)
def test_algorithm_1(plan: list[int], tau_s: float, rho: int, expected: tuple[int, ...]) -> None:
    assert stabilize(plan, 600, rho=rho, tau_s=tau_s) == expected


def test_algorithm_1_reports_its_calibrations() -> None:
    _, done = stabilize_with_reasons([4, 4, 5, 6, 6, 6], 600, tau_s=900)
    assert [(c.start, c.end, c.value, c.duration_s) for c in done] == [(1, 3, 6, 600)]


@pytest.mark.parametrize("form", [Form.SYNC, Form.ASYNC], ids=["sync-eq6", "async-eq9"])
def test_nnls_recovers_known_parameters(form: Form) -> None:
    theta = (0.02, 1.6, 0.3, 0.0004) if form is Form.SYNC else (0.5, 0.2, 0.004)
    truth = ThroughputModel(form, theta, scale=16384 if form is Form.SYNC else 256)
    obs = [Observation(w, truth.predict(w)) for w in (1, 2, 4, 8, 16, 32, 64)]
    fit = fit_throughput(obs, form, truth.scale)
    assert fit.model.theta == pytest.approx(theta, rel=1e-6, abs=1e-9)
    assert fit.mape < 1e-6


def test_nnls_with_noise_predicts_within_a_few_percent_and_stays_non_negative() -> None:
    truth = ThroughputModel(Form.SYNC, (0.02, 1.6, 0.3, 0.0), scale=16384)
    rng = np.random.default_rng(3)
    obs = [
        Observation(w, truth.predict(w) * float(rng.normal(1, 0.02)))
        for w in (2, 4, 8, 16, 32, 48, 64)
        for _ in range(4)
    ]
    fit = fit_throughput(obs, Form.SYNC, 16384)
    assert all(t >= 0 for t in fit.model.theta)
    for w in (3, 12, 40):
        assert fit.model.predict(w) == pytest.approx(truth.predict(w), rel=0.04)


def test_nnls_refuses_too_few_worker_counts() -> None:
    with pytest.raises(InvalidInput, match="4 distinct"):
        fit_throughput([Observation(2, 10.0), Observation(4, 19.0)], Form.SYNC)


def _tide(t: float) -> float:
    hour = (t % DAY_S) / HOUR_S
    weekend = (t % WEEK_S) >= 5 * DAY_S
    daily = 0.55 - 0.45 * math.cos(2 * math.pi * (hour - 3) / 24)
    return 100_000 * daily * (1.3 if weekend else 1.0)


def test_seasonal_forecaster_captures_daily_and_weekly_tides() -> None:
    step = 300.0
    history = [(k * step, _tide(k * step)) for k in range(int(2 * WEEK_S / step))]
    f = Seasonal()
    state = fold(f, history)
    week3 = [2 * WEEK_S + k * step for k in range(int(WEEK_S / step))]
    errors = [abs(f.predict(state, t) - _tide(t)) / _tide(t) for t in week3]
    assert float(np.mean(errors)) < 0.03
    # The weekend is higher than the weekday at the same hour, and the forecast knows it.
    sat, mon = 2 * WEEK_S + 5 * DAY_S + 15 * HOUR_S, 2 * WEEK_S + 15 * HOUR_S
    assert f.predict(state, sat) / f.predict(state, mon) == pytest.approx(1.3, rel=0.05)
    # The null forecaster does much worse on the same tide.
    last = LastValue()
    s0 = fold(last, history)
    assert abs(last.predict(s0, sat) - _tide(sat)) / _tide(sat) > 0.3


SETTINGS = OnlineSettings(step_s=600, horizon_steps=6, lead_s=1200, pause_s=0, tau_s=600)
LINEAR = ThroughputModel(Form.ASYNC, (1.0, 0.0, 0.0), scale=1000)  # 1000 samples/s per worker


def test_plan_asks_ahead_by_the_prelaunch_window() -> None:
    calm = Measurements(workers=2, rate=1500, backlog=0, lag_s=0)
    # The rise to 5 workers is 20 min (two steps) away: W = 20 min, so ask now.
    d = plan_online([1500, 1500, 4500, 4500, 4500, 4500, 4500], LINEAR, calm, SETTINGS)
    assert (d.workers, d.reason) == (5, Reason.FORECAST)
    # Three steps away: not yet.
    d = plan_online([1500, 1500, 1500, 4500, 4500, 4500, 4500], LINEAR, calm, SETTINGS)
    assert d.workers == 2


def test_plan_releases_only_when_the_window_no_longer_needs_it() -> None:
    busy = Measurements(workers=5, rate=4500, backlog=0, lag_s=0)
    d = plan_online([4500, 4500, 1500, 1500, 1500, 1500, 1500], LINEAR, busy, SETTINGS)
    assert d.workers == 5
    d = plan_online([1500] * 7, LINEAR, busy, SETTINGS)
    assert d.workers == 2


def test_lag_fallback_scales_reactively() -> None:
    late = Measurements(workers=2, rate=1500, backlog=900_000, lag_s=900)
    d = plan_online([1500] * 7, LINEAR, late, SETTINGS)
    # 1500/s plus 900,000 samples drained in 900 s: 2500/s -> 3 workers.
    assert (d.workers, d.reason) == (3, Reason.FALLBACK_LAG)


def test_settings_validate_every_problem() -> None:
    bad = OnlineSettings(step_s=0, horizon_steps=0, rho=0, min_workers=5, max_workers=2)
    assert len(bad.validate()) == 4


def test_directive_is_a_valid_gpulease_spec_change() -> None:
    lease = builders.gpu_lease(
        "recsys",
        "ml",
        gpus_per_replica=4,
        desired_gpus=32,
        schedule=[{"at": "08:00", "gpus": 32}],
        resource_version="1",
    )
    # A plan of 10-minute steps from 06:00: 2 workers, 6 from 07:00, back to 2 at 08:00.
    plan = [2] * 6 + [6] * 6 + [2] * 132
    entries = schedule_from_plan(
        plan, start_minute=360, step_min=10, lead_min=20, gpus_per_worker=1, gpus_per_replica=4
    )
    directive = LeaseDirective("ml", "recsys", schedule=entries, reason="forecast")
    patched = {**lease, "spec": {**lease["spec"], **directive.merge_patch()["spec"]}}
    spec = parse_gpu_lease(patched).spec
    # 6 workers round up to 8 GPUs (2 replicas of 4), asked 20 minutes early: 06:40.
    assert [(e.minute_of_day, e.gpus) for e in spec.schedule] == [(360, 4), (400, 8), (480, 4)]
    live = desired_patch("ml", "recsys", gpus_for(9, 1, 4), current_gpus=32, reason="forecast")
    assert live is not None
    assert live.merge_patch() == {"spec": {"desiredGPUs": 12, "schedule": None}}
    assert desired_patch("ml", "recsys", 32, current_gpus=32, reason="") is None


def test_schedule_fits_the_crd_limit() -> None:
    rng = np.random.default_rng(1)
    plan = [int(x) for x in rng.integers(1, 30, 288)]  # a change every 5 minutes
    entries = schedule_from_plan(plan, start_minute=0, step_min=5, lead_min=10)
    assert len(entries) <= 96
    # Never below the plan: every step's GPUs are at most the entry in force.
    in_force = sorted(entries, key=lambda e: e.minute_of_day)
    for k, w in enumerate(plan):
        minute = k * 5
        current = [e for e in in_force if e.minute_of_day <= minute][-1]
        assert current.gpus >= w
