"""The soak run's invariants: checkers fed a history of observations of the cluster. Pure.

An :class:`Observation` is what the harness saw at time ``t`` (seconds, any origin): the API
objects as the API server holds them (pods, ``GpuNode``s, ``GpuAllocation`` ledgers,
``GpuLease``s, Nodes), the pod deletions the pods' watch reported since the previous
observation, and samples of the components' processes. Each checker's
``observe(obs)`` returns the violations that observation shows, keeping what it needs between
observations (when a difference started, when a reclaim began); ``finish()`` returns what only
the whole run shows (a leak trend). No checker reads a clock, a file or the network: the times
are the observations'.

Each violation is reported once per episode (a condition that lasts is not reported again until
it has ended and comes back). The rules, and where they approximate:

* :class:`NoDoubleHold` — no GPU is held by two bound, unfinished pods at once (by UUID, from
  the pods' ``tidelease.io/devices``), nor listed twice in the ledgers.
* :class:`LedgerMatchesPods` — each node's ledger holds exactly the devices of the pods bound
  there, once a difference has lasted ``settle_s`` (bind writes the ledger before the pod, the
  reaper frees a gone pod's entry later: pick the extender's reserve TTL plus its reap interval).
* :class:`ReclaimEnds` — a lease that enters ``Reclaiming`` leaves it within grace + ``bound_s``
  or is ``Degraded`` with a reason by then; when it ends, each returning replica holds its own
  lent group, and any other device it holds is a standby stand-in of a GPU type and tier of a
  lent device it does not hold (a better tier is no broken promise).
* :class:`NoticeBeforeEviction` — no borrower on a lent device goes without its reclaim notice,
  unless its node was lost or kube-scheduler preempted it for a job that is not taking its
  devices back.
* :class:`PendingWhileFree` — no GPU pod stays Pending beyond ``bound_s`` while a Ready node it
  may run on has enough free plain devices for it (conservative: see the class).
* :class:`QueuedReleased` — the shared queues release an interactive pod, and a pod they hold
  alone while it has room, within ``bound_s``.
* :class:`GangWhole` — no borrower gang has some of its members holding devices and not the
  others for ``bound_s`` (placed whole, evicted whole).
* :class:`PrewarmRecovers` — a node's cache takes what prewarm asks once its disk has room
  again: no prewarm item fails for want of space ``settle_s`` after the node's cache disk was
  last full (the runner's disk-full fault, :attr:`Observation.full_disks`), and none stays
  Pending beyond ``bound_s`` after it was due.
* :class:`LeakTrend` — no process's RSS or open fds grow faster than a threshold per hour over
  the run (least-squares slope).

What the checkers cover is the device-plugin path (devices annotated on the pod at bind); pods
placed through DRA claims carry no ``tidelease.io/devices`` and are not judged by the first two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from common import contract
from common.errors import InvalidInput
from common.gangs import gang_of
from common.model import Allocation, Device, GpuUuid, JobKey, NodeName, Priority
from common.objects import object_key, parse_gpu_allocation, parse_gpu_node
from common.podrequest import controller_of, parse_pod
from common.prewarmwire import ItemStatus, parse_directives, parse_items
from common.tenancy import belongs, pod_owner
from extender.queues.fitting import constraints, eligible, node_facts
from extender.rightofreturn.lease import GpuLease, parse_gpu_lease
from extender.rightofreturn.replicas import names_replicas

Obj = Mapping[str, Any]
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class Violation:
    checker: str
    t: float
    obj: str  # the object it is about: "namespace/name", "/node", a UUID, a process
    message: str

    def __str__(self) -> str:
        return f"[{self.checker}] t={self.t:.1f} {self.obj}: {self.message}"


@dataclass(frozen=True, slots=True)
class Deletion:
    """A pod the pods' watch saw deleted (evicted or deleted) since the previous observation."""

    pod: Obj  # its last state, as the DELETED event carried it
    noticed: bool  # it carried a reclaim notice (tidelease.io/reclaim-notice)
    node_gone: bool = False  # its node was lost (deleted, or NotReady) when it went

    @classmethod
    def of(cls, pod: Obj, *, node_gone: bool = False) -> Deletion:
        """The deletion of ``pod``, noticed when its last state carries the notice."""
        return cls(pod, contract.ANN_RECLAIM_NOTICE in _annotations(pod), node_gone)


@dataclass(frozen=True, slots=True)
class ProcessSample:
    rss_bytes: int
    open_fds: int


