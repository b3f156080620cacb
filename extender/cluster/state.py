"""The extender's in-memory view of the cluster, fed by watches of the API server. Pure.

Answers scheduling requests without an API call. Per node it keeps the inventory (``GpuNode``)
and the allocation ledger (``GpuAllocation``), and derives the free devices as counts per
:class:`~common.model.DeviceClass`.

Nodes in the same state give the same answers, so each state is summarised by small integer keys
(interned): ``decision_key`` (free devices and who holds the rest: all that filter and preempt
depend on), ``score_key`` (free devices and cache contents: all that prioritize depends on) and
``free_key`` (free devices alone: all that a placement plan depends on). A node that publishes
its GPU topology has a fourth, ``group_key`` (the topology and which devices are free: all that
the choice of concrete devices depends on, common.topology.choose); 0 for a node without, whose
answers depend on none of it. A request over 1,250
nodes then decides once per distinct state, not once per node, and a plan, once made for a
request shape, serves every later request of that shape whatever else differs (pod priority,
checkpoint, the state of the node's other holders).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from common import contract
from common.deviceattributes import reclaiming
from common.errors import InvalidInput
from common.heartbeat import heartbeat
from common.keptmarks import NO_MARK, KeptMark, decode
from common.model import (
    Allocation,
    Device,
    DeviceClass,
    GpuUuid,
    JobKey,
    NodeCache,
    NodeInventory,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from common.objects import object_key, parse_gpu_allocation, parse_gpu_node, resource_version
from common.tenancy import belongs, granted, online_refusal
from common.topology import NodeTopology
from extender.rightofreturn.lease import reclaim_of, workload_of
from extender.rightofreturn.replicas import names_replicas

log = logging.getLogger(__name__)

Signature = tuple[int, tuple[tuple[DeviceClass, int], ...]]
Freeable = frozenset[tuple[DeviceClass, int]]  # device classes, with counts, evictions would free
# Distinct request shapes remembered, each with one answer per node state; past this the one
# asked least recently is dropped, at insert. Measured at 1,250 nodes: about 13 KB a shape, so
# some 40 MB at the bound; a cluster's jobs ask far fewer distinct questions than that.
MEMO_SHAPES = 3_000


class ShapeMemo(OrderedDict[Hashable, dict[Any, Any]]):
    """Answers by request shape, at most ``limit`` shapes, least recently used out first: a
    stream of distinct pods cannot grow it, whether or not any node changes meanwhile."""

    def __init__(self, limit: int = MEMO_SHAPES) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: Hashable, value: dict[Any, Any]) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.limit:
            self.popitem(last=False)

    def setdefault(self, key: Hashable, default: dict[Any, Any] | None = None) -> dict[Any, Any]:
        found = self.get(key)
        if found is not None:
            self.move_to_end(key)
            return found
        value = {} if default is None else default
        self[key] = value
        return value


KEYS_PER_STATE = 4  # decision_key, score_key, free_key, group_key (nodes with topology)
# What the node indexes of ClusterState hold for a node whose devices are not offered
# (no GpuNode, or its agent silent): no state key is negative.
NO_INVENTORY_KEY = -1
SILENT_KEY = -2


@dataclass(slots=True)
class NodeState:
    node: NodeName
    devices: tuple[Device, ...] = ()
    cache: NodeCache = field(default_factory=NodeCache)
    has_inventory: bool = False
    heartbeat: float | None = None  # last renewal of the node agent's Lease (epoch seconds)
    silent: bool = False  # the agent has not renewed its Lease within the timeout
    # Devices the GpuNode's tags mark ``reclaiming`` (DRA mode: the leasing controller's marks,
    # read back from the API server so that a restarted controller knows what stands).
    reclaiming: frozenset[GpuUuid] = frozenset()
    # Lent devices the Kueue check keeps for admitted workloads not placed yet (the GpuNode's
    # annotation, common/keptmarks.py): other borrowers do not get them. Not in ``free``'s
    # accounting: placement and binding bar them per request (KeptMark.barred).
    kept: KeptMark = NO_MARK
    # How its devices are connected (GpuNode status.topology); None: not published.
    topology: NodeTopology | None = None
    # The node's ledger as stored (what a compare-and-swap write starts from) ...
    ledger: dict[PodUid, Allocation] = field(default_factory=dict)
    ledger_version: str = ""
    # derived, refreshed by _refresh()
    # Devices held in memory for gang pods not yet bound (extender.scheduler.gangplacement):
    # not in the stored ledger, but taken for every other pod's placement all the same.
    reserved: dict[PodUid, Allocation] = field(default_factory=dict)
    # ... and its live part: allocations of pods not known to be gone, with the reservations of
    # pods the ledger does not hold yet. A deleted pod's devices are free for placement at
    # once; the reaper removes its entry from the stored ledger.
    allocations: dict[PodUid, Allocation] = field(default_factory=dict)
    free: Mapping[DeviceClass, int] = field(default_factory=dict)
    free_total: int = 0  # free healthy devices
    signature: Signature = (0, ())
    # classes of the devices each allocation holds on this node (unknown UUIDs left out)
    held_classes: dict[PodUid, tuple[DeviceClass, ...]] = field(default_factory=dict)
    # Pod priorities of the low-priority holders, ascending, and what evicting the first k of
    # them frees (freeable_by[k]): see freeable().
    low_priorities: tuple[int, ...] = ()
    freeable_by: tuple[Freeable, ...] = (frozenset(),)
    decision_key: int = 0
    score_key: int = 0
    free_key: int = 0
    group_key: int = 0  # 0: the node publishes no topology
    # The free devices (index and class), kept for nodes with topology only: group_key's part.
    free_devices: tuple[tuple[int, DeviceClass], ...] = ()

    def _refresh(self, gone: set[PodUid]) -> None:
        self.allocations = {u: a for u, a in self.ledger.items() if u not in gone}
        for u, a in self.reserved.items():
            self.allocations.setdefault(u, a)
        held: set[GpuUuid] = {u for a in self.allocations.values() for u in a.devices}
        by_uuid = {d.uuid: d.cls for d in self.devices}
        self.held_classes = {
            uid: tuple(by_uuid[u] for u in a.devices if u in by_uuid)
            for uid, a in self.allocations.items()
        }
        counts = Counter(d.cls for d in self.devices if d.uuid not in held)
        self.free = counts
        self.free_devices = (
            tuple((d.index, d.cls) for d in self.devices if d.uuid not in held)
            if self.topology is not None
            else ()
        )
        self.free_total = sum(n for cls, n in counts.items() if cls.healthy)
        self.signature = (
            len(self.devices),
            tuple(sorted(counts.items(), key=lambda kv: _class_key(kv[0]))),
        )
        low = sorted(
            (
                (a.holder.pod_priority, self.held_classes[uid])
                for uid, a in self.allocations.items()
                if a.holder.priority is Priority.LOW
            ),
            key=lambda pc: pc[0],
        )
        self.low_priorities = tuple(p for p, _ in low)
        freed: Counter[DeviceClass] = Counter()
        freeable_by = [frozenset(freed.items())]
        for _, classes in low:
            freed.update(classes)
            freeable_by.append(frozenset(freed.items()))
        self.freeable_by = tuple(freeable_by)

    def taken_for(self, uid: PodUid) -> list[GpuUuid]:
        """The devices other pods hold here (ledger and holds): what pod ``uid`` may not take."""
        return [u for a in self.allocations.values() if a.holder.pod_uid != uid for u in a.devices]

    def unavailable_to(self, req: PodRequest, now: float) -> list[GpuUuid]:
        """What ``req`` may not take here: the devices other pods hold, and the free ones kept
        for a Kueue workload of another owner (:meth:`KeptMark.barred`)."""
        taken = self.taken_for(req.uid)
        barred = self.kept.barred(req, now)
        return [*taken, *barred.difference(taken)] if barred else taken

    def barred_for(self, req: PodRequest, now: float) -> Counter[DeviceClass]:
        """The classes of the free devices here kept for another owner's Kueue workload."""
        barred = self.kept.barred(req, now)
        if not barred:
            return Counter()
        held = {u for a in self.allocations.values() for u in a.devices}
        return Counter(d.cls for d in self.devices if d.uuid in barred and d.uuid not in held)

    @property
    def offering(self) -> bool:
        """Whether this node's devices are offered at all."""
        return self.has_inventory and not self.silent

    def freeable(self, pod_priority: int) -> Freeable:
        """What a preemptor of this pod priority could free here by eviction: the devices of
        low-priority pods of a lower pod priority (:func:`extender.scheduler.victims.freeable`
        for a preemptor that holds no devices on this node)."""
        return self.freeable_by[bisect_left(self.low_priorities, pod_priority)]

    def decision_tuple(self) -> Hashable:
        holders = Counter(
            (a.holder.priority, a.holder.pod_priority, self.held_classes[uid])
            for uid, a in self.allocations.items()
        )
        return (self.signature, frozenset(holders.items()))

    def score_tuple(self) -> Hashable:
        return (self.signature, self.cache)


