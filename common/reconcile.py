"""One reconcile loop for every controller: a keyed work queue with retries, resync and readiness.

The controllers (leasing, prewarm, planner, hot restart, orchestrator) each hand-wrote the same
machinery around their decisions: a set of dirty keys fed by watch handlers, an ``Event`` to
sleep on, per-key wake times, "retry in 2 s" after an error, "every N s anyway", readiness, and a
metrics class of their own. Each copy got some corner differently (a burst of events stepping a
key twice, an error in one key delaying the others, a key re-stepped while its own write was in
flight). :class:`ReconcileLoop` is that machinery once, in the shape of controller-runtime's
workqueue, so a controller only says what reconciling one key means::

    loop = ReconcileLoop("leasing", controller.reconcile, keys=controller.keys,
                         settings=ReconcileSettings(resync_s=30.0), registry=registry)
    watches.add("gpuleases", path, lambda event, obj: loop.add(object_key(obj)))
    await watches.wait_synced()
    await loop.run(ready=ready)   # until cancelled

What it guarantees:

* **Keys, not events.** :meth:`~ReconcileLoop.add` marks a key dirty. A key added many times
  before it is picked up is reconciled once; a key added while it is being reconciled is
  reconciled once more afterwards, never beside itself. Reconcile functions read the current
  state (the watched caches), so one call covers every event before it.
* **One timer per key.** A reconcile may ask to run again later (:class:`Requeue`); failures
  schedule a retry. A key keeps only its earliest pending time, and *starting* a reconcile
  consumes it: that reconcile covers whatever the timer was for, and its own result says when
  next. So an event that arrives during a backoff reconciles at once, and a ``Requeue`` made
  obsolete by a newer reconcile does not fire.
* **Errors.** :class:`~common.errors.Conflict` (an optimistic write lost a race; the watch or a
  re-read fixes it) is retried after a small fixed delay. Any other exception is retried with
  exponential backoff per key (``retry_base_s`` doubling up to ``retry_cap_s``), reset by a
  success. A :class:`~common.errors.TideleaseError` is an expected operational failure and is
  logged as a warning with its message; anything else is a bug and is logged with its
  traceback. Either way the key is retried and no other key waits for it.
* **Resync.** Every ``resync_s`` every key of ``keys()`` is added: the safety net for a missed
  event and the clock for controllers that act on time rather than on changes.
* **Readiness.** :attr:`~ReconcileLoop.ready` is set once every key that ``keys()`` listed when
  :meth:`~ReconcileLoop.run` started has been reconciled once, whatever the outcome: "caught
  up", not "everything succeeded" (one broken object must not keep a controller unready).
* **Metrics** shared by every controller, labelled with its name (:class:`ControllerMetrics`).

Time comes from an injected ``clock`` and the loop sleeps through an injected ``wait``, so tests
drive it on virtual time; production uses :func:`time.monotonic` and :func:`wait_for_wakeup`.
Delays are relative seconds: a controller deciding on wall time (a lease's ``Wait.until``)
converts to "seconds from now" and the loop never mixes the two clocks.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from common.errors import Conflict, InvalidInput, TideleaseError
from common.logsetup import log_context, object_fields
from common.waiting import wait_event

log = logging.getLogger(__name__)

__all__ = [
    "ControllerMetrics",
    "Keys",
    "ReconcileLoop",
    "ReconcileSettings",
    "Reconciler",
    "Requeue",
    "Result",
    "Wait",
    "run_checked",
    "wait_for_wakeup",
]

# Log a run of conflicts on one key loudly only every this many: a few are normal (our view lags
# our own last write), an endless run is not.
CONFLICTS_WORTH_A_WARNING = 50


@dataclass(frozen=True, slots=True)
class Requeue:
    """A successful reconcile that wants to run again ``after_s`` seconds from now (a lease
    waiting for a deadline, a planner stepping every W seconds). Not an error: the key's
    backoff is reset."""

    after_s: float


# What a reconcile returns: None when the key needs nothing more until something changes.
Result: TypeAlias = Requeue | None
Reconciler: TypeAlias = Callable[[str], Awaitable[Result]]
# Every key the controller knows now (for resync and readiness).
Keys: TypeAlias = Callable[[], Iterable[str]]
# Wait until the event is set or the seconds pass (None: no deadline).
Wait: TypeAlias = Callable[[asyncio.Event, float | None], Awaitable[object]]


async def wait_for_wakeup(event: asyncio.Event, within_s: float | None) -> bool:
    """The production :data:`Wait`: :func:`common.waiting.wait_event`, or no deadline at all
    when ``within_s`` is None (an idle loop has nothing to wake up for on its own)."""
    if within_s is None:
        await event.wait()
        return True
    return await wait_event(event, within_s)


def _no_keys() -> Iterable[str]:
    return ()


@dataclass(frozen=True, slots=True)
class ReconcileSettings:
    workers: int = 1  # keys reconciled at once (never one key twice at once)
    resync_s: float | None = None  # add every known key this often; None: never
    retry_base_s: float = 1.0  # first retry after an error; doubles per consecutive error
    retry_cap_s: float = 60.0  # the longest wait between retries
    conflict_retry_s: float = 0.2  # retry after a Conflict (fixed: it is a race, not an outage)
    min_interval_s: float = 0.0  # a key starts at most this often; events in between coalesce

    def validate(self) -> list[str]:
        """Every problem at once; empty when the settings are usable."""
        problems = []
        if self.workers < 1:
            problems.append(f"workers: want at least 1, got {self.workers}")
        if self.resync_s is not None and not self.resync_s > 0:
            problems.append(f"resync_s: want a positive number or None, got {self.resync_s}")
        if not self.retry_base_s > 0:
            problems.append(f"retry_base_s: want a positive number, got {self.retry_base_s}")
        if not self.retry_cap_s >= self.retry_base_s:
            problems.append(
                f"retry_cap_s: want at least retry_base_s ({self.retry_base_s}), "
                f"got {self.retry_cap_s}"
            )
        if not self.conflict_retry_s >= 0:
            problems.append(f"conflict_retry_s: want 0 or more, got {self.conflict_retry_s}")
        if not self.min_interval_s >= 0:
            problems.append(f"min_interval_s: want 0 or more, got {self.min_interval_s}")
        return problems

    def backoff_s(self, failures: int) -> float:
        """The wait after ``failures`` consecutive errors (1 for the first): no jitter, since a
        controller's keys fail at different moments anyway and tests want exact times."""
        # min() before the power: failure 2,000 must not overflow a float.
        return min(self.retry_cap_s, self.retry_base_s * 2.0 ** min(max(failures, 1) - 1, 64))