@dataclass(frozen=True, eq=False)
class Observation:
    t: float
    pods: Sequence[Obj] = ()
    gpu_nodes: Sequence[Obj] = ()
    ledgers: Sequence[Obj] = ()  # GpuAllocations
    leases: Sequence[Obj] = ()  # GpuLeases
    nodes: Sequence[Obj] = ()
    deletions: Sequence[Deletion] = ()
    processes: Mapping[str, ProcessSample] = field(default_factory=dict)
    heartbeats: Mapping[str, float] = field(default_factory=dict)  # node -> agent's last renewal
    wall: float = 0.0  # when it was made, epoch seconds (heartbeats are judged against it)
    # GpuLease states a watch saw since the previous observation, oldest first (a reclaim of a
    # fraction of a second begins and ends between two lists)
    lease_history: Sequence[Obj] = ()
    # nodes whose cache disk another writer has filled now (the soak's disk-full fault)
    full_disks: frozenset[str] = frozenset()

    @cached_property
    def devices(self) -> dict[GpuUuid, Device]:
        """Every device of every valid GpuNode, by UUID."""
        out: dict[GpuUuid, Device] = {}
        for obj in self.gpu_nodes:
            try:
                out.update((d.uuid, d) for d in parse_gpu_node(obj).devices)
            except InvalidInput:
                continue
        return out

    @cached_property
    def allocations(self) -> dict[NodeName, tuple[Allocation, ...]]:
        """Every valid ledger's entries, by node."""
        out: dict[NodeName, tuple[Allocation, ...]] = {}
        for obj in self.ledgers:
            try:
                node, allocations = parse_gpu_allocation(obj)
            except InvalidInput:
                continue
            out[node] = allocations
        return out

    @cached_property
    def gpu_leases(self) -> tuple[GpuLease, ...]:
        out = []
        for obj in self.leases:
            try:
                out.append(parse_gpu_lease(obj))
            except InvalidInput:
                continue
        return tuple(out)

    @cached_property
    def lease_states(self) -> tuple[GpuLease, ...]:
        """:attr:`lease_history` then :attr:`leases`, parsed (the invalid left out)."""
        out = []
        for obj in (*self.lease_history, *self.leases):
            try:
                out.append(parse_gpu_lease(obj))
            except InvalidInput:
                continue
        return tuple(out)

    def silent(self, fresh_s: float) -> set[str]:
        """The nodes whose agent renewed its heartbeat more than ``fresh_s`` ago (a node with
        none is not judged: the extender's rule)."""
        return {n for n, at in self.heartbeats.items() if self.wall - at > fresh_s}

    @cached_property
    def holding(self) -> tuple[Obj, ...]:
        """The pods that hold devices: bound, unfinished, with devices annotated."""
        return tuple(p for p in self.pods if holds(p))


def _annotations(pod: Obj) -> Mapping[str, str]:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations if isinstance(annotations, dict) else {}


def pod_devices(pod: Obj) -> tuple[GpuUuid, ...]:
    """The devices bind recorded on the pod."""
    text = _annotations(pod).get(contract.ANN_DEVICES) or ""
    return tuple(GpuUuid(u) for u in text.split(",") if u)


def _node_of(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def holds(pod: Obj) -> bool:
    """Whether the pod holds its annotated devices: bound and not finished (a pod being deleted
    still runs until it is gone)."""
    return bool(_node_of(pod)) and _phase(pod) not in TERMINAL_PHASES and bool(pod_devices(pod))


def _ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in conditions
    )


class _Lasting:
    """Conditions by key, each with the time it was first seen in an unbroken run of
    observations; each reported once, when it has lasted ``window_s``."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._since: dict[str, float] = {}
        self._told: set[str] = set()

    def update(self, t: float, now: Mapping[str, str]) -> list[tuple[str, str, float]]:
        """(key, message, since) of each condition now reaching its window."""
        for key in self._since.keys() - now.keys():
            del self._since[key]
            self._told.discard(key)
        out = []
        for key, message in now.items():
            since = self._since.setdefault(key, t)
            if t - since >= self.window_s and key not in self._told:
                self._told.add(key)
                out.append((key, message, since))
        return out


class Checker:
    """A checker: ``observe`` each observation in time order, then ``finish`` once."""

    name = "checker"

    def observe(self, obs: Observation) -> list[Violation]:
        raise NotImplementedError

    def finish(self) -> list[Violation]:
        return []

    def _v(self, t: float, obj: str, message: str) -> Violation:
        return Violation(self.name, t, obj, message)


def check_history(checkers: Sequence[Checker], history: Iterable[Observation]) -> list[Violation]:
    """Every violation the checkers find over the history (observations in time order)."""
    out: list[Violation] = []
    for obs in history:
        for c in checkers:
            out += c.observe(obs)
    for c in checkers:
        out += c.finish()
    return out


class NoDoubleHold(Checker):
    """(a) No device held by two pods at once: two bound, unfinished pods annotated with one
    UUID, or one UUID in two ledger entries. At once: no window."""

    name = "no-double-hold"

    def __init__(self) -> None:
        self._lasting = _Lasting(0.0)

    def observe(self, obs: Observation) -> list[Violation]:
        by_pod: dict[GpuUuid, list[str]] = {}
        for pod in obs.holding:
            for u in pod_devices(pod):
                by_pod.setdefault(u, []).append(object_key(pod))
        by_entry: dict[GpuUuid, list[str]] = {}
        for node, allocations in obs.allocations.items():
            for a in allocations:
                for u in a.devices:
                    by_entry.setdefault(u, []).append(f"{a.holder.key} on {node}")
        now = {
            f"pods:{u}": f"held by pods {', '.join(sorted(who))}"
            for u, who in by_pod.items()
            if len(who) > 1
        }
        now.update(
            (f"ledger:{u}", f"in the ledger entries of {', '.join(sorted(who))}")
            for u, who in by_entry.items()
            if len(who) > 1
        )
        return [
            self._v(obs.t, key.partition(":")[2], msg)
            for key, msg, _ in self._lasting.update(obs.t, now)
        ]


class LedgerMatchesPods(Checker):
    """(b) Each node's ledger holds exactly the devices of the pods bound there. A difference
    counts once it has lasted ``settle_s``: an entry missing for a bound pod (a skipped ledger
    write), an entry whose pod is gone, finished, unbound or bound elsewhere (stale), or one
    whose devices are not the pod's."""

    name = "ledger-matches-pods"

    def __init__(self, settle_s: float) -> None:
        self._lasting = _Lasting(settle_s)

    def observe(self, obs: Observation) -> list[Violation]:
        pods = {_uid(p): p for p in obs.pods}
        want: dict[tuple[str, str], frozenset[GpuUuid]] = {
            (_node_of(p), _uid(p)): frozenset(pod_devices(p)) for p in obs.holding
        }
        have: dict[tuple[str, str], tuple[Allocation, frozenset[GpuUuid]]] = {
            (node, a.holder.pod_uid): (a, frozenset(a.devices))
            for node, allocations in obs.allocations.items()
            for a in allocations
        }
        now: dict[str, str] = {}
        for (node, uid), devices in want.items():
            entry = have.get((node, uid))
            key = f"{node}/{uid}"
            if entry is None:
                who = object_key(pods[uid])
                now[key] = f"pod {who} holds {_list(devices)} but the ledger has no entry for it"
            elif entry[1] != devices:
                now[key] = (
                    f"ledger gives {entry[0].holder.key} {_list(entry[1])}, "
                    f"the pod holds {_list(devices)}"
                )
        for (node, uid), (a, devices) in have.items():
            if (node, uid) in want:
                continue
            found = pods.get(uid)
            if found is None:
                why = "is gone"
            elif _phase(found) in TERMINAL_PHASES:
                why = f"is {_phase(found)}"
            elif not _node_of(found):
                why = "is not bound"
            elif _node_of(found) != node:
                why = f"is on {_node_of(found)}"
            else:
                why = "holds no devices"
            now[f"{node}/{uid}"] = f"stale entry: {a.holder.key} ({_list(devices)}) {why}"
        return [
            self._v(obs.t, f"/{key.partition('/')[0]}", f"{msg} (since t={since:.1f})")
            for key, msg, since in self._lasting.update(obs.t, now)
        ]


