"""The kale comparison's pieces: Kubernetes' HPA rules, the prelaunch window, the trace of sharp
rises, and the ordering docs/planner.md claims (planner violations below the HPA's)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from extender.plannersim.autoscalers import (
    AutoscalerSettings,
    Tick,
    forecast_autoscaler,
    hpa_autoscaler,
    simulate_ticks,
)
from extender.plannersim.comparison import (
    AUTOSCALER_COMPARISON,
    AUTOSCALER_HPA,
    AUTOSCALER_PLANNER,
)
from extender.plannersim.hpa import HpaSettings, HpaState, decide, recommend
from extender.plannersim.online import TRUE_MODEL, fitted_model
from extender.plannersim.surges import SurgeModel, surge_trace
from extender.plannersim.traces import MINUTES_PER_DAY, MINUTES_PER_WEEK, Trace

HPA = HpaSettings()


@pytest.mark.parametrize(
    ("ready", "unready", "util", "expected"),
    [
        (10, 0, 0.80, 10),  # on target
        (10, 0, 0.87, 10),  # ratio 1.09: within the 0.1 tolerance
        (10, 0, 0.73, 10),  # ratio 0.91: within the tolerance
        (10, 0, 0.90, 12),  # ratio 1.125: ceil(11.25)
        (10, 0, 1.00, 13),  # saturated: one round adds at most 1/target - 1
        (10, 0, 0.40, 5),  # ratio 0.5
        (10, 3, 1.00, 13),  # starting pods at 0 %: 10 / (0.8 * 13) = 0.96, within tolerance
        (10, 1, 1.00, 13),  # 10 / (0.8 * 11) = 1.14: ceil(1.14 * 11)
        (0, 4, 0.00, 4),  # no ready pod: no metric to act on
    ],
    ids=[
        "on-target",
        "tolerance-up",
        "tolerance-down",
        "scale-up",
        "saturated",
        "scale-down",
        "unready-dampens",
        "unready-still-up",
        "none-ready",
    ],
)
def test_replica_calculator(ready: int, unready: int, util: float, expected: int) -> None:
    assert recommend(ready, unready, util, HPA) == expected


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    state = HpaState()
    replicas, state = decide(state, 0.0, 10, 0, 0.8, HPA)
    assert replicas == 10
    t = 0.0
    while t < 285.0:  # load halves: the 10 of t = 0 stays the largest recommendation
        t += 15.0
        replicas, state = decide(state, t, 10, 0, 0.4, HPA)
        assert replicas == 10, t
    replicas, state = decide(state, 300.0, 10, 0, 0.4, HPA)
    assert replicas == 5  # 300 s on, the window holds only the low recommendations


def test_scale_up_is_limited_to_double_or_four_pods_per_period() -> None:
    eager = replace(HPA, target=0.1)  # would ask for 10x
    assert decide(HpaState(), 0.0, 10, 0, 1.0, eager)[0] == 20  # 100 %
    assert decide(HpaState(), 0.0, 2, 0, 1.0, eager)[0] == 6  # 4 pods beat 100 %
    _, state = decide(HpaState(), 0.0, 10, 0, 1.0, eager)
    # 5 s later, same period: the limit still counts from the 10 at the period's start
    assert decide(state, 5.0, 10, 10, 1.0, eager)[0] == 20
    assert decide(state, 15.0, 10, 10, 1.0, eager)[0] == 40  # a new period
    assert decide(HpaState(), 0.0, 80, 0, 1.0, eager)[0] == eager.max_replicas


def test_new_workers_are_useful_only_after_the_prelaunch_window() -> None:
    rate = np.full(60, TRUE_MODEL.predict(8) * 1.5)  # one hour, 50 % above 8 workers

    def more(seen: Tick) -> int | None:
        return 16 if seen.t_s == 15.0 else None

    s = AutoscalerSettings(prelaunch_s=600.0, pause_s=0.0)
    late = simulate_ticks("late", rate, s, 8, more)
    now = simulate_ticks("now", rate, replace(s, prelaunch_s=0.0), 8, more)
    assert late.workers[0] == 16  # GPUs held from the decision ...
    assert late.lag_min[9] > late.lag_min[5] > 0  # ... but lag grows until W has passed
    assert late.lag_min[12] < late.lag_min[10]  # then the backlog drains
    assert now.lag_min[5] < 0.5 < late.lag_min[5]
    assert late.mean_lag_min > 5 * now.mean_lag_min


def test_surge_trace_has_the_documented_shape_and_is_deterministic() -> None:
    trace = surge_trace(3)
    assert np.array_equal(trace.rate, surge_trace(3).rate)
    assert not np.array_equal(trace.rate, surge_trace(4).rate)
    assert trace.rate.size == 3 * MINUTES_PER_WEEK
    assert trace.history_weeks == 2
    quiet = surge_trace(3, model=SurgeModel(noise=0.0, spikes_per_week=0, day_sd=0.0))
    weekdays = quiet.rate.reshape(-1, MINUTES_PER_DAY)[[d for d in range(21) if d % 7 < 5]]
    day = np.median(weekdays, axis=0)
    assert day.argmin() == pytest.approx(240, abs=20)  # trough at 04:00 ...
    assert day.min() == pytest.approx(34_000, rel=0.1)  # ... of about 34k
    assert day.max() == pytest.approx(260_000, rel=0.05)  # evening peak of about 260k
    assert 19 * 60 <= day.argmax() <= 22 * 60 + 30
    for start, length, factor in ((450, 15, 2.0), (720, 10, 1.3), (1170, 10, 1.45)):
        before = weekdays[:, start - 30].mean()  # 30 min early: before any jittered rise
        after = weekdays[:, start + length + 30].mean()
        assert after / before > factor, start
    weekend = quiet.rate.reshape(-1, MINUTES_PER_DAY)[5]
    assert weekend[1200] > 1.1 * weekdays[0, 1200]


def _short(trace: Trace, days: int) -> Trace:
    return replace(trace, rate=trace.rate[: trace.eval_start + days * MINUTES_PER_DAY])


def test_planner_beats_the_hpa_on_sharp_rises() -> None:
    trace = _short(surge_trace(7, weeks=2), 2)
    fit = fitted_model(7)
    planner, _ = forecast_autoscaler(trace, AUTOSCALER_COMPARISON, AUTOSCALER_PLANNER, fit.model)
    hpa = hpa_autoscaler(trace, AUTOSCALER_COMPARISON, fit.model, AUTOSCALER_HPA)
    assert hpa.slo_violation > 0.05
    assert planner.slo_violation < hpa.slo_violation / 5
    assert planner.mean_lag_min < hpa.mean_lag_min / 2
    assert planner.gpu_hours <= 1.10 * hpa.gpu_hours
