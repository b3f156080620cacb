"""The soak runner: a seeded plan (tests/soak/workload.py) played on a running local cluster,
its faults done and undone, the cluster observed every second and the invariants checked
throughout (tests/soak/invariants.py); then a report.

The cluster is hack/cluster-up.sh's (its cluster.env facts), started with :data:`CLUSTER_ENV`
(hack/soak.py does): the extender's reserve TTL, its agent timeout and the controllers'
reclaim-overdue time are compressed as the tides are, so that the checkers' windows, which
follow from them, fit a run of minutes. Its extender and kube-scheduler become two replicas
(tests/soak/replicas.py); the kwok nodes' agent heartbeats are renewed by the runner
(tests/soak/heartbeats.py). The checkers' parameters:

* ledgers settle within the reserve TTL (a bind's ledger entry whose pod was never bound) or
  the missing-pod grace, whichever is longer, plus a reap interval, plus a margin for the
  faults (an extender restarting, an API server away): :data:`LEDGER_SETTLE_S`;
* a reclaim ends, or its lease is Degraded, within the notice (the cluster's 2 s) plus the
  overdue time plus a margin (the controllers restarting): :data:`RECLAIM_BOUND_S`; a
  replica whose group could come back whole throughout gets it back, and where it could not,
  stand-ins may be free untagged devices (docs/leasing.md: what the node offers, then other
  free devices, then standby); a node's agent counts as heard while its heartbeat is younger
  than :data:`HEARTBEAT_FRESH_S`;
* a GPU pod may wait :data:`PENDING_BOUND_S` while devices fit it (kube-scheduler's backoff,
  an extender restarting);
* leaks are judged only in runs of ten minutes or more.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import builders, contract
from common.gangs import WORKLOAD_API, WORKLOAD_REF
from common.model import Health, Priority, Tier
from common.prewarmwire import parse_items
from extender.cluster.watching import liveness_interval
from extender.rightofreturn.lease import parse_gpu_lease
from tests.background import read_state
from tests.benchtools import quantile
from tests.e2e import queuesrig
from tests.e2e.harness import BORROWER, ONLINE, Cluster, RealNode, workload
from tests.e2e.kube import ApiError, path_of
from tests.processes import Processes, Supervisor
from tests.soak import heartbeats, replicas
from tests.soak.invariants import (
    GANG_SIZE_LABEL,
    NO_SPACE,
    Checker,
    GangWhole,
    LeakTrend,
    LedgerMatchesPods,
    NoDoubleHold,
    NoticeBeforeEviction,
    Observation,
    PendingWhileFree,
    PrewarmRecovers,
    ProcessSample,
    QueuedReleased,
    ReclaimEnds,
    Violation,
    slope_per_hour,
)
from tests.soak.observing import Observer
from tests.soak.peercache import PeerCache
from tests.soak.workload import Borrower, Fault, OnlineJob, Plan

ROOT = Path(__file__).resolve().parents[2]

GRACE_S = 2  # TL_CLUSTER_LEASING_GRACE_S's default: the notice every reclaim gives here
RESERVE_TTL_S = 30.0  # the extender's reserve_ttl_s on the soak's cluster (default 120)
MISSING_GRACE_S = 30.0  # its missing_grace_s (default)
REAP_INTERVAL_S = 10.0  # its reap_interval_s (default)
RECLAIM_OVERDUE_S = 45.0  # the controllers' reclaim_overdue_s on the soak's cluster (default 120)
AGENT_TIMEOUT_S = 15.0  # the extender's agent_timeout_s on the soak's cluster (default 60)
# A node whose agent heartbeat is older than this offers the pending-while-free checker nothing:
# longer than any agent's period (the runner's for the kwok nodes, heartbeats.RENEW_S; the real
# node's agent's own, 10 s), shorter than AGENT_TIMEOUT_S, after which the extender gives up on
# the node (between the two, the checker is the more careful).
HEARTBEAT_FRESH_S = AGENT_TIMEOUT_S - 2.0
# How often the extender judges its agents: a node whose agent is heard again is offered at the
# next sweep, up to this long after the renewal.
AGENT_SWEEP_S = liveness_interval(AGENT_TIMEOUT_S)
FAULT_MARGIN_S = 30.0  # a restart, an API server away, a paused etcd
LEDGER_SETTLE_S = max(RESERVE_TTL_S, MISSING_GRACE_S) + REAP_INTERVAL_S + FAULT_MARGIN_S
RECLAIM_BOUND_S = RECLAIM_OVERDUE_S + FAULT_MARGIN_S
PENDING_BOUND_S = 60.0
# A gang bound in part: kube-scheduler binds a gang's members within moments; once one is
# evicted the rest follow within the gang controller's step, or after a node deleted with a
# member on it, kube-controller-manager's pod GC (orphans every 20 s) and that step.
GANG_BOUND_S = 60.0
GANG_GROUP = "workers"  # the pod group of a gang's Workload
# A prewarm item's fetch: retried twice, 15 s apart (nodeagent.prewarm), a checkpoint pulled in
# seconds, plus a fault's margin; and how soon after the cache disk had room again the agent
# reports no more failures for want of space (a failed attempt is reported within a second or
# two, the API server away a few more).
PREWARM_BOUND_S = 120.0
PREWARM_SETTLE_S = 30.0
CACHE_DISK_MIB = 64  # the real node's cache disk (hack/realnode.sh -C)
FILLER = ".soak-disk-full"  # the other writer's file on it
LEAK_MIN_MINUTES = 10.0
RSS_BYTES_PER_HOUR = 64 * 2**20
FDS_PER_HOUR = 100.0

# The soak's cluster settings (environment of hack/cluster-up.sh; TIDELEASE_EXTENDER_* reach
# the extender and the controllers).
CLUSTER_ENV = {
    # the chart's controllers with the shared queues (extender.controllers.queues=true) and
    # the gang controller (scheduling.gangScheduling=true)
    "TL_CLUSTER_CONTROLLER_FLAGS": (
        "--leasing-controller --hot-restart-operator --prewarm-controller --queues-controller"
        " --gang-controller"
    ),
    # the queues' thresholds compressed too: jobs move between queues within a run
    "TIDELEASE_EXTENDER_QUEUE_DEMOTE_INTERACTIVE_S": "20",
    "TIDELEASE_EXTENDER_QUEUE_DEMOTE_BATCH_S": "45",
    "TIDELEASE_EXTENDER_QUEUE_PROMOTE_S": "45",
    "TIDELEASE_EXTENDER_QUEUE_INTERVAL_S": "2",
    "TIDELEASE_EXTENDER_RESERVE_TTL_S": str(RESERVE_TTL_S),
    "TIDELEASE_EXTENDER_RECLAIM_OVERDUE_S": str(RECLAIM_OVERDUE_S),
    "TIDELEASE_EXTENDER_AGENT_TIMEOUT_S": str(AGENT_TIMEOUT_S),
}

# role -> its pid's key in cluster.env (the extender and the kube-scheduler become two
# replicas: tests/soak/replicas.py)
ROLES = {
    "extender": "TL_CLUSTER_EXTENDER_PID",
    "kube-scheduler": "TL_CLUSTER_SCHEDULER_PID",
    "controllers": "TL_CLUSTER_CONTROLLERS_PID",
    "kube-apiserver": "TL_CLUSTER_APISERVER_PID",
    "kube-controller-manager": "TL_CLUSTER_KCM_PID",
    "etcd": "TL_CLUSTER_ETCD_PID",
}
SAMPLED = (replicas.extender(0), replicas.extender(1), "controllers")
# tidelease's own processes: none of them may exit on its own.
AGENT_REAL = "agent-real"  # the real node's tidelease agent (a process of hack/realnode.sh)
TIDELEASE_ROLES = frozenset(
    {"controllers", AGENT_REAL, *(replicas.extender(i) for i in range(replicas.REPLICAS))}
)
KILLED = {  # the faults that kill -9 one process and restart it at once
    "agent-kill": AGENT_REAL,
    "controllers-kill": "controllers",
    "apiserver-kill": "kube-apiserver",
    "kcm-kill": "kube-controller-manager",
}


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [soak] {msg}", file=sys.stderr, flush=True)


def checkers(minutes: float) -> list[Checker]:
    out: list[Checker] = [
        NoDoubleHold(),
        LedgerMatchesPods(LEDGER_SETTLE_S),
        ReclaimEnds(
            RECLAIM_BOUND_S,
            grace_s=GRACE_S,
            untagged_stand_ins=True,
            fresh_s=HEARTBEAT_FRESH_S,
            settle_s=AGENT_SWEEP_S + 1.0,
        ),
        NoticeBeforeEviction(),
        PendingWhileFree(PENDING_BOUND_S, fresh_s=HEARTBEAT_FRESH_S),
        QueuedReleased(PENDING_BOUND_S, fresh_s=HEARTBEAT_FRESH_S),
        GangWhole(GANG_BOUND_S),
        PrewarmRecovers(PREWARM_BOUND_S, settle_s=PREWARM_SETTLE_S),
    ]
    if minutes >= LEAK_MIN_MINUTES:
        out.append(
            LeakTrend(
                rss_bytes_per_hour=RSS_BYTES_PER_HOUR,
                fds_per_hour=FDS_PER_HOUR,
                warmup_s=120.0,
                min_span_s=min(600.0, minutes * 30.0),
            )
        )
    return out


def template(name: str, namespace: str, gpus: int, **kwargs: Any) -> dict[str, Any]:
    """A pod as the e2e tests make theirs (common.builders.pod), on the shared kwok nodes."""
    obj = builders.pod(name, gpus, namespace=namespace, **kwargs)
    obj["metadata"].pop("uid")
    obj.pop("status")
    obj["spec"]["terminationGracePeriodSeconds"] = 0
    return obj


@dataclass
class Report:
    seed: int
    minutes: float
    faults: dict[str, int] = field(default_factory=dict)
    faults_done: list[str] = field(default_factory=list)
    reclaims: int = 0
    reclaims_judged: int = 0  # reclaims whose end the reclaim-ends checker judged
    reclaim_s: list[float] = field(default_factory=list)  # each one's time, Reclaiming -> Steady
    lends: int = 0
    violations: list[str] = field(default_factory=list)
    processes: dict[str, dict[str, float]] = field(default_factory=dict)
    observations: int = 0
    observations_failed: int = 0
    deletions: int = 0
    borrowers: int = 0
    queued: int = 0  # of the borrowers, those through the shared queues
    errors: list[str] = field(default_factory=list)  # the harness's own failures
    # Processes that exited on their own (no fault killed them), started again as a kubelet
    # would: what they last said.
    exits: list[str] = field(default_factory=list)
    schedule: list[str] = field(default_factory=list)
    # The real node's prewarm of its online job's checkpoints: each item's last report (the
    # item's lease and name -> its state and reason).
    prewarm: dict[str, str] = field(default_factory=dict)
    prewarm_no_space: int = 0  # fetch attempts it reported failed for want of space

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "minutes": self.minutes,
            "faults": self.faults,
            "faults_done": self.faults_done,
            "reclaims": self.reclaims,
            "reclaims_judged": self.reclaims_judged,
            "reclaim_p50_s": round(quantile(self.reclaim_s, 0.5), 2) if self.reclaim_s else None,
            "reclaim_p99_s": round(quantile(self.reclaim_s, 0.99), 2) if self.reclaim_s else None,
            "lends": self.lends,
            "violations": self.violations,
            "processes": self.processes,
            "observations": self.observations,
            "observations_failed": self.observations_failed,
            "deletions": self.deletions,
            "borrowers": self.borrowers,
            "queued": self.queued,
            "errors": self.errors,
            "exits": self.exits,
            "prewarm": self.prewarm,
            "prewarm_no_space": self.prewarm_no_space,
        }

    def lines(self) -> list[str]:
        j = self.as_json()
        out = [
            f"soak report: seed {self.seed}, {self.minutes:g} min, {self.observations} "
            f"observations ({self.observations_failed} failed), {self.borrowers} borrowers "
            f"({self.queued} through the shared queues), "
            f"{self.deletions} deletions seen",
            "faults: " + " ".join(f"{k}={v}" for k, v in sorted(self.faults.items())),
            f"reclaims: {j['reclaims']} (p50 {j['reclaim_p50_s']} s, p99 {j['reclaim_p99_s']} s;"
            f" {self.reclaims_judged} judged), lends: {self.lends}",
        ]
        for name, p in sorted(self.processes.items()):
            out.append(
                f"process {name}: {p['samples']:.0f} samples over {p['span_s']:.0f} s, RSS "
                f"{p['rss_mib_last']:.1f} MiB ({p['rss_mib_per_h']:+.1f} MiB/h), fds "
                f"{p['fds_last']:.0f} ({p['fds_per_h']:+.1f}/h)"
            )
        if self.prewarm:
            states = [v.split(":", 1)[0] for v in self.prewarm.values()]
            out.append(
                "prewarm on the real node: "
                + ", ".join(f"{s} {states.count(s)}" for s in sorted(set(states)))
                + f"; {self.prewarm_no_space} fetch attempt(s) failed for want of space"
            )
            out += [f"  {k}: {v}" for k, v in sorted(self.prewarm.items())]
        out.append(f"exits (restarted as a kubelet would): {len(self.exits)}")
        out += [f"  {e}" for e in self.exits]
        if self.errors:
            out.append(f"harness errors: {len(self.errors)}")
            out += [f"  {e}" for e in self.errors]
        out.append(f"violations: {len(self.violations)}")
        out += [f"  {v}" for v in self.violations]
        if self.violations:
            out.append(f"replay: hack/soak.py --minutes {self.minutes:g} --seed {self.seed}")
            out.append("the seed's schedule:")
            out += [f"  {line}" for line in self.schedule]
        return out


class Runner:
    def __init__(self, cluster: Cluster, facts: dict[str, str], plan: Plan, minutes: float):
        self.cluster, self.kube, self.plan = cluster, cluster.kube, plan
        self.minutes = minutes
        self.facts = facts
        pids = {r: int(facts[k]) for r, k in ROLES.items()}
        self.real = RealNode.from_state(facts)
        # The real node's cache disk (in the node's mount namespace), filled by disk-full.
        self.cache_disk: Path | None = None
        self.node_ns = ""
        if self.real is not None:  # its agent: hack/realnode.sh's process, struck by agent-kill
            node_env = read_state(cluster.dir / "realnode" / "realnode.env")
            pids[AGENT_REAL] = int(node_env["TL_REALNODE_AGENT_PID"])
            if node_env.get("TL_REALNODE_CACHE_DIR"):
                self.cache_disk = Path(node_env["TL_REALNODE_CACHE_DIR"])
                self.node_ns = f"/proc/{node_env['TL_REALNODE_PID']}/ns/mnt"
        self.peer: PeerCache | None = None  # the real node's peer (with its cache disk)
        self._steps = 0  # checkpoints the real node's online job has "written"
        self._full: set[str] = set()  # nodes whose cache disk is full now
        self.processes = Processes(cluster.dir, pids)
        self.observer = Observer(
            self.kube,
            agent_namespace=facts.get("TL_CLUSTER_NAMESPACE") or contract.DEFAULT_AGENT_NAMESPACE,
        )
        self.checkers = checkers(minutes)
        self.report = Report(plan.seed, minutes, schedule=plan.describe())
        self.prefix = facts["TL_CLUSTER_NODE_PREFIX"]
        self._events: list[tuple[float, int, str, Callable[[], None]]] = []
        self._seq = 0
        self._t0 = 0.0
        self._blocked_until_ready = False  # the API server restarting
        self._paused = False  # etcd stopped
        self._lost: dict[int, float] = {}  # node index -> when it comes back
        self._silent: set[int] = set()  # nodes whose agent a fault silenced
        self._reclaims: dict[str, int] = {}  # lease -> its reclaims counter, last seen
        self._groups: dict[str, int] = {}  # lease -> its lent groups, last seen
        self._samples: dict[str, list[tuple[float, ProcessSample]]] = {}
        self._job_lease: dict[str, OnlineJob] = {j.name: j for j in plan.jobs}
        self._stack = contextlib.ExitStack()  # what setup made that close undoes
        self.replicas: replicas.Replicas | None = None
        self.supervisor: Supervisor  # while run() runs
        self.namespace = facts.get("TL_CLUSTER_NAMESPACE") or contract.DEFAULT_AGENT_NAMESPACE
        nodes = int(facts["TL_CLUSTER_NODES"])
        self.heartbeats = heartbeats.Heartbeats(
            self.kube,
            [f"{self.prefix}-{i}" for i in range(nodes)],
            namespace=self.namespace,
            duration_s=int(AGENT_TIMEOUT_S),
        )

    # --- the clock and the queue ---
    def now(self) -> float:
        return time.monotonic() - self._t0

    def at(self, t: float, what: str, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, what, action))

    def api_down(self) -> bool:
        if self._paused:
            return True
        if self._blocked_until_ready:
            try:
                self.kube.request("GET", "/api/v1/namespaces/default", timeout=2)
            except Exception:
                return True
            self._blocked_until_ready = False
            log(f"t={self.now():.1f} the API server answers again")
        return False

    # --- setup ---
    def setup(self) -> None:
        self.cluster.ensure_priority_class(BORROWER, 10)
        for ns in self.plan.online_namespaces:
            self.kube.create(builders.namespace(ns, online=True))
        for ns in self.plan.borrower_namespaces:
            self.kube.create(builders.namespace(ns, online=False))
        # The shared queues' borrowers: the chart's gate policy holds their pods at creation
        # until the queues controller (one of the controllers here) releases them.
        self.kube.create(builders.namespace(self.plan.queued_namespace, online=False))
        self._stack.enter_context(queuesrig.gate(self.cluster, self.plan.queued_namespace))
        if self.real is not None and self.cache_disk is not None:
            self.peer = self._start_peer()
        for job in self.plan.jobs:
            pod = self._on_node(
                template(
                    "template",
                    job.namespace,
                    job.gpus_per_replica,
                    priority=Priority.HIGH,
                    owner=job.name,
                    tier=Tier.HA,
                    priority_class=ONLINE,
                ),
                job.real,
            )
            made = workload(job.kind, job.name, job.namespace, pod, replicas=job.replicas)
            if job.real and self.peer is not None:
                # It "trains": each scale-down writes a checkpoint, which the node prewarms
                # before the next scale-up. OnDelete: a new one in the template rolls no pod.
                annotations = made["spec"]["template"]["metadata"].setdefault("annotations", {})
                annotations[contract.ANN_CHECKPOINT] = self.peer.checkpoint(job.name, 0)
                made["spec"]["updateStrategy"] = {"type": "OnDelete"}
            self.kube.create(made)
            lease = builders.gpu_lease(
                job.name,
                job.namespace,
                gpus_per_replica=job.gpus_per_replica,
                desired_gpus=job.full,
                grace_s=30,
            )
            lease["spec"]["workload"]["kind"] = job.kind
            self.kube.create(lease)
        want = sum(j.replicas for j in self.plan.jobs)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            placed = [
                p
                for p in self.kube.list("Pod")
                if (p["metadata"].get("annotations") or {}).get(contract.ANN_DEVICES)
                and p["spec"].get("nodeName")
            ]
            if len(placed) >= want:
                log(f"the online jobs' {want} pods are placed")
                return
            time.sleep(1)
        raise RuntimeError(f"the online jobs' {want} pods were not all placed in 180 s")

    def _start_peer(self) -> PeerCache:
        """The real node's peer, published as the first kwok node's that no fault deletes."""
        deleted = {f.node for f in self.plan.faults if f.kind == "node-delete"}
        nodes = int(self.facts["TL_CLUSTER_NODES"])
        index = next((i for i in range(nodes) if i not in deleted), 0)
        work = self.cluster.dir / "soak-peer"
        work.mkdir(exist_ok=True)
        peer = PeerCache(
            work,
            self.cluster.kubeconfig,
            self.kube,
            node=f"{self.prefix}-{index}",
            namespace=self.namespace,
        )
        peer.start()
        self._stack.callback(peer.stop)
        log(f"the real node's peer cache on {peer.url}, published as {peer.node}'s")
        return peer

    def _daily(self, t0_wall: float) -> None:
        """The real node's job's tides as its GpuLease's daily schedule (HH:MM, UTC) from the
        run's start ``t0_wall`` (on a whole minute): its scale-ups are known ahead, as a daily
        tide's are, and the prewarm controller has its node fetch the new checkpoint before
        each. A last entry after the run keeps the job whole until the first."""
        for job in (j for j in self.plan.jobs if j.real):
            tides = [x for x in self.plan.tides if x.job == job.name]
            end = max([x.t for x in tides], default=0.0) + 60.0
            entries = [(x.t, x.desired_gpus) for x in tides] + [(end, job.full)]
            schedule = [
                {"at": time.strftime("%H:%M", time.gmtime(t0_wall + t)), "gpus": gpus}
                for t, gpus in entries
            ]
            self.kube.patch(
                contract.KIND_GPU_LEASE, job.name, {"spec": {"schedule": schedule}}, job.namespace
            )
            log(
                f"{job.namespace}/{job.name}: daily schedule "
                + ", ".join(f"{e['at']}->{e['gpus']}" for e in schedule)
            )

    def _new_checkpoint(self, job: OnlineJob) -> None:
        """``job`` wrote a checkpoint: into the peer, and named in its pod template."""
        assert self.peer is not None
        self._steps += 1
        ref = self.peer.checkpoint(job.name, self._steps)
        annotations = {contract.ANN_CHECKPOINT: ref}
        patch = {"spec": {"template": {"metadata": {"annotations": annotations}}}}
        self.kube.patch(job.kind, job.name, patch, job.namespace)
        log(f"t={self.now():.1f} {job.namespace}/{job.name} checkpoint {ref.split('@')[0]}")

    def _on_node(self, pod: dict[str, Any], real: bool) -> dict[str, Any]:
        """``pod`` as it is for the kwok nodes, or (``real``) moved to the real node: its taint
        tolerated, the node selected, a local image that runs there, a second to stop."""
        if not real:
            return pod
        if self.real is None:
            raise RuntimeError("the plan has real-node pods, the cluster no real node")
        on_real = self.real.pod("-", "-", gpus=1)["spec"]
        spec = pod["spec"]
        for key in ("nodeSelector", "tolerations", "terminationGracePeriodSeconds"):
            spec[key] = on_real[key]
        container, real_container = spec["containers"][0], on_real["containers"][0]
        for key in ("image", "imagePullPolicy"):
            container[key] = real_container[key]
        return pod

    # --- actions (each retried while the API server is away) ---
    def _api(self, what: str, action: Callable[[], None], tries: int = 60) -> Callable[[], None]:
        def run() -> None:
            if self.api_down():
                self.at(self.now() + 1.0, what, self._api(what, action, tries))
                return
            try:
                action()
            except (ApiError, OSError) as e:
                status = getattr(e, "status", 0)
                if tries > 1 and (status == 0 or status >= 500 or status == 429):
                    self.at(self.now() + 1.0, what, self._api(what, action, tries - 1))
                else:
                    log(f"t={self.now():.1f} {what} failed: {e}")

        return run

    def schedule(self) -> None:
        for tide in self.plan.tides:
            job = self._job_lease[tide.job]
            if job.real and self.peer is not None:  # its lease's own schedule (_daily)
                if tide.desired_gpus < job.full:

                    def train(job: OnlineJob = job) -> None:
                        self._new_checkpoint(job)

                    self.at(tide.t, f"checkpoint of {job.name}", self._api("checkpoint", train))
                continue

            def patch(job: OnlineJob = job, gpus: int = tide.desired_gpus) -> None:
                self.kube.patch(
                    contract.KIND_GPU_LEASE,
                    job.name,
                    {"spec": {"desiredGPUs": gpus}},
                    job.namespace,
                )
                log(f"t={self.now():.1f} tide: {job.namespace}/{job.name} desiredGPUs {gpus}")

            what = f"tide {tide.job}->{tide.desired_gpus}"
            self.at(tide.t, what, self._api(what, patch))
        for b in self.plan.borrowers:
            self.at(b.t, f"borrower {b.name}", self._api(f"borrow {b.name}", self._borrow(b)))
        for f in self.plan.faults:
            self.at(f.t, f"fault {f.kind}", self._fault(f))

    def _gang_workload(self, b: Borrower) -> None:
        """The Workload of ``b``'s gang (its pod group a gang of all its members), made by
        whichever member comes first."""
        body = {
            "apiVersion": WORKLOAD_API,
            "kind": "Workload",
            "metadata": {"name": b.gang, "namespace": b.namespace},
            "spec": {
                "podGroups": [{"name": GANG_GROUP, "policy": {"gang": {"minCount": b.gang_size}}}]
            },
        }
        try:
            self.kube.create(body)
        except ApiError as e:
            if e.status != 409:
                raise

    def _borrow(self, b: Borrower) -> Callable[[], None]:
        def create() -> None:
            pod = self._on_node(
                template(b.name, b.namespace, b.gpus, priority=Priority.LOW), b.real
            )
            pod["spec"]["priorityClassName"] = BORROWER
            if b.job_class:
                pod["metadata"].setdefault("annotations", {})[contract.ANN_JOB_CLASS] = b.job_class
            if b.gang:
                self._gang_workload(b)
                pod["spec"][WORKLOAD_REF] = {"name": b.gang, "podGroup": GANG_GROUP}
                pod["metadata"].setdefault("labels", {})[GANG_SIZE_LABEL] = str(b.gang_size)
            try:
                made = self.kube.create(pod)
            except ApiError as e:
                if e.status != 409:  # made by a try whose answer was lost (API server killed)
                    raise
                found = self.kube.get("Pod", b.name, b.namespace)
                if found is None:
                    return
                made = found
            self.report.borrowers += 1
            self.report.queued += bool(b.job_class)
            uid = str(made["metadata"]["uid"])

            def finish() -> None:
                self.observer.ours.add(uid)
                self.kube.delete("Pod", b.name, b.namespace)

            what = f"finish {b.name}"
            if not b.job_class:
                self.at(self.now() + b.lifetime_s, what, self._api(what, finish))
                return

            # A job of the shared queues runs its time once the queues let it in: its lifetime
            # counts from its binding (a pod the queues never release stays, for the checker).
            def started() -> None:
                pod = self.kube.get("Pod", b.name, b.namespace)
                if pod is None or pod["metadata"]["uid"] != uid:
                    return  # gone (its node deleted): nothing to finish
                if pod["spec"].get("nodeName"):
                    self.at(self.now() + b.lifetime_s, what, self._api(what, finish))
                else:
                    self.at(self.now() + 2.0, f"wait {b.name}", self._api(what, started))

            self.at(self.now() + 2.0, f"wait {b.name}", self._api(what, started))

        return create

    # --- faults ---
    def _fault(self, f: Fault) -> Callable[[], None]:
        def strike() -> None:
            t = self.now()
            if f.kind in KILLED:
                role = KILLED[f.kind]
                if self._paused or (role == "kube-apiserver" and self._blocked_until_ready):
                    self.at(t + 1.0, f"fault {f.kind}", strike)  # the API server: one at a time
                    return
                with self.supervisor.lock:
                    pid = self.processes.kill_and_restart(role)
                if role == "kube-apiserver":
                    self._blocked_until_ready = True
                self._done(f, t, f"{role} killed, restarted as pid {pid}")
            elif f.kind == "extender-kill":
                role = replicas.extender(f.target)
                if not self.processes.pids.get(role):  # its replica is down (replica-kill)
                    self.at(t + 1.0, f"fault {f.kind}", strike)
                    return
                with self.supervisor.lock:
                    pid = self.processes.kill_and_restart(role)
                self._done(f, t, f"{role} killed, restarted as pid {pid}")
            elif f.kind == "replica-kill":
                self._replica_kill(f, t, strike)
            elif f.kind in ("net-delay", "net-drop"):
                self._network(f, t)
            elif f.kind == "device-unhealthy":
                self._device_unhealthy(f, t)
            elif f.kind == "agent-silent":
                self._agent_silent(f, t)
            elif f.kind == "etcd-pause":
                if self._paused or self._blocked_until_ready:
                    self.at(t + 1.0, f"fault {f.kind}", strike)
                    return
                self.processes.pause("etcd")
                self._paused = True
                self.at(t + f.duration_s, "etcd continued", self._resume_etcd)
                self._done(f, t, f"etcd stopped for {f.duration_s:.1f} s")
            elif f.kind == "node-delete":
                self._node_delete(f, t)
            elif f.kind == "disk-full":
                self._disk_full(f, t)

        return strike

    def _in_node(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv`` run in the real node's mount namespace (where its cache disk is)."""
        return subprocess.run(
            ["nsenter", f"--mount={self.node_ns}", "--", *argv],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def _disk_full(self, f: Fault, t: float) -> None:
        """Another writer fills the real node's cache disk, and frees it ``f.duration_s``
        later."""
        assert self.real is not None
        if self.cache_disk is None:
            raise RuntimeError("disk-full: the real node has no cache disk (realnode.sh -C)")
        node, filler = self.real.name, str(self.cache_disk / FILLER)
        # dd stops at ENOSPC (exit 1): the disk is then full.
        self._in_node("dd", "if=/dev/zero", f"of={filler}", "bs=1M")
        statfs = self._in_node("stat", "-f", "-c", "%a %S", str(self.cache_disk)).stdout.split()
        free = int(statfs[0]) * int(statfs[1])
        self._full.add(node)

        def free_it() -> None:
            done = self._in_node("rm", "-f", filler)
            if done.returncode != 0:
                raise RuntimeError(f"disk-full: removing {filler}: {done.stderr.strip()}")
            self._full.discard(node)
            log(f"t={self.now():.1f} {node}'s cache disk has room again")

        self.at(t + f.duration_s, f"{node} cache disk freed", free_it)
        self._done(f, t, f"{node}'s cache disk full ({free} bytes left) for {f.duration_s:.0f} s")

    def _replica_kill(self, f: Fault, t: float, again: Callable[[], None]) -> None:
        """The leading replica's kube-scheduler and extender killed (its pod lost), started
        again ``f.duration_s`` later (a new pod); meanwhile the other replica takes over."""
        assert self.replicas is not None
        procs = self.processes
        down = [i for i in range(replicas.REPLICAS) if not procs.pids.get(replicas.scheduler(i))]
        if down:  # a replica is already down: one at a time, so one is always there
            self.at(t + 1.0, f"fault {f.kind}", again)
            return
        leader = self.replicas.leader()
        i = leader if leader is not None else 0
        with self.supervisor.lock:  # pid 0: down on purpose, not started again by it
            for role in (replicas.scheduler(i), replicas.extender(i)):
                if procs.pids.get(role):
                    procs.kill(role)

        def back() -> None:
            with self.supervisor.lock:
                for role in (replicas.extender(i), replicas.scheduler(i)):
                    procs.start(role)
            log(f"t={self.now():.1f} replica {i} started again")

        self.at(t + f.duration_s, f"replica {i} back", back)
        who = "the leader" if leader is not None else "no leader found"
        self._done(f, t, f"replica {i} ({who}) killed, back in {f.duration_s:.1f} s")

    def _network(self, f: Fault, t: float) -> None:
        assert self.replicas is not None
        proxy = self.replicas.proxy
        if f.kind == "net-delay":
            proxy.delay_s = f.amount
        else:
            proxy.drop_replies = True

        def heal() -> None:
            if f.kind == "net-delay":
                proxy.delay_s = 0.0
            else:
                proxy.drop_replies = False
            log(f"t={self.now():.1f} {f.kind} over ({proxy.dropped} replies dropped so far)")

        self.at(t + f.duration_s, f"{f.kind} over", heal)
        self._done(f, t, f"extenders <-> API server for {f.duration_s:.1f} s")

    def _set_health(self, node: str, index: int, health: str) -> str:
        """Device ``index`` of ``node``'s GpuNode reported ``health`` (read, changed, written
        back with its resourceVersion: the controllers write the same object's spec); its UUID,
        or "" when the node or the device is not there."""
        for _ in range(10):
            obj = self.kube.get(contract.KIND_GPU_NODE, node)
            if obj is None:
                return ""
            devices = (obj.get("status") or {}).get("devices") or []
            found = [d for d in devices if d.get("index") == index]
            if not found:
                return ""
            found[0]["health"] = health
            try:
                self.kube.request(
                    "PUT", path_of(contract.KIND_GPU_NODE, node) + "/status", obj, timeout=10
                )
            except ApiError as e:
                if e.status == 409:
                    continue
                raise
            return str(found[0].get("uuid", ""))
        raise OSError(f"{node}: the GpuNode kept changing")

    def _device_unhealthy(self, f: Fault, t: float) -> None:
        nodes = int(self.facts["TL_CLUSTER_NODES"])
        index = f.node % nodes
        if index in self._lost or self.api_down():
            self.at(t + 1.0, f"fault {f.kind}", self._fault(f))
            return
        name = f"{self.prefix}-{index}"
        uuid = self._set_health(name, f.target, Health.UNHEALTHY.value)

        def heal() -> None:
            if self._set_health(name, f.target, Health.HEALTHY.value):
                log(f"t={self.now():.1f} {name} device {f.target} Healthy again")

        what = f"{name} device {f.target} Healthy"
        self.at(t + f.duration_s, what, self._api(what, heal))
        self._done(f, t, f"{name} device {f.target} ({uuid or 'not there'}) Unhealthy")

    def _agent_silent(self, f: Fault, t: float) -> None:
        nodes = int(self.facts["TL_CLUSTER_NODES"])
        index = f.node % nodes
        if index in self._lost:  # a deleted node's agent is silent already
            self.at(t + 1.0, f"fault {f.kind}", self._fault(f))
            return
        name = f"{self.prefix}-{index}"
        self.heartbeats.silence(name)
        self._silent.add(index)

        def heal() -> None:
            self._silent.discard(index)
            if index not in self._lost:
                self.heartbeats.resume(name)
            log(f"t={self.now():.1f} {name}'s agent beats again")

        self.at(t + f.duration_s, f"{name} agent back", heal)
        self._done(f, t, f"{name}'s agent heartbeat stopped for {f.duration_s:.0f} s")

    def _resume_etcd(self) -> None:
        self.processes.resume("etcd")
        self._paused = False
        log(f"t={self.now():.1f} etcd continued")

    def _done(self, f: Fault, t: float, what: str) -> None:
        self.report.faults[f.kind] = self.report.faults.get(f.kind, 0) + 1
        self.report.faults_done.append(f"t={t:.1f} {f.kind}: {what}")
        log(f"t={t:.1f} FAULT {f.kind}: {what}")

    def _node_delete(self, f: Fault, t: float) -> None:
        nodes = int(self.facts["TL_CLUSTER_NODES"])
        # The planned node, or the next one still here (a node already lost is not lost twice).
        index = next(
            (i % nodes for i in range(f.node, f.node + nodes) if i % nodes not in self._lost), -1
        )
        if index < 0 or self.api_down():
            self.at(t + 1.0, f"fault {f.kind}", self._fault(f))
            return
        name = f"{self.prefix}-{index}"
        try:
            on_it = [p for p in self.kube.list("Pod") if p["spec"].get("nodeName") == name]
            self.observer.lost_nodes.add(name)
            self.heartbeats.silence(name)
            self.kube.delete(contract.KIND_GPU_NODE, name)
            self.kube.delete("Node", name)
        except (ApiError, OSError) as e:
            log(f"t={t:.1f} node-delete of {name} failed ({e}); again in 1 s")
            self.at(t + 1.0, f"fault {f.kind}", self._fault(f))
            return
        self._lost[index] = t + f.duration_s
        self.at(t + f.duration_s, f"node {name} back", self._api(f"{name} back", self._back(index)))
        self._done(f, t, f"node {name} deleted with {len(on_it)} pod(s) on it")

    def _back(self, index: int) -> Callable[[], None]:
        def make() -> None:
            name = f"{self.prefix}-{index}"
            done = subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "hack" / "cluster-nodes.py"),
                    "--server",
                    self.facts["TL_CLUSTER_SERVER"],
                    "--token",
                    self.facts["TL_CLUSTER_TOKEN"],
                    "--ca",
                    self.facts["TL_CLUSTER_CA"],
                    "--count",
                    "1",
                    "--start",
                    str(index),
                    "--prefix",
                    self.prefix,
                    "--gpus",
                    self.facts["TL_CLUSTER_GPUS_PER_NODE"],
                    "--gpu-type",
                    self.facts["TL_CLUSTER_GPU_TYPE"],
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if done.returncode != 0:
                raise OSError(f"cluster-nodes.py: {done.stderr[-500:]}")
            self._lost.pop(index, None)
            self.observer.lost_nodes.discard(name)
            if index not in self._silent:
                self.heartbeats.resume(name)
            log(f"t={self.now():.1f} node {name} made again")

        return make

    # --- observing ---
    def observe(self) -> None:
        t = self.now()
        processes = {
            f"{role}#{self.processes.generation[role]}": self.processes.pids[role]
            for role in SAMPLED
        }
        obs = self.observer.observe(t, processes, full_disks=frozenset(self._full))
        if obs is None:
            return
        self.report.observations += 1
        for name, s in obs.processes.items():
            self._samples.setdefault(name, []).append((t, s))
        self._phases(obs)
        self._prewarm(obs)
        for c in self.checkers:
            for v in c.observe(obs):
                self._violation(v)

    def _violation(self, v: Violation) -> None:
        self.report.violations.append(str(v))
        log(f"VIOLATION {v}")

    def _prewarm(self, obs: Observation) -> None:
        """The real node's prewarm items, as its agent last reported them."""
        if self.real is None:
            return
        for gpn in obs.gpu_nodes:
            if (gpn.get("metadata") or {}).get("name") != self.real.name:
                continue
            for item in parse_items((gpn.get("status") or {}).get("prewarm")):
                if item.kind == "checkpoint":
                    key, now = f"{item.lease} {item.name}", f"{item.state}: {item.reason}"
                    if self.report.prewarm.get(key) != now:
                        log(f"t={obs.t:.1f} prewarm {key} on {self.real.name}: {now}")
                        self.report.prewarm_no_space += NO_SPACE in item.reason
                    self.report.prewarm[key] = now

    def _phases(self, obs: Observation) -> None:
        """Reclaims and lends, from the leases' status: a reclaim is counted by the lease's
        ``reclaims`` counter and timed by its ``lastReclaimSeconds`` (Reclaiming to Steady; one
        without borrowers takes a fraction of a second, between two observations)."""
        for obj in obs.leases:
            try:
                lease = parse_gpu_lease(obj)
            except Exception:
                continue
            key, status = lease.key, lease.status
            before = self._reclaims.setdefault(key, status.reclaims)
            if status.reclaims > before:
                self._reclaims[key] = status.reclaims
                took = status.last_reclaim_s
                self.report.reclaims += status.reclaims - before
                if took is not None:
                    self.report.reclaim_s.append(took)
                log(f"t={obs.t:.1f} reclaim of {key} done in {took} s")
            groups = len(status.groups)
            if groups > self._groups.get(key, 0):
                self.report.lends += 1  # more groups lent than the last observation saw
            self._groups[key] = groups

    # --- the run ---
    def run(self) -> Report:
        for line in self.plan.describe():
            log(line)
        server = urllib.parse.urlsplit(self.facts["TL_CLUSTER_SERVER"])
        with replicas.take_over(
            self.processes, self.cluster.dir, (server.hostname or "127.0.0.1", server.port or 443)
        ) as self.replicas:
            log(f"two replicas; the extenders' fault proxy on :{self.replicas.proxy.port}")
            # Every process is started again when it exits on its own (kube-scheduler and
            # kube-controller-manager exit when they lose their leader lease, as through a
            # paused etcd), as the kubelet restarts a pod's container; each exit is reported.
            roles = tuple(self.processes.pids)
            with Supervisor(self.processes, roles, on_restart=self._exited) as self.supervisor:
                return self._run()

    def _exited(self, role: str, dead: Path) -> None:
        """A process that exited with no fault killing it. Upstream's may (kube-scheduler and
        kube-controller-manager end when they lose their lease); tidelease's must not (its
        controllers and extenders go back to waiting when they lose theirs): a violation."""
        t, last = self.now(), tail_lines(dead, 1)
        self.report.exits.append(f"t={t:.1f} {role} exited on its own, started again: {last}")
        log(f"t={t:.1f} {role} exited on its own, started again: {last}")
        if role in TIDELEASE_ROLES:
            self._violation(Violation("process-exit", t, role, f"exited on its own: {last}"))

    def _run(self) -> Report:
        self.heartbeats.start()
        self.setup()
        self.observer.start()
        if self.peer is not None:  # the run starts on a whole minute: the real job's schedule
            wall = time.time()
            time.sleep(60.0 - wall % 60.0)
            self._t0 = time.monotonic()
            self._daily(wall + 60.0 - wall % 60.0)
        else:
            self._t0 = time.monotonic()
        self.schedule()
        next_obs = 0.0
        try:
            while self.now() < self.plan.duration_s:
                while self._events and self._events[0][0] <= self.now():
                    _, _, what, action = heapq.heappop(self._events)
                    try:
                        action()
                    except Exception as e:  # the harness's own failure: reported, run goes on
                        self.report.errors.append(f"t={self.now():.1f} {what}: {e!r}")
                        log(f"t={self.now():.1f} ERROR in {what}: {e!r}")
                if self.now() >= next_obs:
                    next_obs = self.now() + 1.0
                    if not self.api_down():
                        self.observe()
                wake = min(next_obs, self._events[0][0] if self._events else next_obs)
                time.sleep(max(0.01, min(0.5, wake - self.now())))
        finally:
            if self._paused:
                self._resume_etcd()
        for c in self.checkers:
            for v in c.finish():
                self._violation(v)
        self.report.observations_failed = self.observer.failed
        self.report.reclaims_judged = sum(
            c.judged for c in self.checkers if isinstance(c, ReclaimEnds)
        )
        self.report.deletions = self.observer.deletions_seen
        for name, samples in sorted(self._samples.items()):
            span = samples[-1][0] - samples[0][0]
            self.report.processes[name] = {
                "samples": float(len(samples)),
                "span_s": round(span, 1),
                "rss_mib_last": round(samples[-1][1].rss_bytes / 2**20, 1),
                "rss_mib_per_h": round(
                    slope_per_hour([(t, s.rss_bytes) for t, s in samples]) / 2**20, 1
                ),
                "fds_last": float(samples[-1][1].open_fds),
                "fds_per_h": round(slope_per_hour([(t, s.open_fds) for t, s in samples]), 1),
            }
        return self.report

    def close(self) -> None:
        """Stop the processes the faults restarted (before the cluster goes down)."""
        if self._paused:
            self._resume_etcd()
        self.observer.stop()
        self.heartbeats.stop()
        try:
            self._stack.close()  # the cluster goes down next: a failure here only says so
        except Exception as e:
            log(f"undoing the setup failed (the cluster goes down anyway): {e!r}")
        self.processes.stop_restarted()


def tail_lines(path: Path, n: int, width: int = 240) -> str:
    """The last ``n`` non-empty lines of a log, each cut to ``width`` characters."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    lines = [line[:width] for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:])


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(report.as_json(), indent=2))