def _list(devices: Iterable[str]) -> str:
    return ",".join(sorted(devices)) or "nothing"


@dataclass
class _Open:
    """A reclaim under way, as the checker saw it begin."""

    deadline: float
    lease: GpuLease  # its latest Reclaiming state
    bound_before: frozenset[str]  # the workload's pods that held devices when it began
    late: bool = False  # past its deadline (reported, or excused by Degraded)
    degraded: bool = False  # seen Degraded while it ran
    # each returning group: whether it could come back whole in every observation of the
    # reclaim (every device there and healthy, on a Ready node whose agent is heard)
    returnable: dict[str, bool] = field(default_factory=dict)


def _uint(version: str) -> int:
    try:
        return int(version)
    except ValueError:
        return -1


class ReclaimEnds(Checker):
    """(c) Every reclaim ends, and ends with each replica where it belongs.

    A lease seen ``Reclaiming`` must be seen out of it within grace + ``bound_s`` of the first
    observation that saw it there (``grace_s``: the notice in force, e.g. the extender's
    ``leasing_test_grace_s``; None: the lease's ``graceSeconds``), or ``Degraded`` with a reason
    by then (pick ``bound_s`` above the extender's ``reclaim_overdue_s``). Every state of a
    lease counts, the watched ones between two lists (:attr:`Observation.lease_history`) too,
    in resourceVersion order.

    When it ends, each returning pod (a StatefulSet's replicas named in ``reclaiming``; for
    other workloads the pods that did not hold devices when it began, any of them on any
    group) holds its own lent group's devices. Where its group could come back whole
    throughout the reclaim (every device there and healthy, on a Ready node whose agent renewed
    its heartbeat within ``fresh_s``, held by no high-priority pod) and the lease was never
    Degraded, nothing else: that is
    right of return. A node whose agent was silent counts as silent for ``settle_s`` more after
    the last observation that saw it so: the extender offers its GPUs again only at its next
    liveness sweep (every min(5 s, agent_timeout_s / 4)), not at the renewal itself, and a
    reclaim that starts in between places the replica elsewhere. Otherwise it may also hold
    stand-ins: a standby device, not tagged for
    another job, matched with a lent device of its group that it does not hold, of the same GPU
    type and at least its tier (a better tier breaks no promise). Never another replica's or
    another job's lent device. ``untagged_stand_ins``: accept free untagged devices as stand-ins
    too (placement's documented "then other free devices" step, docs/leasing.md), where the
    issue's rule (standby only) is too strict for the run."""

    name = "reclaim-ends"

    def __init__(
        self,
        bound_s: float,
        *,
        grace_s: float | None = None,
        untagged_stand_ins: bool = False,
        fresh_s: float = float("inf"),
        settle_s: float = 0.0,
    ) -> None:
        self.bound_s, self.grace_s, self.untagged_stand_ins = bound_s, grace_s, untagged_stand_ins
        self.fresh_s, self.settle_s = fresh_s, settle_s
        self._silent_at: dict[str, float] = {}  # node -> the last observation it was silent in
        self._open: dict[str, _Open] = {}
        self._version: dict[str, int] = {}  # lease -> the newest resourceVersion judged
        self.judged = 0  # reclaims seen to end, their placement judged
        self._known: dict[GpuUuid, Device] = {}  # every device seen: type and tier of gone ones

    def observe(self, obs: Observation) -> list[Violation]:
        self._known.update(obs.devices)
        for node in obs.silent(self.fresh_s):
            self._silent_at[node] = obs.t
        out: list[Violation] = []
        listed = {lease.key: lease for lease in obs.gpu_leases}
        for key in self._open.keys() - listed.keys():
            del self._open[key]
        for lease in sorted(obs.lease_states, key=lambda x: _uint(x.resource_version)):
            version = _uint(lease.resource_version)
            if 0 <= version <= self._version.get(lease.key, -1):
                continue  # a state judged already (the list and the watch both carry it)
            self._version[lease.key] = max(version, self._version.get(lease.key, -1))
            out += self._state(lease, obs, listed)
        for key, r in self._open.items():
            if not r.late and obs.t > r.deadline:
                r.late = True
                if not r.lease.degraded:
                    out.append(
                        self._v(
                            obs.t,
                            key,
                            f"still Reclaiming {', '.join(r.lease.status.reclaiming)} past "
                            f"t={r.deadline:.1f} (grace + {self.bound_s:.0f} s) and not "
                            "Degraded with a reason",
                        )
                    )
        return out

    def _state(
        self, lease: GpuLease, obs: Observation, leases: Mapping[str, GpuLease]
    ) -> list[Violation]:
        key = lease.key
        r = self._open.get(key)
        if lease.status.phase == "Reclaiming":
            started = lease.status.reclaim_started
            if r is None or r.lease.status.reclaim_started != started:
                grace = lease.spec.grace_s if self.grace_s is None else self.grace_s
                before = frozenset(_uid(p) for p in _workload_pods(lease, obs.holding))
                r = self._open[key] = _Open(obs.t + grace + self.bound_s, lease, before)
            r.lease = lease
            r.degraded |= lease.degraded is not None
            groups = {g.replica: g.devices for g in lease.status.groups}
            for name in lease.status.reclaiming:
                whole = self._can_return(groups.get(name, ()), obs)
                r.returnable[name] = r.returnable.get(name, True) and whole
            return []
        if r is None:
            return []
        del self._open[key]
        self.judged += 1
        out = []
        if not r.late and obs.t > r.deadline:
            out.append(self._v(obs.t, key, f"reclaim ended past t={r.deadline:.1f}"))
        return out + self._placement(r, obs, leases)

    def _can_return(self, devices: Sequence[GpuUuid], obs: Observation) -> bool:
        ready = {str(n["metadata"]["name"]) for n in obs.nodes if _ready(n)}
        # observe() has recorded this observation's silent nodes (at obs.t) already
        silent = {n for n, at in self._silent_at.items() if obs.t - at <= self.settle_s}
        online = {  # devices a high-priority pod holds: no eviction frees them
            u
            for p in obs.holding
            if _annotations(p).get(contract.ANN_PRIORITY) == Priority.HIGH.value
            for u in pod_devices(p)
        }
        return bool(devices) and all(
            (d := obs.devices.get(u)) is not None
            and d.cls.healthy
            and d.node in ready
            and d.node not in silent
            and u not in online
            for u in devices
        )

    def _placement(
        self, r: _Open, obs: Observation, leases: Mapping[str, GpuLease]
    ) -> list[Violation]:
        lease = r.lease
        back = {
            g.replica: g.devices
            for g in lease.status.groups
            if g.replica in lease.status.reclaiming
        }
        lent_by = {
            u: f"{other.key} group {g.replica}"
            for other in (*(v for k, v in leases.items() if k != lease.key), lease)
            for g in other.status.groups
            for u in g.devices
        }
        per_replica = names_replicas(lease.spec.workload.kind)
        every = tuple(u for devices in back.values() for u in devices)
        out = []
        for pod in _workload_pods(lease, obs.holding):
            name = str((pod.get("metadata") or {}).get("name", ""))
            if per_replica and name not in back:
                continue
            if not per_replica and _uid(pod) in r.bound_before:
                continue
            own = back[name] if per_replica else every
            whole = not r.degraded and (
                r.returnable.get(name, False)
                if per_replica
                else bool(r.returnable) and all(r.returnable.values())
            )
            problems = self._misplaced(
                pod_devices(pod), own, lease.spec.owner, lent_by, obs, whole=whole
            )
            for problem in problems:
                out.append(self._v(obs.t, object_key(pod), f"back from {lease.key}: {problem}"))
        return out

    def _misplaced(
        self,
        held: Sequence[GpuUuid],
        own: Sequence[GpuUuid],
        owner: JobKey,
        lent_by: Mapping[GpuUuid, str],
        obs: Observation,
        *,
        whole: bool,
    ) -> list[str]:
        problems: list[str] = []
        stand_ins: list[Device] = []
        for u in held:
            if u in own:
                continue
            dev = obs.devices.get(u)
            if u in lent_by:
                problems.append(f"holds {u}, lent by {lent_by[u]}")
            elif dev is None:
                continue  # on a node gone: nothing left to judge
            elif dev.cls.owner not in (None, owner):
                problems.append(f"holds {u}, tagged for {dev.cls.owner}")
            elif whole:
                problems.append(
                    f"holds {u}, not its own, though its group could come back whole "
                    "throughout the reclaim"
                )
            elif dev.cls.standby or self.untagged_stand_ins:
                stand_ins.append(dev)
            else:
                problems.append(f"holds {u}, neither its own lent device nor a standby stand-in")
        missing = [self._known.get(u) for u in own if u not in held]
        return problems + _unmatched(stand_ins, missing)