class ControllerMetrics:
    """The reconcile loop's metrics, one set per registry, labelled by controller.

    Every controller's loop registers the same names, and several controllers share a process
    (and its registry); a second registration would raise. :meth:`on` therefore creates the set
    once per registry and hands the same one to every loop: do not construct it directly.
    """

    _by_registry: ClassVar[weakref.WeakKeyDictionary[CollectorRegistry, ControllerMetrics]] = (
        weakref.WeakKeyDictionary()
    )
    _lock: ClassVar[threading.Lock] = threading.Lock()

    ERROR_KINDS: ClassVar[tuple[str, ...]] = ("conflict", "error", "unexpected")
    RETRY_REASONS: ClassVar[tuple[str, ...]] = ("conflict", "backoff")

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.depth = Gauge(
            "tidelease_controller_queue_depth",
            "Keys waiting to be reconciled now (not those waiting for a retry or a requeue "
            "time); 0 while the loop is not running (not leading).",
            ["controller"],
            registry=r,
        )
        self.duration = Histogram(
            "tidelease_controller_reconcile_duration_seconds",
            "One reconcile of one key, whatever its outcome.",
            ["controller"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.errors = Counter(
            "tidelease_controller_reconcile_errors",
            "Reconciles that failed, by kind (conflict: a write lost a race; error: an "
            "expected failure such as the API server unreachable; unexpected: a bug).",
            ["controller", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "tidelease_controller_retries",
            "Reconciles that retried a failed one, by reason (conflict: after a Conflict; "
            "backoff: after any other error).",
            ["controller", "reason"],
            registry=r,
        )

    @classmethod
    def on(cls, registry: CollectorRegistry) -> ControllerMetrics:
        """The metrics on ``registry``, created on first use."""
        with cls._lock:
            metrics = cls._by_registry.get(registry)
            if metrics is None:
                metrics = cls._by_registry[registry] = cls(registry)
            return metrics


class ReconcileLoop:
    """Reconciles keys one at a time per key, ``settings.workers`` at a time in all.

    ``reconcile(key)`` makes the world match what the controller wants for ``key``, reading the
    current state (it must be idempotent: a key is reconciled again after events, resyncs and
    failures). ``keys()`` lists every key the controller knows now, for resync and readiness;
    keys it does not list can still be :meth:`add`-ed. ``name`` labels the logs and metrics.
    """

    def __init__(
        self,
        name: str,
        reconcile: Reconciler,
        *,
        keys: Keys = _no_keys,
        settings: ReconcileSettings | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait: Wait = wait_for_wakeup,
    ) -> None:
        self.name = name
        self.settings = settings or ReconcileSettings()
        problems = self.settings.validate()
        if problems:
            raise InvalidInput([f"reconcile loop {name}: {p}" for p in problems])
        self._reconcile, self._keys, self._clock, self._wait = reconcile, keys, clock, wait
        # Set once the first pass of run() (or a run_once()) is over; see the module doc.
        self.ready = asyncio.Event()

        metrics = ControllerMetrics.on(registry if registry is not None else CollectorRegistry())
        self._depth_gauge = metrics.depth.labels(name)
        self._duration = metrics.duration.labels(name)
        self._errors = {k: metrics.errors.labels(name, k) for k in ControllerMetrics.ERROR_KINDS}
        self._retries = {
            r: metrics.retries.labels(name, r) for r in ControllerMetrics.RETRY_REASONS
        }

        self._queue: deque[str] = deque()  # dirty keys, oldest first
        self._queued: set[str] = set()  # the keys in _queue
        self._active: set[str] = set()  # being reconciled
        self._again: set[str] = set()  # added while being reconciled: queued when done
        self._timers: dict[str, float] = {}  # key -> when it is due (the truth)
        self._heap: list[tuple[float, int, str]] = []  # the timers, ordered; stale entries too
        self._order = itertools.count()  # ties in the heap: first set, first due
        self._failures: dict[str, int] = {}  # consecutive errors (not conflicts), by key
        self._conflicts: dict[str, int] = {}  # consecutive conflicts, by key
        self._retry_reason: dict[str, str] = {}  # keys whose next start is a retry
        self._last_start: dict[str, float] = {}  # only with min_interval_s
        self._prune_above = 256
        self._tasks: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self._first_pass: set[str] | None = None  # keys of the first pass not yet reconciled
        self._ready_too: asyncio.Event | None = None
        self._running = False

    # --- what the watches (and the controller) call ---

    def add(self, key: str) -> None:
        """Mark ``key`` dirty: reconciled soon, once however often it is added meanwhile, and
        once more after the current reconcile if it is being reconciled now."""
        if key in self._active:
            if key in self._again:
                return
            self._again.add(key)
        elif key in self._queued:
            return
        else:
            self._queued.add(key)
            self._queue.append(key)
        self._show_depth()
        self._wakeup.set()

    def add_after(self, key: str, delay_s: float) -> None:
        """Reconcile ``key`` in ``delay_s`` seconds (at once when not positive), or earlier if
        it already has an earlier time or is added meanwhile."""
        if not delay_s > 0:
            self.add(key)
            return
        self._set_timer(key, self._clock() + delay_s)

    @property
    def depth(self) -> int:
        """Keys waiting to be reconciled now (not counting those on a timer)."""
        return len(self._queue) + len(self._again)

    def next_due_in(self) -> float | None:
        """Seconds until the earliest key on a timer (a retry or a requeue) is due, 0 when one
        is due already; None when no key waits on a timer. For tests that step the loop with
        :meth:`run_once` and want to know when it would run next."""
        return self._until_due(self._clock(), None)

    def due_in(self, key: str) -> float | None:
        """Seconds until ``key``'s timer (a retry or a requeue) is due, 0 when it is due
        already; None when ``key`` has none. :meth:`next_due_in` for one key."""
        due = self._timers.get(key)
        return None if due is None else max(0.0, due - self._clock())

    # --- running ---

    async def run(self, *, ready: asyncio.Event | None = None) -> None:
        """Reconcile until cancelled; ``ready`` (besides :attr:`ready`) is set after the first
        pass. On the way out, reconciles in flight are cancelled and their keys stay queued, so
        a later :meth:`run` (the next leadership term) starts with them."""
        self._enter()
        self.ready.clear()
        self._ready_too = ready
        try:
            first = self._known()
            self._first_pass = set(first)
            for key in first:
                self.add(key)
            self._show_depth()
            self._pass_done(None)
            resync_s = self.settings.resync_s
            next_resync = None if resync_s is None else self._clock() + resync_s
            while True:
                self._wakeup.clear()
                now = self._clock()
                if next_resync is not None and resync_s is not None and now >= next_resync:
                    for key in self._known():
                        self.add(key)
                    next_resync = now + resync_s
                self._fire_timers(now)
                self._start_queued(now)
                await self._wait(self._wakeup, self._until_due(now, next_resync))
        finally:
            await self._leave()

    async def run_once(self) -> None:
        """One pass, for tests and for stepping by hand: every key of ``keys()``, every queued
        key and every key whose time is due, reconciled once each (``workers`` at a time),
        with the same error handling, timers and metrics as :meth:`run`; ``min_interval_s``
        does not apply. Keys added during the pass stay queued for the next one."""
        self._enter()
        try:
            self._fire_timers(self._clock())
            for key in self._known():
                self.add(key)
            batch = deque(self._queue)
            self._queue.clear()
            self._queued.clear()
            self._show_depth()
            while batch or self._tasks:
                while batch and len(self._active) < self.settings.workers:
                    self._launch(batch.popleft(), self._clock())
                await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
        finally:
            await self._leave()
        self.ready.set()

    # --- inside ---

    def _enter(self) -> None:
        if self._running:
            raise RuntimeError(f"reconcile loop {self.name} is already running")
        self._running = True

    async def _leave(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for key in list(self._active):
            # A task cancelled before its first step never ran _process's cleanup.
            self._active.discard(key)
            self._again.discard(key)
            self.add(key)
        self._running = False
        self._first_pass = None
        self._ready_too = None
        self._show_depth()

    def _show_depth(self) -> None:
        self._depth_gauge.set(self.depth if self._running else 0)

    def _known(self) -> list[str]:
        try:
            return list(dict.fromkeys(self._keys()))
        except Exception:
            log.exception("%s: listing the keys failed; none added this time", self.name)
            return []

    def _set_timer(self, key: str, due: float) -> None:
        if due >= self._timers.get(key, float("inf")):
            return
        self._timers[key] = due
        heapq.heappush(self._heap, (due, next(self._order), key))
        if len(self._heap) > 2 * len(self._timers) + 64:
            # Replaced and consumed timers linger in the heap until they come up; a key that
            # keeps getting events between long requeues would grow it without this.
            self._heap = [(t, n, k) for t, n, k in self._heap if self._timers.get(k) == t]
            heapq.heapify(self._heap)
        self._wakeup.set()

    def _fire_timers(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            due, _, key = heapq.heappop(self._heap)
            if self._timers.get(key) == due:
                del self._timers[key]
                self.add(key)

    def _until_due(self, now: float, next_resync: float | None) -> float | None:
        """Seconds until the next timer or resync; None when there is neither."""
        while self._heap and self._timers.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # stale
        due = [t for t in (self._heap[0][0] if self._heap else None, next_resync) if t is not None]
        return max(0.0, min(due) - now) if due else None

    def _start_queued(self, now: float) -> None:
        min_interval = self.settings.min_interval_s
        if min_interval > 0 and len(self._last_start) > self._prune_above:
            self._last_start = {k: t for k, t in self._last_start.items() if now < t + min_interval}
            self._prune_above = max(256, 2 * len(self._last_start))
        while self._queue and len(self._active) < self.settings.workers:
            key = self._queue.popleft()
            self._queued.discard(key)
            last = self._last_start.get(key)
            if min_interval > 0 and last is not None and now < last + min_interval:
                # Too soon: wait for the interval; events until then coalesce into that run.
                self._set_timer(key, last + min_interval)
                continue
            self._launch(key, now)
        self._show_depth()

    def _launch(self, key: str, now: float) -> None:
        # Starting consumes the key's timer: this reconcile covers whatever it was due for.
        self._timers.pop(key, None)
        reason = self._retry_reason.pop(key, None)
        if reason is not None:
            self._retries[reason].inc()
        self._active.add(key)
        if self.settings.min_interval_s > 0:
            self._last_start[key] = now
        task = asyncio.create_task(self._process(key), name=f"reconcile-{self.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, key: str) -> None:
        started = self._clock()
        finished = False
        try:
            try:
                with log_context(controller=self.name, **object_fields(key)):
                    result = await self._reconcile(key)
            except Conflict as e:
                self._conflicted(key, e)
            except Exception as e:
                self._failed(key, e)
            else:
                self._succeeded(key, result)
            finished = True
        finally:
            self._active.discard(key)
            if not finished or key in self._again:
                # Cancelled (the loop stops): queued for the next run. Added meanwhile: again.
                self._again.discard(key)
                self.add(key)
            if finished:
                self._duration.observe(max(0.0, self._clock() - started))
                self._pass_done(key)
            self._show_depth()
            self._wakeup.set()

    def _succeeded(self, key: str, result: Result) -> None:
        self._failures.pop(key, None)
        self._conflicts.pop(key, None)
        if result is not None:
            self.add_after(key, result.after_s)

    def _conflicted(self, key: str, e: Conflict) -> None:
        n = self._conflicts[key] = self._conflicts.get(key, 0) + 1
        self._errors["conflict"].inc()
        self._retry_reason[key] = "conflict"
        delay = self.settings.conflict_retry_s
        if n % CONFLICTS_WORTH_A_WARNING == 0:
            log.warning("%s: %s: %d conflicts in a row, the last: %s", self.name, key, n, e)
        else:
            log.debug("%s: %s: %s (retrying in %.2f s)", self.name, key, e, delay)
        self.add_after(key, delay)

    def _failed(self, key: str, e: Exception) -> None:
        n = self._failures[key] = self._failures.get(key, 0) + 1
        self._retry_reason[key] = "backoff"
        delay = self.settings.backoff_s(n)
        if isinstance(e, TideleaseError):
            self._errors["error"].inc()
            log.warning(
                "%s: %s: %s (error %d in a row, retrying in %.1f s)", self.name, key, e, n, delay
            )
        else:
            # A bug must not stop this key for good, let alone the others: said loudly, retried.
            self._errors["unexpected"].inc()
            log.error(
                "%s: %s: unexpected error (retrying in %.1f s)", self.name, key, delay, exc_info=e
            )
        self.add_after(key, delay)

    def _pass_done(self, key: str | None) -> None:
        """Readiness: ``key`` was reconciled; the first pass is over once all were."""
        if self._first_pass is None:
            return
        if key is not None:
            self._first_pass.discard(key)
        if not self._first_pass:
            self._first_pass = None
            self.ready.set()
            if self._ready_too is not None:
                self._ready_too.set()


async def run_checked(
    loop: ReconcileLoop,
    check: Callable[[], None],
    poll_s: float = 1.0,
    *,
    ready: asyncio.Event | None = None,
) -> None:
    """:meth:`ReconcileLoop.run` until cancelled, or until ``check`` (called every ``poll_s``)
    raises, which it then raises too. A controller's keys come from its watches; should a watch
    end (:meth:`common.watches.Watches.check` raises), reconciling on a view that no longer
    moves would act on stale objects for ever, so the controller stops loudly instead.
    ``ready`` is handed to :meth:`ReconcileLoop.run`."""
    running = asyncio.create_task(loop.run(ready=ready), name=f"reconcile-{loop.name}-run")
    try:
        while not running.done():
            await asyncio.wait({running}, timeout=poll_s)
            check()
        running.result()  # run() ends only by raising
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