def _class_key(c: DeviceClass) -> tuple[str, int, bool, str, bool, str]:
    return (c.gpu_type, int(c.tier), c.healthy, c.owner or "", c.standby, c.replica or "")


class _Interner:
    """Small integer ids for hashable keys; forgets keys no node uses any more."""

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}
        self._next = 1

    def __call__(self, key: Hashable) -> int:
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = self._next
            self._next += 1
        return found

    def __len__(self) -> int:
        return len(self._ids)

    def keep_only(self, live: set[int]) -> None:
        self._ids = {k: i for k, i in self._ids.items() if i in live}


class ClusterState:
    """Node states by name. Single-threaded: used from the event loop only."""

    def __init__(self) -> None:
        self._nodes: dict[NodeName, NodeState] = {}
        self._keys = _Interner()
        # Answers keyed by (state key, request shape), kept across requests: the pods of one
        # job, and retries of one pod, ask the same question of nodes whose state is unchanged.
        # Keys of changed states are never reused, so an entry can only be unused, never wrong.
        # memo[request shape][state key] -> answer (a state key, or a tuple starting with one)
        self.memo = ShapeMemo()
        # Owners (job keys) whose GpuLease is reclaiming: their workloads' high-priority pods
        # are reclaim requests (IsReclaim of weflex Algorithm 1); a pod never declares one.
        self._reclaiming: dict[JobKey, _Reclaim] = {}
        # The same owners: the devices they lent are what borrowers may not take.
        self._reclaiming_owners: frozenset[JobKey] = frozenset()
        # every lease's owner and workload, whatever its phase (a returning replica may come
        # before this view sees its lease Reclaiming: with_reclaim)
        self._workloads: dict[JobKey, _Reclaim] = {}
        # The devices tagged with each owner's right of return (standby ones aside), by node:
        # what a returning pod looks up on every verb, kept as the GpuNodes change.
        self._lent: dict[JobKey, dict[NodeName, tuple[Device, ...]]] = {}
        # Namespaces an admin granted online jobs (label tidelease.io/online: common.tenancy).
        self.granted: set[str] = set()
        # Pods seen deleted (or finished) whose allocations are still in a stored ledger.
        self._gone: set[PodUid] = set()
        # Where each pod's allocations are: one node, unless a stale one is left on another
        # (a bind that failed half-way, then a bind elsewhere) until the reaper releases it.
        self._ledger_of: dict[PodUid, set[NodeName]] = {}
        # Gang pods' reservations: where, and until when (monotonic seconds).
        self._reserved: dict[PodUid, tuple[NodeName, float]] = {}
        # Each node's state keys by name, for the verbs' passes over every candidate node
        # (extender.scheduler.filtering, .scoring): a node whose devices are not offered has
        # NO_INVENTORY_KEY or SILENT_KEY; a node not known, none. ``score_keys`` holds the key
        # a pod of 2+ GPUs is scored by: (score_key, group_key) on a node with topology.
        self.decision_keys: dict[NodeName, int] = {}
        self.score_keys: dict[NodeName, int] = {}
        self.group_score_keys: dict[NodeName, Hashable] = {}
        # Nodes whose GpuNode keeps devices for Kueue workloads (set_kept): judged per pod.
        self.kept_nodes: set[NodeName] = set()

    @property
    def gone(self) -> set[PodUid]:
        return self._gone

    def pod_gone(self, uid: PodUid) -> None:
        """A pod was deleted or finished: its devices are free from now on."""
        self.unreserve(uid)
        nodes = self._ledger_of.get(uid)
        if not nodes or uid in self._gone:
            return
        self._gone.add(uid)
        for node in sorted(nodes):
            state = self._nodes.get(node)
            if state is not None:
                self._changed(state)

    def _changed(self, state: NodeState) -> None:
        state._refresh(self._gone)
        state.decision_key = self._keys(("decision", state.decision_tuple()))
        state.score_key = self._keys(("score", state.score_tuple()))
        state.free_key = self._keys(("free", state.signature))
        state.group_key = (
            0
            if state.topology is None
            else self._keys(("group", state.topology, state.free_devices))
        )
        if len(self._keys) > 2 * KEYS_PER_STATE * len(self._nodes) + 64:
            live = {
                k
                for s in self._nodes.values()
                for k in (s.decision_key, s.score_key, s.free_key, s.group_key)
            }
            self._keys.keep_only(live)
            self.memo.clear()
        self._index(state)

    def _index(self, state: NodeState) -> None:
        node = state.node
        if not state.has_inventory or state.silent:
            off = NO_INVENTORY_KEY if not state.has_inventory else SILENT_KEY
            self.decision_keys[node] = self.score_keys[node] = off
            self.group_score_keys[node] = off
            return
        self.decision_keys[node] = state.decision_key
        self.score_keys[node] = state.score_key
        self.group_score_keys[node] = (
            (state.score_key, state.group_key) if state.group_key else state.score_key
        )

    def _forget(self, node: NodeName) -> None:
        del self._nodes[node]
        for index in (self.decision_keys, self.score_keys, self.group_score_keys):
            index.pop(node, None)
        self.kept_nodes.discard(node)

    def set_kept(self, node: NodeName, mark: KeptMark) -> None:
        """The devices the node's GpuNode keeps for Kueue workloads (common/keptmarks.py)."""
        self._node(node).kept = mark
        if mark.devices:
            self.kept_nodes.add(node)
        else:
            self.kept_nodes.discard(node)

    def holds_on(self, uid: PodUid) -> set[NodeName]:
        """The nodes where pod ``uid`` may hold devices (in a stored ledger, or reserved): a
        superset of those where it does."""
        nodes = set(self._ledger_of.get(uid, ()))
        reserved = self._reserved.get(uid)
        if reserved is not None:
            nodes.add(reserved[0])
        return nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[NodeState]:
        return iter(self._nodes.values())

    def get(self, node: str) -> NodeState | None:
        return self._nodes.get(NodeName(node))

    @property
    def nodes(self) -> Mapping[NodeName, NodeState]:
        return self._nodes

    def _node(self, node: NodeName) -> NodeState:
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = NodeState(node)
        return state

    # --- inventory ---
    def set_inventory(self, inv: NodeInventory) -> None:
        state = self._node(inv.node)
        state.devices, state.cache, state.has_inventory = inv.devices, inv.cache, True
        state.topology = inv.topology
        self._index_lent(inv.node, inv.devices)
        self._changed(state)

    def _index_lent(self, node: NodeName, devices: Iterable[Device]) -> None:
        for owner in [o for o, by_node in self._lent.items() if node in by_node]:
            del self._lent[owner][node]
            if not self._lent[owner]:
                del self._lent[owner]
        tagged: dict[JobKey, list[Device]] = {}
        for d in devices:
            if d.cls.owner is not None and not d.cls.standby:
                tagged.setdefault(d.cls.owner, []).append(d)
        for owner, devs in tagged.items():
            self._lent.setdefault(owner, {})[node] = tuple(devs)

    def lent_devices(self, owner: JobKey) -> Iterator[Device]:
        """Every device tagged with ``owner``'s right of return (its lent groups; standby
        devices on loan aside)."""
        for devs in self._lent.get(owner, {}).values():
            yield from devs

    def remove_inventory(self, node: NodeName) -> None:
        state = self._nodes.get(node)
        if state is None:
            return
        state.devices, state.cache, state.has_inventory = (), NodeCache(), False
        state.topology = None
        state.reclaiming = frozenset()
        for uid in list(state.reserved):  # held on devices that are gone
            self._reserved.pop(uid, None)
        state.reserved.clear()
        self._index_lent(node, ())
        self._changed(state)
        if not state.ledger and not state.ledger_version:
            self._forget(node)

    # --- reservations (gang pods placed, not yet bound: extender.scheduler.gangplacement) ---
    def reserve(self, node: NodeName, allocation: Allocation, until: float) -> None:
        """Hold these devices for the pod until it is bound, gone, or ``until`` (monotonic
        seconds) passes; any earlier reservation of the pod is dropped."""
        uid = allocation.holder.pod_uid
        self.unreserve(uid)
        state = self._node(node)
        state.reserved[uid] = allocation
        self._reserved[uid] = (node, until)
        self._changed(state)

    def unreserve(self, uid: PodUid) -> None:
        found = self._reserved.pop(uid, None)
        if found is None:
            return
        state = self._nodes.get(found[0])
        if state is not None and state.reserved.pop(uid, None) is not None:
            self._changed(state)

    def reservation(self, uid: PodUid) -> tuple[NodeName, Allocation] | None:
        """Where the pod's devices are held for it, and which."""
        found = self._reserved.get(uid)
        if found is None:
            return None
        state = self._nodes.get(found[0])
        held = state.reserved.get(uid) if state is not None else None
        return (found[0], held) if held is not None else None

    def expire_reservations(self, now: float) -> int:
        """Drop the reservations whose time has passed (monotonic ``now``); how many."""
        old = [uid for uid, (_, until) in self._reserved.items() if until <= now]
        for uid in old:
            self.unreserve(uid)
        return len(old)

    # --- ledger ---
    def set_ledger(self, node: NodeName, allocations: tuple[Allocation, ...], version: str) -> None:
        state = self._node(node)
        old = set(state.ledger)
        state.ledger = {a.holder.pod_uid: a for a in allocations}
        state.ledger_version = version
        for uid in old - state.ledger.keys():
            nodes = self._ledger_of.get(uid)
            if nodes is not None:
                nodes.discard(node)
                if not nodes:  # in no ledger any more: nothing of it left to free
                    del self._ledger_of[uid]
                    self._gone.discard(uid)
        for uid in state.ledger:
            self._ledger_of.setdefault(uid, set()).add(node)
        self._changed(state)

    def remove_ledger(self, node: NodeName) -> None:
        self.set_ledger(node, (), "")

    # --- watch events (raw objects from the API server or a snapshot) ---
    def apply_gpu_node(self, event: str, obj: Mapping[str, Any]) -> None:
        name = NodeName(str((obj.get("metadata") or {}).get("name", "")))
        if event == "DELETED":
            self.remove_inventory(name)
            return
        try:
            self.set_inventory(parse_gpu_node(obj))
            self._node(name).reclaiming = frozenset(GpuUuid(u) for u in reclaiming(obj))
            self.set_kept(name, _kept_mark(name, obj))
        except InvalidInput as e:
            # A bad object must not take the node's devices with it silently: offer none.
            log.error("ignoring invalid GpuNode %s: %s", name, e)
            self.remove_inventory(name)

    def apply_lease(self, event: str, obj: Mapping[str, Any]) -> None:
        """A node agent's heartbeat Lease (``tidelease-agent-<node>``)."""
        node, renewed = heartbeat(obj)
        if event == "DELETED":
            state = self._nodes.get(node)
            if state is not None:
                state.heartbeat = None
                self._set_silent(state, False)
            return
        if renewed is not None:
            self._node(node).heartbeat = renewed

    def sweep(self, now: float, timeout_s: float) -> list[NodeName]:
        """Mark nodes whose agent is silent for longer than ``timeout_s``; the nodes that
        changed. Nodes without a Lease are not judged."""
        changed = []
        for state in self._nodes.values():
            silent = state.heartbeat is not None and now - state.heartbeat > timeout_s
            if silent != state.silent:
                self._set_silent(state, silent)
                changed.append(state.node)
        return changed

    def _set_silent(self, state: NodeState, silent: bool) -> None:
        if state.silent != silent:
            state.silent = silent
            log.warning(
                "node %s: agent %s",
                state.node,
                "silent, its GPUs are no longer offered" if silent else "back",
            )
            self._changed(state)

    def apply_namespace(self, event: str, obj: Mapping[str, Any]) -> None:
        """A Namespace (the watch selects the granted ones; a label removed reads as DELETED)."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if event != "DELETED" and granted(meta.get("labels")):
            self.granted.add(name)
        else:
            self.granted.discard(name)

    def apply_gpu_lease(self, event: str, obj: Mapping[str, Any]) -> None:
        """A GpuLease came, changed or went: while it is reclaiming
        (:func:`~extender.rightofreturn.lease.reclaim_of`), its owner's pods of its workload
        are reclaims (:meth:`with_reclaim`)."""
        key = object_key(obj)
        for table in (self._reclaiming, self._workloads):
            for job, found in list(table.items()):
                if found.lease == key:
                    del table[job]
        named = workload_of(obj) if event != "DELETED" else None
        if named is not None:
            lease = _Reclaim(
                key,
                names_replicas(named.kind),
                named.kind,
                named.name,
                frozenset(named.groups),
                named.overdue,
            )
            self._workloads[named.owner] = lease
            if reclaim_of(obj) is not None:
                self._reclaiming[named.owner] = lease
        self._reclaiming_owners = frozenset(self._reclaiming)

    def with_reclaim(self, req: PodRequest) -> PodRequest:
        """The request as placement sees it: a reclaim when its namespace's lease for its
        owner is reclaiming and the pod is one of the lease's workload's replicas (its owner
        references); where that workload names its replicas, the pod takes back its own lent
        group (``lent_group``: the replica's name, as the leasing controller recorded the
        group); such a replica whose group is tagged is that group's return even before this
        view sees the lease Reclaiming (:meth:`_returning_replica`). Its devices must be like
        those its job lent: of their GPU type (where the pod names none) and at least their
        lowest tier (:meth:`_lent_kind`). Nothing the pod declares makes it a reclaim. A
        borrower is kept off the devices of every owner whose lease is reclaiming
        (``reclaiming_owners``)."""
        if req.priority is Priority.LOW:
            owners = self._reclaiming_owners
            if req.reclaiming_owners == owners and not req.reclaim:
                return req
            return replace(
                req,
                reclaiming_owners=owners,
                reclaim=False,
                lent_group=None,
                lent_groups=frozenset(),
                reclaim_overdue=False,
            )
        owner = req.owner
        found = self._reclaiming.get(owner) if owner is not None else None
        if found is None and owner is not None:
            found = self._returning_replica(owner, req)
        if owner is None or found is None or not belongs(req.controller, found.kind, found.name):
            if not req.reclaim and req.lent_group is None and not req.lent_groups:
                return req
            return replace(
                req,
                reclaim=False,
                lent_group=None,
                lent_groups=frozenset(),
                reclaim_overdue=False,
            )
        lent_group = req.name if found.per_replica else None
        lent_groups = frozenset() if found.per_replica else found.groups
        gpu_type, tier = self._lent_kind(owner, lent_group)
        gpu_type = req.gpu_type if req.gpu_type is not None else gpu_type
        min_tier = max(req.min_tier, tier) if tier is not None else req.min_tier
        overdue = found.overdue
        same = (
            req.reclaim,
            req.lent_group,
            req.lent_groups,
            req.gpu_type,
            req.min_tier,
            req.reclaim_overdue,
        )
        if same == (True, lent_group, lent_groups, gpu_type, min_tier, overdue):
            return req
        return replace(
            req,
            reclaim=True,
            lent_group=lent_group,
            lent_groups=lent_groups,
            gpu_type=gpu_type,
            min_tier=min_tier,
            reclaim_overdue=overdue,
        )

    def _returning_replica(self, owner: JobKey, req: PodRequest) -> _Reclaim | None:
        """The owner's lease, when ``req`` is one of its StatefulSet's replicas whose own lent
        group is tagged on the devices, whatever the lease's phase in this view: that replica
        comes up only when its lease takes the group back (the leasing controller scales it
        up after the Reclaiming status and the borrowers' notice), and this view may not have
        seen the status yet (a slow watch). Its right of return does not wait for the view."""
        lease = self._workloads.get(owner)
        if lease is None or not lease.per_replica:
            return None
        if not belongs(req.controller, lease.kind, lease.name):
            return None
        if any(d.cls.replica == req.name for d in self.lent_devices(owner)):
            return lease
        return None

    def _lent_kind(self, owner: JobKey, lent_group: str | None) -> tuple[str | None, Tier | None]:
        """What a returning pod's devices must be like: the GPU type and the lowest tier of
        what its job lent (its own group's devices, where it takes one back). Like for like: a
        stand-in (standby, or what its node offers) of another type, or of a lower tier, breaks
        the promise (docs/leasing.md). (None, None) when none of them is known any more (their
        node gone); no type where they are of several."""
        types: set[str] = set()
        tiers: list[Tier] = []
        for d in self.lent_devices(owner):
            if lent_group is None or d.cls.replica == lent_group:
                types.add(d.cls.gpu_type)
                tiers.append(d.cls.tier)
        gpu_type = next(iter(types)) if len(types) == 1 else None
        return gpu_type, min(tiers, default=None)

    def refusal(self, req: PodRequest, online_class: str) -> str | None:
        """Why tidelease refuses to place ``req`` at all, or None: a privilege of online jobs
        (``priority: high``, the online PriorityClass) in a namespace the admin has not granted
        them (common.tenancy)."""
        if req.namespace in self.granted:
            return None
        if req.priority is Priority.HIGH:
            return online_refusal(req.namespace, f"{contract.ANN_PRIORITY}: high")
        if online_class and req.priority_class == online_class:
            return online_refusal(req.namespace, f"priorityClassName {online_class}")
        return None

    def apply_gpu_allocation(self, event: str, obj: Mapping[str, Any]) -> None:
        name = NodeName(str((obj.get("metadata") or {}).get("name", "")))
        if event == "DELETED":
            self.remove_ledger(name)
            return
        try:
            node, allocations = parse_gpu_allocation(obj)
        except InvalidInput as e:
            log.error("invalid GpuAllocation %s, keeping its previous view: %s", name, e)
            return
        version = resource_version(obj)
        current = self._nodes.get(node)
        if current is not None and _older(version, current.ledger_version):
            return  # our own write, applied already, is newer than this event
        self.set_ledger(node, allocations, version)


@dataclass(frozen=True, slots=True)
class _Reclaim:
    """A reclaiming GpuLease, as the view needs it: its key, whether its workload names its
    replicas (extender.rightofreturn.replicas), and the workload whose pods take the lent
    devices back."""

    lease: str
    per_replica: bool
    kind: str
    name: str
    groups: frozenset[str] = frozenset()  # the lent groups (by replica) being taken back
    overdue: bool = False  # Degraded ReclaimOverdue: its pods no longer wait for their groups


def _kept_mark(node: NodeName, obj: Mapping[str, Any]) -> KeptMark:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    try:
        return decode(annotations.get(contract.ANN_KEPT_FOR_KUEUE))
    except ValueError as e:
        log.warning(
            "GpuNode %s: annotation %s ignored (nothing kept): %s",
            node,
            contract.ANN_KEPT_FOR_KUEUE,
            e,
            extra={"object": node},
        )
        return NO_MARK


def _older(version: str, than: str) -> bool:
    """Whether ``version`` precedes ``than``. resourceVersions are opaque in general; the API
    server's are etcd revisions, so compare them as numbers when both are numbers."""
    return version.isdigit() and than.isdigit() and int(version) < int(than)