def _workload_pods(lease: GpuLease, pods: Iterable[Obj]) -> list[Obj]:
    wl = lease.spec.workload
    return [
        p
        for p in pods
        if (p.get("metadata") or {}).get("namespace") == lease.namespace
        and belongs(controller_of(p.get("metadata") or {}), wl.kind, wl.name)
    ]


def _unmatched(stand_ins: Sequence[Device], lent: Sequence[Device | None]) -> list[str]:
    """Stand-ins that match no lent device left behind of their GPU type and at most their
    tier, each lent device used once. Per type, pairing both ascending by tier finds a
    matching if any exists; a lent device never seen (``None``) takes any one stand-in,
    unjudged."""
    out: list[str] = []
    unknown = sum(1 for d in lent if d is None)
    for gpu_type in sorted({d.gpu_type for d in stand_ins}):
        ins = sorted((d for d in stand_ins if d.gpu_type == gpu_type), key=lambda d: d.tier)
        outs = sorted(d.tier for d in lent if d is not None and d.gpu_type == gpu_type)
        for i, d in enumerate(ins):
            if i < len(outs):
                if d.tier < outs[i]:
                    out.append(f"stand-in {d.uuid} is {d.tier.name}, below the lent {outs[i].name}")
            elif unknown:
                unknown -= 1
            else:
                out.append(f"stand-in {d.uuid} ({gpu_type}) stands in for no lent device")
    return out


