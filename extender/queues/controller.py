"""The queues controller: the shared queues' multi-level feedback queue (MLFQ) as live admission
(extender.queues.admission); one of ``tidelease controllers``, leader-elected.

It watches the GPU pods, the GpuNodes, their ledgers and the agents' Leases (the extender's own
watch rules, extender.cluster.watching), and makes a pass on every change of a pod that
declares its job class, and every ``interval_s`` to advance the jobs' counters:

* the book advances (counters, moves between queues, completions, adapted thresholds); a move
  is written on the job's pods (``tidelease.io/queue`` and ``tidelease.io/queue-reason``) with
  an Event on each, so that ``kubectl describe`` tells it and the extender's partial preemption
  ranks the job by it;
* gated pods are released in the book's order (a JSON patch that removes the queue gate, and
  only it, and writes the pod's queue and, with a release key, the proof of the release,
  common/queuerelease.py); a pod whose gate someone else removed waits as a gated one and is
  released, in its turn, by the proof alone;
* the book is stored in the ConfigMap ``tidelease-queues`` (its namespace: the agents' and the
  leader elections') after a move, a completion or a release, and at most every
  ``save_every_s`` otherwise: a restart keeps it, losing at most that much counted time.

Reference: cornucopia 4.2 (the MLFQ) (docs/references.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from common import contract
from common.errors import Conflict, InvalidInput, NotFound, TideleaseError
from common.events import Involved, post_event
from common.kubeclient import KubeClient
from common.queryscope import DEFAULT_LABEL, refusal, scope_query
from common.queuerelease import release_proof
from common.reconcile import ReconcileLoop, ReconcileSettings, Requeue
from extender.cluster.state import ClusterState
from extender.cluster.store import Kind, Store
from extender.cluster.watching import PodCache, follow_watch, run_liveness, view_applier
from extender.queues.admission import (
    Book,
    JobObs,
    Move,
    Release,
    advance,
    book_from_json,
    book_to_json,
    gate_index,
    observe,
    release,
)
from extender.queues.allocation import JobView
from extender.queues.fitting import Capacity, Constraints, NodeFacts, node_facts
from extender.queues.growth import Elastic, declared, grow, shrink
from extender.queues.jobviews import DEFAULT_THRESHOLDS, held_by_job, job_key, job_views
from extender.queues.measuring import Profiler
from extender.queues.mlfq import Queue, Thresholds

log = logging.getLogger(__name__)

LEADER_LEASE = "tidelease-queues"
CONFIGMAP = "tidelease-queues"
KEY = "queues"
KINDS: tuple[Kind, ...] = ("Pod", "GpuNode", "GpuAllocation", "Lease")
COMPONENT = "tidelease-queues"
# How long a scale write waits for the workload's pods to follow before the job counts again.
SCALE_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class QueueSettings:
    # The MLFQ's starting thresholds (twice the means an admin expects: interactive sessions
    # of 30 min, a runtime to failure of 12 h, batch jobs of 6 h; cornucopia 4.2), adapted
    # from completions.
    thresholds: Thresholds = DEFAULT_THRESHOLDS
    adapt_every: int = 1000  # completions between two adaptations (the paper's 1000)
    interval_s: float = 5.0  # a pass at least this often (counters, promotions)
    save_every_s: float = 30.0
    # The label a pod's throughput query is scoped by (its namespace; common/queryscope.py).
    tenant_query_label: str = DEFAULT_LABEL


@dataclass
class QueueMetrics:
    registry: CollectorRegistry
    gated: Gauge = field(init=False)
    released: Counter = field(init=False)
    moves: Counter = field(init=False)
    wait: Histogram = field(init=False)
    threshold: Gauge = field(init=False)
    scaled: Counter = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.gated = Gauge(
            "tidelease_queues_gated_pods", "Pods waiting at the queue gate, by queue.", ["queue"],
            registry=r,
        )  # fmt: skip
        self.released = Counter(
            "tidelease_queues_released_pods", "Pods released, by queue.", ["queue"], registry=r
        )
        self.moves = Counter(
            "tidelease_queues_moves", "Jobs moved between queues.", ["old", "new"], registry=r
        )
        self.wait = Histogram(
            "tidelease_queues_gate_seconds",
            "From a pod's creation to its release, by queue.",
            ["queue"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
            registry=r,
        )
        self.scaled = Counter(
            "tidelease_queues_scaled", "Elastic workloads scaled, by direction.", ["direction"],
            registry=r,
        )  # fmt: skip
        self.threshold = Gauge(
            "tidelease_queues_threshold_seconds",
            "The MLFQ thresholds in force (demote_1, demote_2, promote_3).",
            ["threshold"],
            registry=r,
        )


class QueuesController:
    def __init__(
        self,
        kube: KubeClient,
        store: Store,
        *,
        namespace: str,
        settings: QueueSettings,
        metrics: QueueMetrics,
        resource: str = contract.DEFAULT_GPU_RESOURCE,
        agent_timeout_s: float = 60.0,
        profiler: Profiler | None = None,
        clock: Callable[[], float] = time.time,
        release_key: Callable[[], bytes | None] | None = None,
    ) -> None:
        # The key of release proofs (common/queuerelease.py), asked on each pass (None: none
        # written, and only gated pods wait).
        self.release_key = release_key or (lambda: None)
        # Ramp-up profiling of elastic jobs that name a throughput query (None: not measured).
        self.profiler = profiler
        self.kube, self.store, self.namespace = kube, store, namespace
        self.agent_timeout_s = agent_timeout_s
        self.settings, self.metrics, self.resource, self.clock = settings, metrics, resource, clock
        self.cluster, self.pods = ClusterState(), PodCache(resource)
        self.synced = asyncio.Event()
        # The nodes' labels, taints and cordons (where a pod may go), from a watch of Nodes.
        self.nodes: dict[str, NodeFacts] = {}
        self.nodes_synced = asyncio.Event()
        self.book: Book | None = None
        self._version = ""  # the stored ConfigMap's resourceVersion ("": none yet)
        self._saved_at = 0.0
        # Pods released whose watch event has not come back yet: (namespace, name) -> uid.
        self._released: dict[tuple[str, str], str] = {}
        # Elastic jobs scaled, their pods yet to follow: job -> (replicas written, when).
        self.scaling: dict[str, tuple[int, float]] = {}
        # Interactive pods held while elastic jobs shrink for them: (namespace, name) -> since.
        self.holding: dict[tuple[str, str], float] = {}
        # Jobs whose throughput query was refused, told (Event, log): job -> pod uid and query.
        self.refused_queries: dict[str, tuple[str, str]] = {}
        self.loop = ReconcileLoop(
            "queues",
            self.reconcile,
            keys=lambda: [KEY],
            settings=ReconcileSettings(resync_s=settings.interval_s, retry_cap_s=30.0),
            registry=metrics.registry,
        )

    # --- the stored book ---

    async def load(self) -> Book:
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/{CONFIGMAP}"
        try:
            obj = await self.kube.json("GET", path)
        except NotFound:
            self._version = ""
            return Book({}, self.settings.thresholds)
        self._version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        try:
            data = json.loads((obj.get("data") or {}).get("book.json", "{}"))
        except ValueError:
            data = {}
        book = book_from_json(data if isinstance(data, dict) else {}, self.settings.thresholds)
        t = book.thresholds
        log.info(
            "queues: book of %d job(s) read from ConfigMap %s; thresholds %.0f/%.0f/%.0f s (%s)",
            len(book.jobs), CONFIGMAP, t.demote_1_s, t.demote_2_s, t.promote_3_s,
            "adapted" if t != self.settings.thresholds else "as configured",
        )  # fmt: skip
        return book

    async def save(self, book: Book) -> None:
        base = f"/api/v1/namespaces/{self.namespace}/configmaps"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP, "namespace": self.namespace},
            "data": {
                "book.json": json.dumps(
                    book_to_json(book, self.settings.thresholds), sort_keys=True
                )
            },
        }
        if self._version:
            body["metadata"]["resourceVersion"] = self._version
            written = await self.kube.json("PUT", f"{base}/{CONFIGMAP}", body=body)
        else:
            written = await self.kube.json("POST", base, body=body)
        self._version = str(written["metadata"]["resourceVersion"])
        self._saved_at = self.clock()

    # --- a pass ---

    def _observe(self) -> dict[str, JobObs]:
        jobs = observe(self.pods.raw_pods(), self.resource, self.release_key())
        seen: set[tuple[str, str]] = set()
        out = {}
        for key, job in jobs.items():
            pods = []
            for p in job.pods:
                seen.add((p.namespace, p.name))
                if p.gated and self._released.get((p.namespace, p.name)) == p.uid:
                    p = replace(p, gated=False)  # released; its event is on its way
                elif not p.gated:
                    self._released.pop((p.namespace, p.name), None)
                pods.append(p)
            out[key] = JobObs(job.key, job.cls, tuple(pods))
        for gone in set(self._released) - seen:
            del self._released[gone]
        return out

    def capacity(self, jobs: dict[str, JobObs]) -> tuple[Capacity, int]:
        """Free healthy GPUs an ordinary pod may get, per node: on nodes whose agent is alive,
        not in the standby pool (any type, any tier: where they fit is the filter's to say); less
        those of released pods the ledgers do not show yet (unplaced, or bound with the ledger's
        event still on its way: watches of two kinds are not ordered), whose GPUs in all are
        the second answer."""
        free = {
            str(state.node): sum(
                n for cls, n in state.free.items() if cls.healthy and not cls.standby
            )
            for state in self.cluster
            if state.offering
        }
        cap = Capacity(self.nodes, free)
        allocated = {uid for state in self.cluster for uid in state.allocations}
        in_flight = 0
        for job in jobs.values():
            for p in job.pods:
                if p.gated or p.phase not in ("Pending", "Running") or p.uid in allocated:
                    continue
                in_flight += p.gpus
                if p.bound:
                    cap.take(p.constraints.node_name, p.gpus)
                else:
                    cap.fit(p.constraints, p.gpus)
        return cap, in_flight

    async def reconcile(self, key: str) -> Requeue:
        await self.synced.wait()
        await self.nodes_synced.wait()
        if self.book is None:
            self.book = await self.load()
        now = self.clock()
        jobs = self._observe()
        before = self.book
        book, moves = advance(before, jobs, now, adapt_every=self.settings.adapt_every)
        cap, in_flight = self.capacity(jobs)
        releases = release(jobs, book, cap.copy())
        for move in moves:
            await self._announce(move, jobs[move.job])
        elastic = Elastics(self, jobs, now)
        await elastic.profile()
        releases = await elastic.shrink_for(releases, cap.copy())
        released = 0
        for r in releases:
            released += await self._release(r, jobs[r.job], now)
        waiting = any(p.gated for j in jobs.values() for p in j.pods)
        if not releases and in_flight == 0 and not waiting:
            await elastic.grow(cap)
        self.book = book
        self._gauges(jobs, book)
        changed = (
            moves
            or released
            or book.means != before.means
            or book.thresholds != before.thresholds
            or book.jobs.keys() != before.jobs.keys()
            or any(
                book.jobs[k].done != before.jobs[k].done
                for k in book.jobs.keys() & before.jobs.keys()
            )
        )
        if changed or now - self._saved_at >= self.settings.save_every_s:
            try:
                await self.save(book)
            except Conflict:
                # Written by another (a leader before this one): read it again next pass.
                log.warning("queues: ConfigMap %s changed under us; reading it again", CONFIGMAP)
                self.book = None
        return Requeue(self.settings.interval_s)

    async def _release(self, r: Release, job: JobObs, now: float) -> int:
        pod = self.pods.get(r.namespace, r.name)
        if pod is None:
            return 0
        index, key = gate_index(pod), self.release_key()
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if (index is None and key is None) or key == b"" or (key and not uid):
            return 0  # released meanwhile, or no proof to give (the key unreadable: logged)
        annotations = (pod.get("metadata") or {}).get("annotations")
        queue = str(int(r.queue))
        written = {contract.ANN_QUEUE: queue}
        # The proof (common/queuerelease.py), for this UID: the pod tested is the one signed.
        patch: list[dict[str, Any]] = (
            [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []
        )
        if key:
            written[contract.ANN_QUEUE_RELEASED] = release_proof(key, uid)
        if index is not None:
            patch += [
                {"op": "test", "path": f"/spec/schedulingGates/{index}/name",
                 "value": contract.SCHEDULING_GATE},
                {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
            ]  # fmt: skip
        if isinstance(annotations, dict):
            patch += [
                {"op": "add", "path": f"/metadata/annotations/{_pointer(name)}", "value": value}
                for name, value in written.items()
            ]
        else:
            patch.append({"op": "add", "path": "/metadata/annotations", "value": written})
        try:
            await self.kube.json(
                "PATCH",
                f"/api/v1/namespaces/{r.namespace}/pods/{r.name}",
                body=patch,
                content_type="application/json-patch+json",
            )
        except (NotFound, InvalidInput) as e:
            # Gone, re-created, or its gate removed meanwhile (a test op failed): not released.
            log.info("queues: pod %s/%s not released: %s", r.namespace, r.name, e)
            return 0
        self._released[(r.namespace, r.name)] = uid
        created = next((p.created for p in job.pods if p.name == r.name), now)
        self.metrics.released.labels(queue).inc()
        self.metrics.wait.labels(queue).observe(max(0.0, now - created))
        log.info(
            "queues: released pod %s/%s of job %s (queue %s, %d GPU(s))",
            r.namespace, r.name, r.job, queue, r.gpus,
        )  # fmt: skip
        return 1

    async def _announce(self, move: Move, job: JobObs) -> None:
        """The move on every pod of the job: its annotations and an Event."""
        verb = "QueueDemoted" if move.new > move.old else "QueuePromoted"
        message = f"job {move.job}: queue {int(move.old)} -> {int(move.new)}: {move.reason}"
        log.info("queues: %s", message)
        self.metrics.moves.labels(str(int(move.old)), str(int(move.new))).inc()
        for p in job.pods:
            if p.phase in ("Succeeded", "Failed"):
                continue
            with contextlib.suppress(NotFound):
                await self.kube.json(
                    "PATCH",
                    f"/api/v1/namespaces/{p.namespace}/pods/{p.name}",
                    body={"metadata": {"annotations": {
                        contract.ANN_QUEUE: str(int(move.new)),
                        contract.ANN_QUEUE_REASON: move.reason,
                    }}},
                    content_type="application/merge-patch+json",
                )  # fmt: skip
                await post_event(
                    self.kube,
                    Involved("Pod", p.namespace, p.name, p.uid),
                    verb,
                    message,
                    warning=False,
                    component=COMPONENT,
                )

    def _gauges(self, jobs: dict[str, JobObs], book: Book) -> None:
        counts = {"1": 0, "2": 0, "3": 0}
        for key, job in jobs.items():
            q = str(int(book.queue_of(key, job.cls)))
            counts[q] += sum(1 for p in job.pods if p.gated)
        for q, n in counts.items():
            self.metrics.gated.labels(q).set(n)
        t = book.thresholds
        for name, value in (
            ("demote_1", t.demote_1_s), ("demote_2", t.demote_2_s), ("promote_3", t.promote_3_s)
        ):  # fmt: skip
            self.metrics.threshold.labels(name).set(value)

    async def _watch_nodes(self) -> None:
        async for event, obj in self.kube.list_watch("/api/v1/nodes"):
            if event == "SYNCED":
                self.nodes_synced.set()
                continue
            name = str((obj.get("metadata") or {}).get("name", ""))
            facts = None if event == "DELETED" else node_facts(obj)
            if self.nodes.get(name) == facts:
                continue  # a status update: nothing a pod's placement reads
            if facts is None:
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = facts
            self.loop.add(KEY)

    async def run(self) -> None:
        """Watch and reconcile until cancelled (one leadership term: the book is read anew)."""
        self.book = None
        self.synced.clear()
        self.nodes_synced.clear()
        self.nodes = {}
        self.cluster, self.pods = ClusterState(), PodCache(self.resource)
        apply = view_applier(self.cluster, self.pods)

        def on_event(kind: Kind, event: str, obj: dict[str, Any]) -> None:
            apply(kind, event, obj)
            if kind in ("Pod", "GpuAllocation"):
                self.loop.add(KEY)

        tasks: tuple[asyncio.Task[None], ...] = (
            asyncio.create_task(
                follow_watch(store=self.store, kinds=KINDS, apply=on_event, synced=self.synced.set),
                name="queues-watch",
            ),
            asyncio.create_task(
                run_liveness(cluster=self.cluster, timeout_s=self.agent_timeout_s),
                name="queues-liveness",
            ),
            asyncio.create_task(self._watch_nodes(), name="queues-nodes"),
        )
        tasks += (asyncio.create_task(self.loop.run(), name="queues-loop"),)
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raises its error
                raise RuntimeError(f"{task.get_name()} ended unexpectedly")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class Elastics:
    """One pass's elastic jobs (extender.queues.growth): their views, declared workloads and
    replica counts (their pods not yet ended), and the scale writes."""

    def __init__(self, ctl: QueuesController, jobs: dict[str, JobObs], now: float) -> None:
        self.ctl, self.now = ctl, now
        by_job: dict[str, list[dict[str, Any]]] = {}
        for raw in ctl.pods.raw_pods():
            k = job_key(raw)
            if k in jobs and not _ended(raw):
                by_job.setdefault(k, []).append(raw)
        self.views: dict[str, JobView] = {}
        self.declared: dict[str, Elastic] = {}
        self.replicas: dict[str, int] = {}
        self.constraints: dict[str, Constraints] = {}
        self.queries: dict[str, str] = {}  # scoped to the job's namespace
        # Throughput queries that cannot be scoped: job -> (the pod's metadata, query, why).
        self.refused: dict[str, tuple[dict[str, Any], str, str]] = {}
        self.running: dict[str, bool] = {}
        self.pod_constraints = {
            (p.namespace, p.name): p.constraints for j in jobs.values() for p in j.pods
        }
        for key, job in jobs.items():
            live = [p for p in job.pods if p.phase not in ("Succeeded", "Failed")]
            first = next(iter(by_job.get(key, ())), None)
            if first is None or not live:
                continue
            meta = first.get("metadata") or {}
            if contract.ANN_OWNER not in (meta.get("annotations") or {}):
                if contract.ANN_WORKLOAD in (meta.get("annotations") or {}):
                    log.warning("queues: %s declares a workload but no %s", key, contract.ANN_OWNER)
                continue
            e, problems = declared(
                meta.get("annotations") or {}, str(meta.get("namespace", "")), live[0].gpus
            )
            if problems:
                log.warning("queues: job %s: %s", key, "; ".join(problems))
            if e is not None:
                self.declared[str(key)] = e
                self.replicas[str(key)] = len(live)
                # Where another replica may go: its pods' say, not the node one is bound to.
                self.constraints[str(key)] = replace(live[0].constraints, node_name="")
                query = (meta.get("annotations") or {}).get(contract.ANN_THROUGHPUT_QUERY)
                if query:
                    self._scope(str(key), meta, str(query))
                self.running[str(key)] = all(p.bound and p.phase == "Running" for p in live)
        if self.declared:  # the views only the elastic jobs need, and only then
            held = held_by_job(a for state in ctl.cluster for a in state.allocations.values())
            pods = [raw for key in self.declared for raw in by_job[key]]
            views = job_views(pods, held, now=now, resource=ctl.resource)
            self.views = {str(k): v for k, v in views.items()}

    def _scope(self, key: str, meta: dict[str, Any], query: str) -> None:
        """The job's throughput query, scoped to its pods' namespace (common/queryscope.py);
        one that cannot be is refused: never run, the job profiled as if it named none."""
        namespace = str(meta.get("namespace", ""))
        label = self.ctl.settings.tenant_query_label
        try:
            self.queries[key] = scope_query(query, namespace, label)
        except InvalidInput as e:
            why = refusal(contract.ANN_THROUGHPUT_QUERY, namespace, label, e)
            self.refused[key] = (meta, query, why)

    async def _tell_refused(self) -> None:
        """A Warning Event on the pod and a log line, once per pod and query, for each job
        whose throughput query was refused."""
        told = self.ctl.refused_queries
        for key in set(told) - set(self.refused):
            del told[key]  # gone, or its query fixed: a new refusal is told again
        for key, (meta, query, why) in self.refused.items():
            uid = str(meta.get("uid", ""))
            if told.get(key) == (uid, query):
                continue
            namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            log.warning("queues: job %s: pod %s/%s: %s", key, namespace, name, why)
            try:
                await post_event(
                    self.ctl.kube,
                    Involved("Pod", namespace, name, uid),
                    "ThroughputQueryRefused",
                    why,
                    warning=True,
                    component=COMPONENT,
                )
            except NotFound:
                pass
            except TideleaseError as e:  # told again next pass
                log.warning("queues: job %s: Event not posted: %s", key, e)
                continue
            told[key] = (uid, query)

    async def profile(self) -> None:
        """The ramp-up profiler (extender.queues.measuring: the job's throughput at each GPU
        count it runs at; cornucopia 4.3) on each elastic job that names its throughput query:
        a reading at the GPUs it holds while every pod of it runs, the measurements kept on its
        workload; its view then scales by what was measured. A query is run only scoped to the
        job's namespace (one that cannot be is told, and the job is profiled as if it named
        none)."""
        prof = self.ctl.profiler
        if prof is None:
            return
        await self._tell_refused()
        for key, e in self.declared.items():
            query = self.queries.get(key)
            view = self.views.get(key)
            if not query or view is None:
                continue
            await prof.load(self.ctl.kube, key, e.path)
            if self.running.get(key):
                await prof.observe(key, query, view.held, self.now)
                await prof.save(self.ctl.kube, key, e.path)
            self.views[key] = replace(view, profile=prof.profile(key, view.profile, view.request))

    def _settled(self) -> dict[str, Elastic]:
        """The declared jobs not being scaled now (their pods caught up with the last write, or
        it is older than SCALE_WAIT_S), every pod of them placed."""
        out = {}
        for key, e in self.declared.items():
            target = self.ctl.scaling.get(key)
            if target is not None:
                if self.replicas[key] != target[0] and self.now - target[1] < SCALE_WAIT_S:
                    continue
                del self.ctl.scaling[key]
            out[key] = e
        return out

    async def _scale(self, key: str, replicas: int, why: str) -> bool:
        e = self.declared[key]
        try:
            await self.ctl.kube.json(
                "PATCH", e.path, body={"spec": {"replicas": replicas}},
                content_type="application/merge-patch+json",
            )  # fmt: skip
        except (NotFound, InvalidInput) as err:
            log.warning("queues: job %s: cannot scale %s/%s: %s", key, e.kind, e.name, err)
            return False
        log.info(
            "queues: job %s: %s/%s %d -> %d replicas: %s",
            key, e.kind, e.name, self.replicas[key], replicas, why,
        )  # fmt: skip
        self.ctl.scaling[key] = (replicas, self.now)
        self.ctl.metrics.scaled.labels("up" if replicas > self.replicas[key] else "down").inc()
        return True

    async def grow(self, cap: Capacity) -> None:
        """One replica more for the job that scales best among those whose next replica fits
        (cornucopia Algorithm 2), while no scale write of any job is still under way."""
        settled = self._settled()
        if self.ctl.scaling:
            return
        fits = {k: cap.fits(self.constraints[k], e.replica_gpus) for k, e in settled.items()}
        step = grow(self.views, {k: e for k, e in settled.items() if fits[k]}, self.replicas)
        if step is not None:
            await self._scale(step.job, step.replicas, step.reason)

    async def shrink_for(self, releases: list[Release], cap: Capacity) -> list[Release]:
        """The releases, less interactive pods that wait for elastic jobs to shrink for them
        (the jobs that lose least, by whole replicas, on GPU counts: cornucopia Algorithm 3)
        rather than preempt."""
        out = []
        shrinking = any(
            k in self.ctl.scaling and self.ctl.scaling[k][0] < n for k, n in self.replicas.items()
        )
        for r in releases:
            c = self.pod_constraints.get((r.namespace, r.name), Constraints())
            if r.queue is not Queue.INTERACTIVE:
                out.append(r)
                continue
            if cap.fit(c, r.gpus) is not None:
                out.append(r)
                continue
            avail = cap.most_free(c)
            waited = self.now - self.ctl.holding.setdefault((r.namespace, r.name), self.now)
            if shrinking and waited < SCALE_WAIT_S:
                continue  # the GPUs of a shrink under way are coming
            plan = None if shrinking else shrink(
                r.gpus - avail, self.views, self._settled(), self.replicas
            )  # fmt: skip
            if plan:
                for key, replicas in plan.items():
                    await self._scale(key, replicas, f"interactive pod {r.namespace}/{r.name}")
                shrinking = True
                continue
            out.append(r)  # kube-scheduler's preemption, through the extender
        for r in out:
            self.ctl.holding.pop((r.namespace, r.name), None)
        for gone in self.ctl.holding.keys() - self.pod_constraints.keys():
            del self.ctl.holding[gone]
        return out


def _ended(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _pointer(key: str) -> str:
    """A map key as a JSON pointer segment."""
    return key.replace("~", "~0").replace("/", "~1")
