"""Health rules, every one, and recovery after the quiet period."""

from __future__ import annotations

import pytest

from common.model import Health
from nodeagent.health import HealthSettings, HealthTracker
from nodeagent.nvml import Sample, XidEvent

U = "GPU-0"
QUIET = 300.0


def ok(**kw: object) -> Sample:
    base: dict[str, object] = {
        "uuid": U,
        "ecc_uncorrected_volatile": 0,
        "remap_pending": False,
        "remap_failed": False,
        "retired_pages_pending": False,
    }
    base.update(kw)
    return Sample(**base)  # type: ignore[arg-type]


def tracker(**kw: object) -> HealthTracker:
    return HealthTracker([U], HealthSettings(quiet_period_s=QUIET, **kw))  # type: ignore[arg-type]


def test_starts_unknown_then_healthy() -> None:
    t = tracker()
    assert t.state(U).health is Health.UNKNOWN
    assert t.on_sample(ok(), 0.0)
    assert t.state(U).health is Health.HEALTHY


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored(xid: int) -> None:
    t = tracker()
    t.on_sample(ok(), 0)
    assert not t.on_event(XidEvent(U, xid), 1)
    assert t.state(U).health is Health.HEALTHY


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95, 119])
def test_critical_xids_make_unhealthy(xid: int) -> None:
    t = tracker()
    t.on_sample(ok(), 0)
    assert t.on_event(XidEvent(U, xid), 1)
    assert t.state(U).health is Health.UNHEALTHY
    assert f"XID {xid}" in t.state(U).reason


def test_ignored_xids_are_configurable_but_79_always_counts() -> None:
    t = tracker(ignored_xids=frozenset({48, 79}))
    t.on_sample(ok(), 0)
    assert not t.on_event(XidEvent(U, 48), 1)
    assert t.on_event(XidEvent(U, 79), 2)
    t2 = tracker(ignored_xids=frozenset())
    t2.on_sample(ok(), 0)
    assert t2.on_event(XidEvent(U, 13), 1)


@pytest.mark.parametrize(
    ("sample", "reason"),
    [
        (ok(lost=True, errors=("x: GPU is lost",)), "GPU is lost"),
        (ok(remap_pending=True), "row remap pending"),
        (ok(remap_failed=True), "row remapping failed"),
        (ok(retired_pages_pending=True), "retired pages pending"),
    ],
    ids=["lost", "remap-pending", "remap-failed", "retired-pages"],
)
def test_standing_conditions(sample: Sample, reason: str) -> None:
    t = tracker()
    t.on_sample(ok(), 0)
    assert t.on_sample(sample, 1)
    assert t.state(U).health is Health.UNHEALTHY
    assert reason in t.state(U).reason


def test_uncorrectable_ecc_rise() -> None:
    t = tracker()
    t.on_sample(ok(ecc_uncorrected_volatile=5), 0)  # a count at start is history, not news
    assert t.state(U).health is Health.HEALTHY
    assert t.on_sample(ok(ecc_uncorrected_volatile=7), 1)
    assert "2 new uncorrectable ECC" in t.state(U).reason


def test_failing_nvml_call_is_unknown_not_unhealthy() -> None:
    t = tracker()
    t.on_sample(ok(), 0)
    assert t.on_sample(ok(errors=("nvmlDeviceGetRemappedRows: Unknown Error",)), 1)
    assert t.state(U).health is Health.UNKNOWN
    assert t.on_sample(ok(), 2)
    assert t.state(U).health is Health.HEALTHY


def test_throttling_is_reported_not_a_fault() -> None:
    t = tracker()
    t.on_sample(ok(clock_event_reasons=0x8 | 0x40), 0)
    assert t.state(U).health is Health.HEALTHY
    assert t.state(U).reason == "HW slowdown, HW thermal slowdown"


def test_recovery_after_quiet_period_from_an_xid() -> None:
    t = tracker()
    t.on_sample(ok(), 0)
    t.on_event(XidEvent(U, 48), 10)
    assert not t.on_sample(ok(), 10 + QUIET - 1)
    assert t.state(U).health is Health.UNHEALTHY
    assert "healthy again after 1 s" in t.state(U).reason
    assert t.on_sample(ok(), 10 + QUIET)
    assert t.state(U).health is Health.HEALTHY


def test_recovery_counts_from_the_last_reading_of_a_standing_condition() -> None:
    t = tracker()
    t.on_sample(ok(remap_pending=True), 0)
    t.on_sample(ok(remap_pending=True), 100)  # still pending: the clock restarts
    t.on_sample(ok(), 101)
    assert t.state(U).health is Health.UNHEALTHY
    t.on_sample(ok(), 100 + QUIET)
    assert t.state(U).health is Health.HEALTHY


def test_a_new_fault_during_the_quiet_period_restarts_it() -> None:
    t = tracker()
    t.on_sample(ok(), 0)
    t.on_event(XidEvent(U, 48), 0)
    t.on_event(XidEvent(U, 48), 200)
    t.on_sample(ok(), QUIET + 1)
    assert t.state(U).health is Health.UNHEALTHY
    t.on_sample(ok(), 200 + QUIET)
    assert t.state(U).health is Health.HEALTHY


def test_events_for_unknown_devices_are_ignored() -> None:
    t = tracker()
    assert not t.on_event(XidEvent("GPU-other", 79), 0)
    assert not t.on_sample(Sample(uuid="GPU-other", lost=True), 0)