class NoticeBeforeEviction(Checker):
    """(d) No borrower evicted without its notice: a deleted pod that is not high priority,
    bound, holding a device lent (tagged with an owner, or in a lease's lent groups, in this
    observation or the previous) by a job other than its own, must have carried its reclaim
    notice; unless its node was lost, it had finished before (Succeeded or Failed at the
    previous observation: its last state may say Failed only because the kubelet ends deleted
    pods so), or, while none of those owners was reclaiming, kube-scheduler preempted it
    (condition ``DisruptionTarget``, reason ``PreemptionByScheduler``: a preemption by a higher
    pod priority is no reclaim) or it was a gang member evicted (``DisruptionTarget``) as the
    gang controller evicts the rest of a gang one of whose members went (no reclaim either; the
    soak's hour found one on another job's lent devices); and a gang member evicted within
    :data:`GANG_LOSS_S` of a mate lost with its node, whatever its lenders do (the gang broke
    for the node; the hour found two evicted so in the very second their lender began to
    reclaim). Deletions the harness makes itself
    (its faults, its clean-up) are not for this checker: leave them out of
    :attr:`Observation.deletions`."""

    name = "notice-before-eviction"

    def __init__(self) -> None:
        self._lent: dict[GpuUuid, JobKey] = {}
        self._reclaiming: set[JobKey] = set()
        self._finished: set[str] = set()  # pods finished at the previous observation
        self._lost: dict[str, float] = {}  # gang -> when a member of it was lost with its node

    def observe(self, obs: Observation) -> list[Violation]:
        lent: dict[GpuUuid, JobKey] = {
            u: d.cls.owner for u, d in obs.devices.items() if d.cls.owner and not d.cls.standby
        }
        for lease in obs.gpu_leases:
            lent.update((u, lease.spec.owner) for u in lease.status.lent)
        reclaiming = {x.spec.owner for x in obs.gpu_leases if x.status.phase == "Reclaiming"}
        before, was_reclaiming = {**lent, **self._lent}, reclaiming | self._reclaiming
        finished = self._finished
        self._lent, self._reclaiming = lent, reclaiming
        self._finished = {_uid(p) for p in obs.pods if _phase(p) in TERMINAL_PHASES}
        for gone in obs.deletions:
            gang = gang_of(gone.pod)
            if gang is not None and (gone.node_gone or _disrupted(gone.pod, "DeletionByPodGC")):
                self._lost[gang] = obs.t
        out = []
        for gone in obs.deletions:
            pod = gone.pod
            if gone.noticed or gone.node_gone or _uid(pod) in finished:
                continue
            if not _node_of(pod):
                continue
            if _annotations(pod).get(contract.ANN_PRIORITY) == Priority.HIGH.value:
                continue
            mine = pod_owner(pod)
            devices = [u for u in pod_devices(pod) if before.get(u) not in (None, mine)]
            owners = {before[u] for u in devices}
            if not owners:
                continue
            gang = gang_of(pod)
            if not owners & was_reclaiming and (
                _preempted(pod) or (gang is not None and _disrupted(pod))
            ):
                continue
            lost = self._lost.get(gang) if gang is not None else None
            if lost is not None and obs.t - lost <= GANG_LOSS_S and _disrupted(pod):
                continue
            out.append(
                self._v(
                    obs.t,
                    object_key(pod),
                    f"borrower of {_list(devices)} (lent by {', '.join(sorted(owners))}) "
                    "deleted without a reclaim notice",
                )
            )
        return out


