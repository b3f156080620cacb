"""The reconcile loop on virtual time: bursts coalesce, a key never runs beside itself, failures
back off per key and never stop the others, resync and readiness come when promised, and every
controller's metrics share one registry."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from common.errors import Conflict, InvalidInput, Unavailable
from common.reconcile import (
    ControllerMetrics,
    ReconcileLoop,
    Reconciler,
    ReconcileSettings,
    Requeue,
    Result,
)
from tests.imports import imported

ROOT = Path(__file__).resolve().parents[2]
T0 = 1000.0


class VirtualTime:
    """The loop's clock and wait: time stands still while anything can run, and jumps to the
    loop's next deadline (or the next scripted action) once nothing can.

    The loop waits only when it has started what it can; the wait first lets every runnable
    task go (a few rounds of the event loop: the fake reconciles here await little), then moves
    the clock. Every run is the same run, however busy the machine is."""

    SPINS = 20

    def __init__(self) -> None:
        self.now = T0
        self._script: list[tuple[float, int, Callable[[], object]]] = []

    def clock(self) -> float:
        return self.now

    def at(self, when: float, action: Callable[[], object] = lambda: None) -> None:
        """Run ``action`` when virtual time reaches ``when`` (the loop's waits stop there)."""
        self._script.append((when, len(self._script), action))
        self._script.sort()

    async def wait(self, event: asyncio.Event, within_s: float | None) -> bool:
        for _ in range(self.SPINS):
            if event.is_set():
                return True
            await asyncio.sleep(0)
        deadline = float("inf") if within_s is None else self.now + within_s
        if self._script and self._script[0][0] <= deadline:
            when, _, action = self._script.pop(0)
            self.now = max(self.now, when)
            action()
            return event.is_set()
        if within_s is None:
            await event.wait()
            return True
        self.now = deadline
        return event.is_set()


def make(
    vt: VirtualTime,
    reconcile: Reconciler,
    *,
    name: str = "test",
    keys: Callable[[], list[str]] = list,
    registry: CollectorRegistry | None = None,
    **settings: Any,
) -> ReconcileLoop:
    return ReconcileLoop(
        name,
        reconcile,
        keys=keys,
        settings=ReconcileSettings(**settings),
        registry=registry,
        clock=vt.clock,
        wait=vt.wait,
    )


async def spin(rounds: int = 200) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def until(done: Callable[[], bool], task: asyncio.Task[None] | None = None) -> None:
    """Until ``done()``; a real-time guard only (virtual time makes it come in milliseconds)."""
    async with asyncio.timeout(3):
        while not done():
            if task is not None and task.done():
                task.result()
                pytest.fail("the loop returned")
            await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def running(
    loop: ReconcileLoop, ready: asyncio.Event | None = None
) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(loop.run(ready=ready))
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# --- the keyed queue ---


async def test_a_burst_of_adds_is_reconciled_once_in_order() -> None:
    vt = VirtualTime()
    calls: list[str] = []

    async def reconcile(key: str) -> Result:
        calls.append(key)
        return None

    loop = make(vt, reconcile, keys=lambda: ["b"])
    for _ in range(5):
        loop.add("a")
    loop.add("b")
    loop.add("a")
    assert loop.depth == 2
    vt.at(T0 + 10)
    async with running(loop) as task:
        await until(lambda: vt.now >= T0 + 10, task)
        await spin()
    # "b" was queued and is a known key too: still once
    assert calls == ["a", "b"]


async def test_a_key_added_while_reconciled_runs_once_more_afterwards_never_beside_itself() -> None:
    vt = VirtualTime()
    gate = asyncio.Event()
    calls: list[str] = []
    now_running = peak = 0

    async def reconcile(key: str) -> Result:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        calls.append(key)
        try:
            if len(calls) == 1:
                await gate.wait()
        finally:
            now_running -= 1
        return None

    loop = make(vt, reconcile, workers=4)
    loop.add("a")
    async with running(loop) as task:
        await until(lambda: calls == ["a"], task)
        for _ in range(3):
            loop.add("a")
        assert loop.depth == 1
        await spin()
        assert calls == ["a"]  # four workers, yet "a" waits for itself
        gate.set()
        await until(lambda: len(calls) == 2, task)
        await spin()
    assert calls == ["a", "a"]
    assert peak == 1


@pytest.mark.parametrize(("workers", "expected_peak"), [(1, 1), (3, 3)])
async def test_workers_bound_how_many_keys_run_at_once(workers: int, expected_peak: int) -> None:
    vt = VirtualTime()
    gate = asyncio.Event()
    done: list[str] = []
    now_running = peak = 0

    async def reconcile(key: str) -> Result:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        try:
            await gate.wait()
        finally:
            now_running -= 1
        done.append(key)
        return None

    loop = make(vt, reconcile, keys=lambda: ["a", "b", "c", "d"], workers=workers)
    async with running(loop) as task:
        await until(lambda: now_running == expected_peak, task)
        await spin()
        assert now_running == expected_peak
        assert loop.depth == 4 - expected_peak
        gate.set()
        await until(lambda: len(done) == 4, task)
    assert sorted(done) == ["a", "b", "c", "d"]
    assert peak == expected_peak


# --- retries and requeues ---


async def test_errors_back_off_per_key_doubling_to_the_cap_and_reset_on_success() -> None:
    vt = VirtualTime()
    times: list[float] = []

    async def reconcile(key: str) -> Result:
        times.append(vt.now)
        if len(times) == 7:
            return Requeue(100.0)
        raise Unavailable("the API server is down")

    loop = make(vt, reconcile, keys=lambda: ["a"], retry_base_s=1.0, retry_cap_s=8.0)
    async with running(loop) as task:
        await until(lambda: len(times) >= 9, task)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # six errors (1, 2, 4, 8, capped 8, 8), a success asking for 100 s, then from 1 again
    assert gaps == pytest.approx([1, 2, 4, 8, 8, 8, 100, 1])


async def test_a_conflict_is_retried_after_a_small_fixed_delay_and_warned_about_once_in_50(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vt = VirtualTime()
    times: list[float] = []
    registry = CollectorRegistry()

    async def reconcile(key: str) -> Result:
        times.append(vt.now)
        if len(times) <= 50:
            raise Conflict("GpuLease ns/a changed since it was read")
        return None

    loop = make(
        vt, reconcile, keys=lambda: ["a"], registry=registry, conflict_retry_s=0.25, retry_base_s=5
    )
    with caplog.at_level(logging.DEBUG, logger="common.reconcile"):
        async with running(loop) as task:
            await until(lambda: len(times) == 51, task)
            await spin()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == pytest.approx([0.25] * 50)  # neither the backoff nor growing
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "test: a: 50 conflicts in a row, the last: GpuLease ns/a changed since it was read"
    ]
    labels = {"controller": "test"}
    errors = "tidelease_controller_reconcile_errors_total"
    assert sample(registry, errors, **labels, kind="conflict") == 50
    assert sample(registry, "tidelease_controller_retries_total", **labels, reason="conflict") == 50
    assert sample(registry, "tidelease_controller_retries_total", **labels, reason="backoff") == 0


async def test_requeue_after_runs_the_key_again_then() -> None:
    vt = VirtualTime()
    times: list[float] = []
    results: deque[Result] = deque([Requeue(2.5), Requeue(0.0), None])

    async def reconcile(key: str) -> Result:
        times.append(vt.now)
        return results.popleft() if results else None

    loop = make(vt, reconcile, keys=lambda: ["a"])
    vt.at(T0 + 60)
    async with running(loop) as task:
        await until(lambda: vt.now >= T0 + 60, task)
        await spin()
    assert times == pytest.approx([T0, T0 + 2.5, T0 + 2.5])


async def test_a_reconcile_consumes_the_keys_timer_and_its_result_sets_the_next() -> None:
    """An event during a backoff reconciles at once (not at the retry time), and a requeue that
    a newer reconcile made obsolete does not fire."""
    vt = VirtualTime()
    times: list[float] = []
    results: deque[Result | Exception] = deque(
        [Unavailable("down"), None, Requeue(10.0), None, None]
    )

    async def reconcile(key: str) -> Result:
        times.append(vt.now)
        result = results.popleft()
        if isinstance(result, Exception):
            raise result
        return result

    loop = make(vt, reconcile, keys=lambda: ["a"], retry_base_s=30.0)
    vt.at(T0 + 3, lambda: loop.add("a"))  # during the 30 s backoff
    vt.at(T0 + 40, lambda: loop.add("a"))  # requeue for 50 s asked
    vt.at(T0 + 45, lambda: loop.add("a"))  # ... made obsolete by this one, which asks nothing
    vt.at(T0 + 100)
    async with running(loop) as task:
        await until(lambda: vt.now >= T0 + 100, task)
        await spin()
    assert times == pytest.approx([T0, T0 + 3, T0 + 40, T0 + 45])


async def test_add_after_keeps_the_earliest_time() -> None:
    vt = VirtualTime()
    times: list[float] = []

    async def reconcile(key: str) -> Result:
        times.append(vt.now)
        return None

    loop = make(vt, reconcile)
    loop.add_after("a", 5.0)
    loop.add_after("a", 2.0)
    loop.add_after("a", 9.0)
    vt.at(T0 + 30)
    async with running(loop) as task:
        await until(lambda: vt.now >= T0 + 30, task)
        await spin()
    assert times == pytest.approx([T0 + 2])


async def test_a_failing_key_is_logged_with_its_traceback_and_stops_nothing_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vt = VirtualTime()
    calls: list[str] = []

    async def reconcile(key: str) -> Result:
        calls.append(key)
        if key == "bug":
            raise RuntimeError("a bug")
        if key == "down":
            raise Unavailable("the API server is down")
        return None

    loop = make(vt, reconcile, keys=lambda: ["a", "bug", "down", "b"], retry_base_s=2.0)
    async with running(loop) as task:
        await until(lambda: calls.count("bug") == 2 and calls.count("down") == 2, task)
        loop.add("late")
        await until(lambda: "late" in calls, task)
    assert calls[:4] == ["a", "bug", "down", "b"]  # "b" after the failures, in its turn
    bug = next(r for r in caplog.records if "bug" in r.getMessage())
    assert bug.levelno == logging.ERROR
    assert bug.getMessage() == "test: bug: unexpected error (retrying in 2.0 s)"
    assert bug.exc_info is not None
    assert bug.exc_info[0] is RuntimeError
    assert "Traceback" in caplog.text
    assert 'raise RuntimeError("a bug")' in caplog.text
    down = next(r for r in caplog.records if "down" in r.getMessage())
    assert down.levelno == logging.WARNING  # expected failures: the message, no traceback
    assert down.exc_info is None
    assert "the API server is down (error 1 in a row, retrying in 2.0 s)" in down.getMessage()


# --- resync and readiness ---


async def test_resync_adds_every_key_known_then(caplog: pytest.LogCaptureFixture) -> None:
    vt = VirtualTime()
    known = ["a", "b"]
    calls: list[tuple[float, str]] = []
    broken = False

    def keys() -> list[str]:
        if broken:
            raise RuntimeError("the cache is broken")
        return list(known)

    def break_keys(now_broken: bool) -> None:
        nonlocal broken
        broken = now_broken

    async def reconcile(key: str) -> Result:
        calls.append((vt.now - T0, key))
        return None

    loop = make(vt, reconcile, keys=keys, resync_s=30.0)
    vt.at(T0 + 40, lambda: known.append("c"))
    vt.at(T0 + 70, lambda: break_keys(True))
    vt.at(T0 + 100, lambda: break_keys(False))
    vt.at(T0 + 125)
    async with running(loop) as task:
        await until(lambda: vt.now >= T0 + 125, task)
        await spin()
    # (virtual time runs on while the loop has a resync ahead: the first 125 s)
    assert [c for c in calls if c[0] <= 125] == [
        (0, "a"), (0, "b"),
        (30, "a"), (30, "b"),
        (60, "a"), (60, "b"), (60, "c"),
        # at 90 keys() failed: logged, nothing added, the loop went on
        (120, "a"), (120, "b"), (120, "c"),
    ]  # fmt: skip
    assert "test: listing the keys failed" in caplog.text


async def test_ready_once_every_initial_key_was_reconciled_whatever_the_outcome() -> None:
    vt = VirtualTime()
    gate = asyncio.Event()
    calls: list[str] = []

    async def reconcile(key: str) -> Result:
        calls.append(key)
        if key == "a":
            raise Unavailable("down")  # a failure counts: ready means caught up
        if key == "b":
            await gate.wait()
        return None

    loop = make(
        vt, reconcile, keys=lambda: ["a", "b"], workers=2, retry_base_s=1000.0, retry_cap_s=1000.0
    )
    loop.add("before")  # queued before run: reconciled, but not what readiness waits for
    ready = asyncio.Event()
    async with running(loop, ready) as task:
        await until(lambda: "a" in calls and "b" in calls, task)
        await spin()
        assert not loop.ready.is_set()
        assert not ready.is_set()
        gate.set()
        await until(loop.ready.is_set, task)
        assert ready.is_set()


async def test_ready_at_once_without_keys() -> None:
    vt = VirtualTime()

    async def reconcile(key: str) -> Result:
        return None

    loop = make(vt, reconcile)
    async with running(loop) as task:
        await until(loop.ready.is_set, task)


# --- metrics ---


async def test_two_controllers_share_one_registry_labelled_by_name() -> None:
    registry = CollectorRegistry()
    assert ControllerMetrics.on(registry) is ControllerMetrics.on(registry)
    vt = VirtualTime()
    gate = asyncio.Event()

    async def leasing(key: str) -> Result:
        vt.now += 0.25  # the reconcile takes a quarter of a (virtual) second
        if key == "a":
            raise Unavailable("down")
        return None

    async def planner(key: str) -> Result:
        await gate.wait()
        return None

    first = make(vt, leasing, name="leasing", keys=lambda: ["a", "b"], registry=registry)
    second = make(vt, planner, name="planner", keys=lambda: ["x", "y", "z"], registry=registry)
    await first.run_once()
    await first.run_once()  # "a" again: a retry after its error
    async with running(second) as task:
        await until(lambda: second.depth == 2, task)
        await spin()
        assert sample(registry, "tidelease_controller_queue_depth", controller="planner") == 2
    assert sample(registry, "tidelease_controller_queue_depth", controller="planner") == 0

    leasing_ = {"controller": "leasing"}
    duration = "tidelease_controller_reconcile_duration_seconds"
    assert sample(registry, f"{duration}_count", **leasing_) == 4
    assert sample(registry, f"{duration}_sum", **leasing_) == pytest.approx(1.0)
    errors = "tidelease_controller_reconcile_errors_total"
    assert sample(registry, errors, **leasing_, kind="error") == 2
    assert sample(registry, errors, **leasing_, kind="unexpected") == 0
    assert sample(registry, "tidelease_controller_retries_total", **leasing_, reason="backoff") == 1
    assert sample(registry, errors, controller="planner", kind="error") == 0
    names = {m.name for m in registry.collect()}
    assert names == {
        "tidelease_controller_queue_depth",
        "tidelease_controller_reconcile_duration_seconds",
        "tidelease_controller_reconcile_errors",
        "tidelease_controller_retries",
    }


# --- lifecycle ---


async def test_cancelling_run_cancels_reconciles_in_flight_and_keeps_their_keys() -> None:
    vt = VirtualTime()
    started: list[str] = []
    cleaned: list[str] = []
    forever = asyncio.Event()

    async def reconcile(key: str) -> Result:
        started.append(key)
        if len(started) == 1:
            try:
                await forever.wait()
            finally:
                cleaned.append(key)
        return None

    loop = make(vt, reconcile)
    loop.add("a")
    task = asyncio.create_task(loop.run())
    await until(lambda: started == ["a"], task)
    with pytest.raises(RuntimeError, match="already running"):
        await loop.run()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["a"]
    assert loop.depth == 1  # "a" waits for the next run (the next leadership term)
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    async with running(loop) as task:
        await until(lambda: started == ["a", "a"], task)


async def test_a_stop_before_a_started_reconcile_ran_keeps_its_key() -> None:
    """The loop stopped in the very step that launched a reconcile: the task never ran, and
    its key must neither be lost nor stay marked as in progress."""
    calls: list[str] = []

    async def reconcile(key: str) -> Result:
        calls.append(key)
        return None

    async def stopped(event: asyncio.Event, within_s: float | None) -> bool:
        raise asyncio.CancelledError

    loop = ReconcileLoop("test", reconcile, keys=lambda: ["a"], wait=stopped)
    with pytest.raises(asyncio.CancelledError):
        await loop.run()
    assert calls == []
    assert loop.depth == 1
    await loop.run_once()
    assert calls == ["a"]


async def test_run_once_reconciles_every_known_and_queued_key_once() -> None:
    vt = VirtualTime()
    calls: list[str] = []

    async def reconcile(key: str) -> Result:
        calls.append(key)
        if key == "a":
            loop.add("a")  # changed meanwhile: left for the next pass
        if key == "b":
            raise RuntimeError("a bug")  # logged, retried later, not raised
        return None

    loop = make(vt, reconcile, keys=lambda: ["a", "b"], workers=2)
    loop.add("x")
    await loop.run_once()
    assert calls == ["x", "a", "b"]
    assert loop.ready.is_set()
    assert loop.depth == 1
    await loop.run_once()
    assert calls == ["x", "a", "b", "a", "b"]


async def test_min_interval_coalesces_events_into_one_later_run() -> None:
    vt = VirtualTime()
    times: list[float] = []

    async def reconcile(key: str) -> Result:
        times.append(vt.now)
        return None

    loop = make(vt, reconcile, keys=lambda: ["world"], min_interval_s=5.0)
    for t in (1, 2, 3):
        vt.at(T0 + t, lambda: loop.add("world"))
    vt.at(T0 + 20, lambda: loop.add("world"))
    vt.at(T0 + 30)
    async with running(loop) as task:
        await until(lambda: vt.now >= T0 + 30, task)
        await spin()
    assert times == pytest.approx([T0, T0 + 5, T0 + 20])


async def test_on_the_real_clock() -> None:
    """The production clock and wait: a requeue and an idle loop woken by add()."""
    calls: list[str] = []

    async def reconcile(key: str) -> Result:
        calls.append(key)
        return Requeue(0.01) if len(calls) < 3 else None

    loop = ReconcileLoop("real", reconcile, keys=lambda: ["a"])
    async with running(loop) as task:
        await until(lambda: len(calls) == 3, task)
        await asyncio.sleep(0.02)
        loop.add("b")
        await until(lambda: "b" in calls, task)
    assert calls == ["a", "a", "a", "b"]


# --- settings and layering ---


def test_settings_name_every_problem() -> None:
    assert ReconcileSettings().validate() == []
    bad = ReconcileSettings(
        workers=0,
        resync_s=0.0,
        retry_base_s=float("nan"),
        retry_cap_s=-1.0,
        conflict_retry_s=-0.1,
        min_interval_s=-1.0,
    )
    problems = bad.validate()
    assert [p.split(":")[0] for p in problems] == [
        "workers",
        "resync_s",
        "retry_base_s",
        "retry_cap_s",
        "conflict_retry_s",
        "min_interval_s",
    ]

    async def reconcile(key: str) -> Result:
        return None

    with pytest.raises(InvalidInput) as raised:
        ReconcileLoop("leasing", reconcile, settings=bad)
    assert raised.value.problems == [f"reconcile loop leasing: {p}" for p in problems]


def test_backoff_is_capped_without_overflow() -> None:
    s = ReconcileSettings(retry_base_s=0.5, retry_cap_s=30.0)
    assert [s.backoff_s(n) for n in (1, 2, 3, 7, 8, 5000)] == [0.5, 1, 2, 30, 30, 30]


def test_the_loop_knows_no_controller() -> None:
    names = imported(ROOT / "common" / "reconcile.py")
    assert not {n for n in names if n.split(".")[0] in {"extender", "nodeagent"}}
