"""The orchestrator: keeps every orchestrated job's pod readiness by role from a pod watch,
evaluates the job's DAG on every change and issues the commands whose preconditions hold.
Keeps each elastic Horovod job's discover_hosts ConfigMap current.

Idempotent and restartable: before issuing, a RUNNING record is written to the job's ConfigMap
by compare-and-swap against the freshly read records (:func:`records.claim`), and after the
command exits, DONE or FAILED (with a backoff) is written. A command recorded as done is never
issued again; a restarted controller reads the records and goes on; an attempt that a dead
controller left RUNNING is retried only after its timeout, so two copies never overlap.
Run it under a leader election (``tidelease orchestrator``).

Each job is a key of the orchestrator's :class:`~common.reconcile.ReconcileLoop`: a change of
its ConfigMap or of one of its pods, a command ending, and every ``resync_s`` reconcile it; a
reconcile that leaves a retry or a takeover ahead asks to run again then (``Requeue``). The
loop decides *when* a job is looked at; the commands themselves run as tasks of their own,
``max_parallel`` at a time, with their retries and backoff kept in the job's records.

Reference: weflex 3.4, figure 8 (docs/references.md).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common.errors import InvalidInput, NotFound, TideleaseError
from common.kubeclient import KubeClient
from common.objects import object_key
from common.reconcile import ReconcileLoop, ReconcileSettings, Requeue, Result, run_checked
from common.watches import Watches
from extender.orchestration.evaluation import Evaluation, Issue, evaluate
from extender.orchestration.graph import Dag, load
from extender.orchestration.jobreadiness import (
    LABEL_JOB,
    PodState,
    Snapshot,
    job_of,
    pod_state,
)
from extender.orchestration.jobs import (
    JOB,
    LABEL_ORCHESTRATION,
    JobSpec,
    job_ref,
    parse_job,
)
from extender.orchestration.metrics import OrchestratorMetrics
from extender.orchestration.podexec import OUTPUT_TAIL, ExecRequest, Executor
from extender.orchestration.records import (
    Record,
    State,
    abandoned,
    claim,
    finish,
    give_up_abandoned,
    merge,
    same_attempt,
)
from extender.orchestration.rendering import (
    Context,
    detached,
    discover_hosts_script,
    hosts_lines,
    render,
)
from extender.orchestration.storing import JobStore

log = logging.getLogger(__name__)

LEASE_NAME = "tidelease-orchestrator"
JOB_SELECTOR = f"{LABEL_ORCHESTRATION}={JOB}"
# A failed claim, give-up or discover_hosts write of a job is tried again this much later: not
# at once, so an API server outage is no hot loop.
RETRY_S = 1.0
# The shortest requeue: a wake time already due (a clock step) must not spin the loop.
MIN_REQUEUE_S = 0.005


@dataclass(frozen=True)
class OrchestratorSettings:
    namespace: str | None = None  # watch one namespace; None: every namespace (or namespaces)
    # Watch these namespaces only (the chart's orchestrator.namespaces: its ConfigMaps and pods
    # may be read nowhere else); empty: as namespace says.
    namespaces: tuple[str, ...] = ()
    identity: str = ""  # this incarnation, in RUNNING records (default: a random id)
    max_parallel: int = 64  # commands in flight at once
    resync_s: float = 30.0  # re-evaluate every job at least this often (the loop's resync)
    drain_s: float = 10.0  # on stop, how long commands in flight may take to finish

    def validate(self) -> list[str]:
        problems = []
        if self.max_parallel < 1:
            problems.append(f"max_parallel: want at least 1, got {self.max_parallel}")
        if self.resync_s <= 0:
            problems.append(f"resync_s: want a positive number, got {self.resync_s}")
        return problems


@dataclass
class _Job:
    spec: JobSpec | None = None
    records: dict[str, Record] = field(default_factory=dict)
    snapshot: Snapshot = field(default_factory=Snapshot)
    hosts_written: str | None = None
    rejected_version: str = ""  # the resourceVersion whose problems were reported
    complete_logged: bool = False


class Orchestrator:
    def __init__(
        self,
        *,
        store: JobStore,
        executor: Executor,
        settings: OrchestratorSettings | None = None,
        metrics: OrchestratorMetrics | None = None,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] | None = None,
    ) -> None:
        self.store, self.executor = store, executor
        self.settings = settings or OrchestratorSettings()
        self.identity = self.settings.identity or uuid.uuid4().hex[:12]
        self.metrics = metrics or OrchestratorMetrics()
        self.clock = clock
        self.rand = rand or random.Random().random
        self.jobs: dict[str, _Job] = {}
        self.in_flight: set[str] = set()  # "<job key>#<issue key>"
        self.tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(self.settings.max_parallel)
        self._dags: dict[str, Dag | InvalidInput] = {}
        self._pod_job: dict[str, str] = {}  # pod key -> job key
        self._orchestrated = 0  # jobs with a valid spec (the jobs gauge)
        self.closing = False
        # One key per job. The loop's metrics share the orchestrator's registry (/metrics).
        self.loop = ReconcileLoop(
            "orchestrator",
            self.reconcile,
            keys=lambda: list(self.jobs),
            settings=ReconcileSettings(resync_s=self.settings.resync_s),
            registry=self.metrics.registry,
        )

    # --- what the watches bring ---
    def _load(self, text: str) -> Dag:
        cached = self._dags.get(text)
        if cached is None:
            try:
                cached = load(text)
            except InvalidInput as e:
                cached = e
            if len(self._dags) > 256:
                self._dags.clear()
            self._dags[text] = cached
        if isinstance(cached, InvalidInput):
            raise cached
        return cached

    def _set_spec(self, job: _Job, spec: JobSpec | None) -> None:
        """Set ``job``'s spec, keeping the count of orchestrated jobs (the gauge) in step."""
        self._orchestrated += (spec is not None) - (job.spec is not None)
        job.spec = spec
        self.metrics.jobs.set(self._orchestrated)

    def on_job(self, event: str, raw: dict[str, Any]) -> None:
        ref = job_ref(raw)
        key = ref.key
        if event == "DELETED":
            job = self.jobs.get(key)
            if job is not None:
                self._set_spec(job, None)
            self.loop.add(key)
            return
        job = self.jobs.setdefault(key, _Job())
        try:
            spec = parse_job(raw, self._load)
        except InvalidInput as e:
            self._set_spec(job, None)
            version = str((raw.get("metadata") or {}).get("resourceVersion", ""))
            if job.rejected_version != version:
                job.rejected_version = version
                self.metrics.invalid.inc()
                log.error("job %s: rejected: %s", key, "; ".join(e.problems))
                self._spawn(self._report_invalid(ref, e))
            return
        if job.spec is not None and job.spec.ref.uid != spec.ref.uid:
            job.records, job.hosts_written = {}, None
        self._set_spec(job, spec)
        job.records = merge(job.records, spec.records)
        self.loop.add(key)

    def on_pod(self, event: str, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        pod_key = object_key(raw)
        owner = job_of(raw)
        key = f"{owner[0]}/{owner[1]}" if owner is not None else ""
        state = None if event == "DELETED" or not key else pod_state(raw)
        old_key = self._pod_job.get(pod_key)
        if old_key is not None and (state is None or key != old_key):
            old = self.jobs.get(old_key)
            if old is not None and old.snapshot.remove(str(meta.get("name", ""))):
                self.loop.add(old_key)
            self._pod_job.pop(pod_key, None)
        if state is None:
            return
        self._pod_job[pod_key] = key
        if self.jobs.setdefault(key, _Job()).snapshot.apply(state):
            self.loop.add(key)

    # --- deciding ---
    def evaluate(self, key: str) -> Evaluation | None:
        job = self.jobs.get(key)
        if job is None or job.spec is None:
            return None
        prefix = f"{key}#"
        in_flight = {k[len(prefix) :] for k in self.in_flight if k.startswith(prefix)}
        started = time.perf_counter()
        ev = evaluate(
            job.spec.dag,
            job.spec.replicas,
            job.snapshot,
            job.records,
            in_flight=in_flight,
            now=self.clock(),
        )
        self.metrics.evaluation.observe(time.perf_counter() - started)
        return ev

    async def reconcile(self, key: str) -> Result:
        """Evaluate one job; start its issues; keep its discover_hosts current. Asks to run
        again at the job's next retry or takeover time (sooner when its discover_hosts write
        failed); a job with neither a ConfigMap nor pods is forgotten."""
        job = self.jobs.get(key)
        if job is not None and job.spec is None and not len(job.snapshot):
            del self.jobs[key]
            return None
        ev = self.evaluate(key)
        if job is None or job.spec is None or ev is None:
            return None
        spec = job.spec
        for issue in [] if self.closing else ev.issues:
            self.in_flight.add(f"{key}#{issue.key}")
            self._spawn(self._issue(key, spec, issue))
        for gone in [] if self.closing else ev.abandoned:
            if f"{key}#{gone}" not in self.in_flight:
                self.in_flight.add(f"{key}#{gone}")
                self._spawn(self._give_up(key, spec, gone))
        for w in ev.waiting:
            log.debug("job %s: %s %s", key, w.command, w.reason)
        if ev.complete and not job.complete_logged:
            job.complete_logged = True
            log.info("job %s: every command done", key)
        again = None if ev.wake_at is None else ev.wake_at - self.clock()
        discovery = spec.dag.file.discovery
        if discovery is not None:
            pods = job.snapshot.ready(discovery.role)
            if discovery.slots is not None:
                pods = tuple(
                    PodState(p.name, p.uid, p.role, p.ready, p.address, discovery.slots)
                    for p in pods
                )
            hosts = hosts_lines(pods)
            if hosts != job.hosts_written:
                try:
                    await self.store.write_hosts(spec.ref, discover_hosts_script(hosts), hosts)
                except TideleaseError as e:
                    log.warning(
                        "job %s: discover_hosts not written (retrying in %.0f s): %s",
                        key,
                        RETRY_S,
                        e,
                    )
                    again = RETRY_S if again is None else min(again, RETRY_S)
                else:
                    job.hosts_written = hosts
                    self.metrics.hosts_writes.inc()
                    log.info(
                        "job %s: discover_hosts now lists %d %s pod(s)",
                        key,
                        len(pods),
                        discovery.role,
                    )
        return None if again is None else Requeue(max(again, MIN_REQUEUE_S))

    # --- issuing ---
    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _report_invalid(self, ref: Any, e: InvalidInput) -> None:
        try:
            await self.store.report(ref, "InvalidDependencies", "; ".join(e.problems), warning=True)
        except TideleaseError as err:
            log.warning("job %s: could not report its problems: %s", ref.key, err)

    def _seen(self, key: str, records: Mapping[str, Record]) -> None:
        job = self.jobs.get(key)
        if job is not None:
            job.records = merge(job.records, records)

    async def _issue(self, key: str, spec: JobSpec, issue: Issue) -> None:
        flight = f"{key}#{issue.key}"
        command, pod = issue.command, issue.pod
        framework = spec.dag.file.framework or "-"
        try:
            async with self._slots:
                if self.closing:
                    return
                now = self.clock()
                claimed: Record | None = None

                def take(records: Mapping[str, Record]) -> Mapping[str, Record] | None:
                    nonlocal claimed
                    claimed = claim(records, command, pod.name, pod.uid, self.identity, now)
                    return None if claimed is None else {**records, issue.key: claimed}

                records = await self.store.update_records(spec.ref, take)
                if records is None or claimed is None:
                    log.debug("job %s: %s not claimable any more", key, issue.key)
                    return
                self._seen(key, records)
                job = self.jobs.get(key)
                snapshot = job.snapshot if job is not None else Snapshot()
                argv = render(
                    command.run,
                    Context(spec.ref.namespace, spec.ref.name, pod.name, snapshot, spec.replicas),
                )
                if command.detach_s is not None:
                    argv = detached(argv, command.detach_s)
                log.info(
                    "job %s: issuing %s in pod %s (attempt %d/%d): %s",
                    key,
                    command.name,
                    pod.name,
                    claimed.attempts,
                    command.retry.attempts,
                    list(argv),
                )
                started = time.monotonic()
                error: str | None
                try:
                    result = await self.executor.execute(
                        ExecRequest(
                            namespace=spec.ref.namespace,
                            pod=pod.name,
                            argv=argv,
                            timeout_s=command.timeout_s,
                            container=command.container,
                            job=spec.ref.name,
                            command=command.name,
                            attempt=claimed.attempts,
                        )
                    )
                    error = (
                        None
                        if result.ok
                        else f"exit {result.exit_code}: {result.output[-OUTPUT_TAIL:]}".strip()
                    )
                except TideleaseError as e:
                    error = str(e)
                self.metrics.issue_latency.labels(framework).observe(time.monotonic() - started)
                final = finish(claimed, command, error=error, now=self.clock(), rand=self.rand)
                mine = claimed

                def settle(records: Mapping[str, Record]) -> Mapping[str, Record] | None:
                    if not same_attempt(records.get(issue.key), mine):
                        return None  # someone took the attempt over; theirs is the record
                    return {**records, issue.key: final}

                records = await self._settle(spec, settle)
                if records is None:
                    log.warning(
                        "job %s: %s attempt %d was taken over; its outcome is not recorded",
                        key,
                        issue.key,
                        mine.attempts,
                    )
                    return
                self._seen(key, records)
                outcome = {State.DONE: "ok", State.FAILED: "failed"}.get(final.state, "gave_up")
                self.metrics.issues.labels(framework, command.name, outcome).inc()
                if final.state is State.DONE:
                    log.info("job %s: %s done in pod %s", key, command.name, pod.name)
                elif final.state is State.FAILED:
                    log.warning(
                        "job %s: %s failed in pod %s (attempt %d), retrying in %.1f s: %s",
                        key,
                        command.name,
                        pod.name,
                        final.attempts,
                        final.retry_at - final.at,
                        error,
                    )
                else:
                    log.error(
                        "job %s: %s gave up after %d attempt(s): %s",
                        key,
                        command.name,
                        final.attempts,
                        error,
                    )
                    await self._report_gave_up(spec, command.name, final)
        except NotFound:
            log.info("job %s is gone; %s not issued", key, issue.key)
        except TideleaseError as e:
            # Retried a second later, not at once: no hot loop on an outage.
            log.warning(
                "job %s: %s not claimed (retrying in %.0f s): %s", key, issue.key, RETRY_S, e
            )
            self.in_flight.discard(flight)
            self.loop.add_after(key, RETRY_S)
        finally:
            if flight in self.in_flight:
                self.in_flight.discard(flight)
                self.loop.add(key)

    async def _give_up(self, key: str, spec: JobSpec, issue_key: str) -> None:
        """Record as given up the last attempt that a controller now gone left running and
        that timed out (``Evaluation.abandoned``), with its Event: otherwise it would read
        "running" for ever and no one would be told."""
        flight = f"{key}#{issue_key}"
        name = issue_key.partition("@")[0]
        command = next(c for c in spec.dag.order if c.name == name)
        now = self.clock()
        final: Record | None = None

        def change(records: Mapping[str, Record]) -> Mapping[str, Record] | None:
            nonlocal final
            r = records.get(issue_key)
            if r is None or not abandoned(r, command, now):
                return None  # settled meanwhile, or taken over
            final = give_up_abandoned(r, now)
            return {**records, issue_key: final}

        try:
            records = await self.store.update_records(spec.ref, change)
            if records is None or final is None:
                return
            self._seen(key, records)
            framework = spec.dag.file.framework or "-"
            self.metrics.issues.labels(framework, command.name, "gave_up").inc()
            log.error("job %s: %s gave up: %s", key, issue_key, final.error)
            await self._report_gave_up(spec, command.name, final)
        except NotFound:
            log.info("job %s is gone; %s left as it was", key, issue_key)
        except TideleaseError as e:
            # As for a claim: a second later, not at once (the job's next reconcile would only
            # try again and fail the same way).
            log.warning(
                "job %s: %s not recorded as given up (retrying in %.0f s): %s",
                key,
                issue_key,
                RETRY_S,
                e,
            )
            self.in_flight.discard(flight)
            self.loop.add_after(key, RETRY_S)
        finally:
            if flight in self.in_flight:
                self.in_flight.discard(flight)
                self.loop.add(key)

    async def _settle(
        self, spec: JobSpec, change: Callable[[Mapping[str, Record]], Mapping[str, Record] | None]
    ) -> Mapping[str, Record] | None:
        """Write the outcome, retrying through API server outages (the attempt stays RUNNING
        and blocks a second copy until then)."""
        delay = 0.2
        while True:
            try:
                return await self.store.update_records(spec.ref, change)
            except NotFound:
                raise
            except TideleaseError as e:
                log.warning("job %s: outcome not written (retrying): %s", spec.ref.key, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _report_gave_up(self, spec: JobSpec, command: str, r: Record) -> None:
        try:
            await self.store.report(
                spec.ref,
                "CommandGaveUp",
                f"{command} failed {r.attempts} time(s) in {r.pod}: {r.error}",
                warning=True,
            )
        except TideleaseError as e:
            log.warning("job %s: event not written: %s", spec.ref.key, e)

    async def drain(self) -> None:
        """Until every issue task has ended (tests; shutdown)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    @property
    def wake(self) -> dict[str, float]:
        """The jobs the loop will reconcile on a timer of their own (a retry or takeover time,
        a failed write tried again), and in how many seconds: a view of the loop, for tests and
        debugging."""
        due = {key: self.loop.due_in(key) for key in self.jobs}
        return {key: s for key, s in due.items() if s is not None}

    async def step(self) -> float:
        """One pass of the loop by hand (tests, benchmarks; :func:`run_orchestrator` runs the
        loop itself): every job reconciled once. The seconds until the loop would reconcile a
        job on its own: its earliest timer, at most ``resync_s``."""
        await self.loop.run_once()
        due = self.loop.next_due_in()
        resync = self.settings.resync_s
        return resync if due is None else min(due, resync)

    async def close(self, grace_s: float | None = None) -> None:
        """Issue nothing new; let commands in flight finish and record their outcome for up to
        ``grace_s`` (settings.drain_s), then cancel the rest (their records stay RUNNING, and
        the next leader waits out their timeout before retrying)."""
        self.closing = True
        grace = self.settings.drain_s if grace_s is None else grace_s
        if self.tasks and grace > 0:
            await asyncio.wait(list(self.tasks), timeout=grace)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*list(self.tasks), return_exceptions=True)


async def run_orchestrator(
    *,
    kube: KubeClient,
    orchestrator: Orchestrator,
    ready: asyncio.Event | None = None,
) -> None:
    """Watch job ConfigMaps and their pods; evaluate and issue (``orchestrator.loop``) until
    cancelled or a watch ends; then let the commands in flight finish (:meth:`Orchestrator.
    close`). ``ready`` is set once both are listed."""
    settings = orchestrator.settings
    namespaces = settings.namespaces or ((settings.namespace,) if settings.namespace else ())
    watches = Watches(kube, "orchestrator")
    for ns in namespaces or (None,):
        scope = f"/api/v1/namespaces/{ns}" if ns else "/api/v1"
        suffix = f"-{ns}" if len(namespaces) > 1 else ""
        watches.add(
            f"jobs{suffix}", f"{scope}/configmaps", orchestrator.on_job,
            {"labelSelector": JOB_SELECTOR},
        )  # fmt: skip
        watches.add(
            f"pods{suffix}", f"{scope}/pods", orchestrator.on_pod, {"labelSelector": LABEL_JOB}
        )
    log.info(
        "orchestrator %s watching %s",
        orchestrator.identity,
        f"namespaces {', '.join(namespaces)}" if namespaces else "all",
    )
    try:
        # Decide only on a full view: before both lists are in, "not ready" may only mean
        # "not listed yet".
        await watches.wait_synced()
        if ready is not None:
            ready.set()
        await run_checked(orchestrator.loop, watches.check)
    finally:
        await watches.close()
        await orchestrator.close()