# How soon after a gang member is lost with its node the rest of the gang is evicted (the gang
# controller acts within a second or two of the lost member's deletion).
GANG_LOSS_S = 60.0


def _preempted(pod: Obj) -> bool:
    return _disrupted(pod, "PreemptionByScheduler")


def _disrupted(pod: Obj, reason: str | None = None) -> bool:
    """Whether the pod carries ``DisruptionTarget`` (for ``reason``, if given)."""
    return any(
        isinstance(c, dict)
        and c.get("type") == "DisruptionTarget"
        and c.get("status", "True") == "True"
        and (reason is None or c.get("reason") == reason)
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class _Room:
    """What the pending checkers judge room by, from one observation: the Ready nodes, and per
    node its free plain devices (healthy, untagged, not standby, in no ledger and on no pod) on
    nodes whose agent renewed its heartbeat within ``fresh_s`` (or has none: the extender's
    rule), less the GPUs of unbound pods kube-scheduler has nominated for the node
    (``status.nominatedNodeName``): a gang member waiting at Permit for its mates holds its
    node's GPUs in kube-scheduler's cache without a ledger entry, and says where by its
    nomination; so does a preemptor waiting for its victims to go."""

    def __init__(self, obs: Observation, fresh_s: float, resource: str) -> None:
        self.nominated: dict[str, int] = {}  # node -> GPUs of unbound pods nominated for it
        for pod in obs.pods:
            node = _nominated(pod)
            if node and not _node_of(pod) and _phase(pod) == "Pending":
                self.nominated[node] = self.nominated.get(node, 0) + _gpus(pod, resource)
        taken = {u for p in obs.holding for u in pod_devices(p)}
        taken.update(u for a in obs.allocations.values() for e in a for u in e.devices)
        silent = obs.silent(fresh_s)
        self.free: dict[str, list[Device]] = {}
        for u, d in obs.devices.items():
            if d.node in silent:
                continue
            if d.cls.healthy and d.cls.owner is None and not d.cls.standby and u not in taken:
                self.free.setdefault(d.node, []).append(d)
        self.ready = [node_facts(n) for n in obs.nodes if _ready(n)]

    def for_pod(self, pod: Obj, resource: str) -> str:
        """A Ready node with room for this unbound GPU pod, "" for none (or a pod these
        checkers do not judge: being deleted, or with pod affinity or topology spread)."""
        spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
        if _phase(pod) != "Pending" or _node_of(pod) or meta.get("deletionTimestamp"):
            return ""
        affinity = spec.get("affinity") or {}
        if spec.get("topologySpreadConstraints"):
            return ""
        if affinity.get("podAffinity") or affinity.get("podAntiAffinity"):
            return ""
        try:
            req = parse_pod(pod, resource=resource)
        except InvalidInput:
            return ""
        if req.gpus <= 0:
            return ""
        c = constraints(spec)
        own = _nominated(pod)
        for node in self.ready:
            fit: dict[str, int] = {}
            for d in self.free.get(node.name, ()):
                if d.tier >= req.min_tier and req.gpu_type in (None, d.gpu_type):
                    fit[d.gpu_type] = fit.get(d.gpu_type, 0) + 1
            # Held by others' nominations, whatever their type and tier (conservative).
            held = self.nominated.get(node.name, 0) - (req.gpus if own == node.name else 0)
            if max(fit.values(), default=0) - held >= req.gpus and eligible(c, node):
                return node.name
        return ""


def _nominated(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("nominatedNodeName") or "")


def _gpus(pod: Obj, resource: str) -> int:
    try:
        return parse_pod(pod, resource=resource).gpus
    except InvalidInput:
        return 0


def _gates(pod: Obj) -> list[str]:
    return [
        str(g.get("name"))
        for g in (pod.get("spec") or {}).get("schedulingGates") or []
        if isinstance(g, dict)
    ]


class _Waiting(Checker):
    """A checker of pods that wait: each condition reported once it has lasted ``bound_s``;
    room judged for GPUs of ``resource`` on nodes whose agent was heard within ``fresh_s``."""

    def __init__(
        self,
        bound_s: float,
        *,
        resource: str = contract.DEFAULT_GPU_RESOURCE,
        fresh_s: float = float("inf"),
    ) -> None:
        self.resource = resource
        self.fresh_s = fresh_s
        self._lasting = _Lasting(bound_s)

    def _lasted(self, t: float, now: Mapping[str, str]) -> list[Violation]:
        return [
            self._v(t, key, f"{msg} (since t={since:.1f})")
            for key, msg, since in self._lasting.update(t, now)
        ]


class PendingWhileFree(_Waiting):
    """(e) No GPU pod Pending beyond ``bound_s`` while devices it may use are free.

    Conservative, to flag only what placement should certainly have done: the pod is unbound,
    ungated (``schedulingGates`` empty: the shared queues hold it otherwise, judged by
    :class:`QueuedReleased`), not being deleted, asks ``resource`` GPUs, and declares no pod
    affinity or topology spread; and some Node that is Ready and that its node selector,
    required node affinity and tolerations accept (:func:`extender.queues.fitting.eligible`)
    has at least that many free devices of one GPU type: healthy, untagged, not standby, in no
    ledger and on no pod, of its type (if it names one) and at least its tier, on a node whose
    agent renewed its heartbeat within ``fresh_s`` (or has none). Both must hold in every
    observation of ``bound_s``. Left out: a gang's members (each waits for the whole gang to
    fit: :class:`GangWhole` judges gangs), other resources (CPU, memory), tenancy refusals (a
    high-priority pod in a namespace not granted online jobs waits by design: keep the run's
    pods legitimate), and tagged devices a borrower could take."""

    name = "pending-while-free"

    def observe(self, obs: Observation) -> list[Violation]:
        room = _Room(obs, self.fresh_s, self.resource)
        now: dict[str, str] = {}
        for pod in obs.pods:
            if _gates(pod) or gang_of(pod) is not None:
                continue  # held by the queues; a gang's member waits for the gang (gang-whole)
            node = room.for_pod(pod, self.resource)
            if node:
                now[object_key(pod)] = f"Pending while {node} has enough free GPUs for it"
        return self._lasted(obs.t, now)


class QueuedReleased(_Waiting):
    """(f) The shared queues release what they must, within ``bound_s``: a pod held by the
    queues' scheduling gate alone (``tidelease.io/queue``) that is interactive (the first queue
    is released whatever the room, cornucopia 4.2), or that is the only pod the queues hold
    while a Ready node it may use has room for it (:class:`PendingWhileFree`'s room: nothing
    ahead of it in the queues keeps that room, extender.queues.admission.release). A pod
    released stops being judged here; :class:`PendingWhileFree` judges it from then on."""

    name = "queued-released"

    def observe(self, obs: Observation) -> list[Violation]:
        held = [
            p
            for p in obs.pods
            if _gates(p) == [contract.SCHEDULING_GATE]
            and not (p.get("metadata") or {}).get("deletionTimestamp")
        ]
        now: dict[str, str] = {}
        room: _Room | None = None
        for pod in held:
            if _annotations(pod).get(contract.ANN_JOB_CLASS) == "interactive":
                now[object_key(pod)] = "an interactive pod still held by the queues' gate"
            elif len(held) == 1:
                room = room or _Room(obs, self.fresh_s, self.resource)
                # for_pod judges an unbound pod as if ungated: the room it would have
                node = room.for_pod(pod, self.resource)
                if node:
                    now[object_key(pod)] = (
                        f"the only pod the queues hold, still gated while {node} has room for it"
                    )
        return self._lasted(obs.t, now)


# The soak's label on a gang member: how many members its gang has (the runner makes them all).
GANG_SIZE_LABEL = "soak.tidelease.test/gang-size"


def _gang_size(pod: Obj) -> int:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(GANG_SIZE_LABEL) if isinstance(labels, dict) else None
    return int(value) if isinstance(value, str) and value.isdigit() else 0


class GangWhole(Checker):
    """(g) A borrower gang runs whole or not at all: no gang of the Workload API
    (``spec.workloadRef``, its size on :data:`GANG_SIZE_LABEL`) has some of its members holding
    devices and not the others for ``bound_s``. A member holds devices when it is bound, not
    being deleted and not finished (:func:`holds`); one that is gone holds none. So this sees
    a gang placed in part (its members wait for each other at kube-scheduler's Permit, and
    tidelease keeps them off each other's devices), and a gang left in part after an eviction
    (a reclaim evicts a gang whole; the gang controller evicts the rest of one that
    kube-scheduler preempted, or whose member's node was deleted)."""

    name = "gang-whole"

    def __init__(self, bound_s: float) -> None:
        self._lasting = _Lasting(bound_s)
        self._sizes: dict[str, int] = {}  # gang -> its size, as its members said

    def observe(self, obs: Observation) -> list[Violation]:
        holding: dict[str, set[str]] = {}
        for pod in obs.pods:
            gang = gang_of(pod)
            size = _gang_size(pod)
            if gang is None or not size:
                continue
            self._sizes.setdefault(gang, size)
            if holds(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp"):
                holding.setdefault(gang, set()).add(object_key(pod))
        now = {
            gang: f"{len(members)} of its {self._sizes[gang]} members hold devices: "
            + ", ".join(sorted(members))
            for gang, members in holding.items()
            if 0 < len(members) < self._sizes[gang]
        }
        return [
            self._v(obs.t, key, f"{msg} (since t={since:.1f})")
            for key, msg, since in self._lasting.update(obs.t, now)
        ]


# The start of every "no space" error of the node's cache (nodeagent.cache.cachestore.NoSpace),
# as a prewarm item's reason quotes it.
NO_SPACE = "no space for "


class PrewarmRecovers(Checker):
    """(h) A node's cache recovers when its disk does. From each GpuNode's prewarm directives
    (``spec.prewarm``) and its agent's report on each item (``status.prewarm``): no item
    reports a failure for want of space (a failed attempt, or the item Failed, with the cache's
    :data:`NO_SPACE` error) ``settle_s`` or more after the node's cache disk was last full, or
    on a node whose disk was never full; and no item of a directive still there stays Pending
    beyond ``bound_s`` after it was due (the directive's ``notBefore``, or when the directive
    was first seen if that is later). So a cache that keeps failing after
    the disk has room again (a stale free-space figure, a partial pull never dropped) is seen,
    as is a fetch that hangs."""

    name = "prewarm-recovers"

    def __init__(self, bound_s: float, settle_s: float) -> None:
        self.bound_s, self.settle_s = bound_s, settle_s
        self._full_at: dict[str, float] = {}  # node -> the last observation its disk was full
        self._told: set[tuple[str, str, str, str]] = set()  # node, lease, item, reason: judged
        # node, lease, item, notBefore -> when (wall) the directive was first seen: an item is
        # due from its notBefore or from then, whichever is later
        self._seen: dict[tuple[str, str, str, float], float] = {}
        self._stuck: set[tuple[str, str, str, float]] = set()

    def observe(self, obs: Observation) -> list[Violation]:
        for node in obs.full_disks:
            self._full_at[node] = obs.t
        out: list[Violation] = []
        for gpn in obs.gpu_nodes:
            node = str((gpn.get("metadata") or {}).get("name", ""))
            directives = {
                (d.lease, name): d.not_before
                for d in parse_directives((gpn.get("spec") or {}).get("prewarm"))
                for name in (*d.images, *d.checkpoints)
            }
            for item in parse_items((gpn.get("status") or {}).get("prewarm")):
                out += self._judge(obs, node, item, directives.get((item.lease, item.name)))
        return out

    def _judge(
        self, obs: Observation, node: str, item: ItemStatus, not_before: float | None
    ) -> list[Violation]:
        what = f"{item.kind} {item.name} for lease {item.lease}"
        if NO_SPACE in item.reason:
            # Judged once, when first seen: a report that stays up (a Failed item) is about the
            # attempt that made it, not about the disk as it is later.
            key = (node, item.lease, item.name, item.reason)
            if key in self._told:
                return []
            self._told.add(key)
            full = self._full_at.get(node)
            if full is None or obs.t - full >= self.settle_s:
                since = "never full" if full is None else f"last full at t={full:.1f}"
                return [
                    self._v(
                        obs.t,
                        f"/{node}",
                        f"prewarm of {what} failed for want of space while the node's cache "
                        f"disk had room ({since}): {item.reason}",
                    )
                ]
        if item.state == "Pending" and not_before is not None and obs.wall:
            key_stuck = (node, item.lease, item.name, not_before)
            due = max(not_before, self._seen.setdefault(key_stuck, obs.wall))
            if obs.wall - due > self.bound_s and key_stuck not in self._stuck:
                self._stuck.add(key_stuck)
                return [
                    self._v(
                        obs.t,
                        f"/{node}",
                        f"prewarm of {what} still Pending {obs.wall - due:.0f} s after it was "
                        f"due ({item.reason or 'no reason'})",
                    )
                ]
        return []


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, value) points, per hour; 0 with under two times."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / spread * 3600.0


class LeakTrend(Checker):
    """(f) No leak trend: over the run, after ``warmup_s`` from each process's first sample,
    the least-squares slope of its RSS and of its open fds must not exceed the thresholds per
    hour. Judged at ``finish``, for processes sampled at least three times over ``min_span_s``
    (a slope over a few minutes says little: give the run's length less the warm-up)."""

    name = "leak-trend"

    def __init__(
        self,
        *,
        rss_bytes_per_hour: float,
        fds_per_hour: float,
        warmup_s: float = 0.0,
        min_span_s: float = 0.0,
    ) -> None:
        self.rss_bytes_per_hour, self.fds_per_hour = rss_bytes_per_hour, fds_per_hour
        self.warmup_s, self.min_span_s = warmup_s, min_span_s
        self._first: dict[str, float] = {}
        self._samples: dict[str, list[tuple[float, ProcessSample]]] = {}

    def observe(self, obs: Observation) -> list[Violation]:
        for process, sample in obs.processes.items():
            first = self._first.setdefault(process, obs.t)
            if obs.t - first >= self.warmup_s:
                self._samples.setdefault(process, []).append((obs.t, sample))
        return []

    def finish(self) -> list[Violation]:
        out = []
        for process, samples in sorted(self._samples.items()):
            end = samples[-1][0]
            if len(samples) < 3 or end - samples[0][0] < self.min_span_s:
                continue
            rss = slope_per_hour([(t, s.rss_bytes) for t, s in samples])
            fds = slope_per_hour([(t, s.open_fds) for t, s in samples])
            if rss > self.rss_bytes_per_hour:
                out.append(
                    self._v(
                        end,
                        process,
                        f"RSS grows {rss / 2**20:.1f} MiB/h "
                        f"(limit {self.rss_bytes_per_hour / 2**20:.1f})",
                    )
                )
            if fds > self.fds_per_hour:
                out.append(
                    self._v(end, process, f"open fds grow {fds:.1f}/h (limit {self.fds_per_hour})")
                )
        return out
