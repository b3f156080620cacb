"""What ``tidelease ctl`` shows, computed from the objects the API server holds. Pure.

The devices, their holders and the agents' silence come from the extender's own cluster state
(:class:`~extender.cluster.state.ClusterState`, fed by the same rules as its watch:
:func:`~extender.cluster.watching.view_applier`), so what is shown free here is what the filter
offers. Health, reasons and availability come from the GpuNode's status as the agent wrote it.

A device is in exactly one of these states (``DeviceView.state``): ``held`` by a high-priority
pod (an owner's), ``borrowed`` by a low-priority pod, ``free`` (healthy and held by nobody) or
``unusable`` (not healthy and held by nobody). Across states it may be ``lent`` (tagged with the
owner that lent it, who may take it back) and ``standby`` (kept to backfill reclaims).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.availability import Interval, availability
from common.errors import InvalidInput
from common.model import Allocation, Priority
from extender.cluster.state import ClusterState
from extender.rightofreturn.lease import parse_gpu_lease
from extender.rightofreturn.rules import target_gpus

DEVICE_STATES = ("held", "borrowed", "free", "unusable")


@dataclass(frozen=True, slots=True)
class DeviceView:
    node: str
    index: int
    uuid: str
    type: str
    tier: str
    health: str  # Healthy | Unhealthy | Unknown, as the agent reports it
    reason: str
    # Healthy share of the time observed in the agent's window; None where none is published.
    availability: float | None
    owner: str | None  # the job that lent it (right of return)
    replica: str | None  # the owner's replica that takes it back
    standby: bool
    holder: str | None  # namespace/name of the pod it is allocated to
    holder_priority: str | None  # high | low

    @property
    def state(self) -> str:
        if self.holder is not None:
            return "held" if self.holder_priority == Priority.HIGH.value else "borrowed"
        return "free" if self.health == "Healthy" else "unusable"


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    agent: str  # Ready | Silent | NoLease (no heartbeat seen yet)
    devices: tuple[DeviceView, ...] = ()
    problem: str = ""  # why the extender cannot read the GpuNode (it then offers nothing)


@dataclass(slots=True)
class Counts:
    """GPUs of one type and tier."""

    type: str
    tier: str
    total: int = 0
    healthy: int = 0
    unhealthy: int = 0
    unknown: int = 0
    free: int = 0
    held: int = 0  # by high-priority pods (owners)
    borrowed: int = 0  # by low-priority pods
    lent: int = 0  # tagged with the owner that lent them
    standby_free: int = 0
    standby_on_loan: int = 0

    def add(self, d: DeviceView) -> None:
        self.total += 1
        if d.health == "Healthy":
            self.healthy += 1
        elif d.health == "Unhealthy":
            self.unhealthy += 1
        else:
            self.unknown += 1
        state = d.state
        if state == "free":
            self.free += 1
        elif state == "held":
            self.held += 1
        elif state == "borrowed":
            self.borrowed += 1
        if d.owner is not None:
            self.lent += 1
        if d.standby:
            if state == "borrowed":
                self.standby_on_loan += 1
            elif state == "free":
                self.standby_free += 1


@dataclass(frozen=True, slots=True)
class Borrower:
    device: str
    node: str
    pod: str | None  # namespace/name; None while the device is free


@dataclass(frozen=True, slots=True)
class LeaseView:
    namespace: str
    name: str
    owner: str
    phase: str
    desired_gpus: int  # what the spec asks for now (the schedule's entry in force)
    held_gpus: int  # GPUs the owner's high-priority pods hold
    lent_gpus: int
    target_replicas: int | None
    reclaims: int
    returned: int
    backfilled: int
    last_reclaim_seconds: float | None
    reclaim_deadline: str | None  # while reclaiming: when borrowers' notice ends
    noticed: tuple[str, ...] = ()  # borrowers given notice, namespace/name
    lent: tuple[tuple[str, tuple[Borrower, ...]], ...] = ()  # per lent group (replica)
    problem: str = ""  # why the controller cannot read it


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    gpus: tuple[Counts, ...]
    nodes: int
    silent_nodes: tuple[str, ...]
    unreadable_nodes: tuple[str, ...]
    leases: tuple[LeaseView, ...] = field(default=())


def _intervals(raw: object) -> list[Interval]:
    out: list[Interval] = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, list) and len(item) == 3 and all(isinstance(x, int) for x in item):
            out.append((float(item[0]), float(item[1]), bool(item[2])))
    return out


def device_availability(intervals: Sequence[Interval]) -> float | None:
    """Healthy time over observed time across what the agent published (its window)."""
    if not intervals:
        return None
    start = min(a for a, _, _ in intervals)
    end = max(b for _, b, _ in intervals)
    return availability(intervals, end, end - start)


def _allocations(cluster: ClusterState) -> list[Allocation]:
    """Live allocations (pods seen gone left out, as the extender leaves them out)."""
    return [a for state in cluster for a in state.allocations.values()]


def _holders(cluster: ClusterState) -> dict[str, Allocation]:
    return {uuid: a for a in _allocations(cluster) for uuid in a.devices}


def node_views(
    cluster: ClusterState, gpu_nodes: Iterable[Mapping[str, Any]], problems: Mapping[str, str]
) -> list[NodeView]:
    """Every GpuNode's devices, by node name. ``problems``: the GpuNodes the view could not
    read, with why."""
    holders = _holders(cluster)
    out: list[NodeView] = []
    for obj in gpu_nodes:
        name = str((obj.get("metadata") or {}).get("name", ""))
        state = cluster.get(name)
        if state is None or state.heartbeat is None:
            agent = "NoLease"
        else:
            agent = "Silent" if state.silent else "Ready"
        if name in problems:
            out.append(NodeView(name, agent, problem=problems[name]))
            continue
        status = obj.get("status") or {}
        raw_devices = {
            str(d.get("uuid")): d for d in status.get("devices") or [] if isinstance(d, dict)
        }
        published = status.get("availability") or {}
        devices = []
        for dev in state.devices if state is not None else ():
            raw = raw_devices.get(dev.uuid, {})
            held = holders.get(dev.uuid)
            devices.append(
                DeviceView(
                    node=name,
                    index=dev.index,
                    uuid=dev.uuid,
                    type=dev.gpu_type,
                    tier=dev.tier.name,
                    health=str(raw.get("health", "Unknown")),
                    reason=str(raw.get("reason", "")),
                    availability=device_availability(_intervals(published.get(dev.uuid))),
                    owner=dev.cls.owner,
                    replica=dev.cls.replica,
                    standby=dev.cls.standby,
                    holder=held.holder.key if held else None,
                    holder_priority=held.holder.priority.value if held else None,
                )
            )
        out.append(NodeView(name, agent, tuple(devices)))
    return sorted(out, key=lambda n: n.name)


def lease_views(
    cluster: ClusterState, gpu_leases: Iterable[Mapping[str, Any]], now: float
) -> list[LeaseView]:
    holders = _holders(cluster)
    where = {d.uuid: str(d.node) for state in cluster for d in state.devices}
    held_by: Counter[tuple[str, str | None]] = Counter()  # (namespace, owner) -> GPUs held
    for a in _allocations(cluster):
        if a.holder.priority is Priority.HIGH:
            held_by[(a.holder.namespace, a.holder.owner)] += len(a.devices)
    out: list[LeaseView] = []
    for obj in gpu_leases:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        try:
            lease = parse_gpu_lease(obj)
        except InvalidInput as e:
            out.append(
                LeaseView(ns, name, "", "", 0, 0, 0, None, 0, 0, 0, None, None, problem=str(e))
            )
            continue
        spec, status = lease.spec, lease.status
        lent = tuple(
            (
                g.replica,
                tuple(
                    Borrower(
                        u,
                        where.get(u, ""),
                        holders[u].holder.key if u in holders else None,
                    )
                    for u in g.devices
                ),
            )
            for g in status.groups
        )
        reclaim = (obj.get("status") or {}).get("reclaim") or {}
        out.append(
            LeaseView(
                namespace=ns,
                name=name,
                owner=spec.owner,
                phase=status.phase,
                desired_gpus=target_gpus(spec.desired_gpus, spec.schedule, now),
                held_gpus=held_by[(ns, spec.owner)],
                lent_gpus=len(status.lent),
                target_replicas=status.target_replicas,
                reclaims=status.reclaims,
                returned=status.returned,
                backfilled=status.backfilled,
                last_reclaim_seconds=status.last_reclaim_s,
                reclaim_deadline=str(reclaim["deadline"]) if reclaim.get("deadline") else None,
                noticed=tuple(f"{n.namespace}/{n.name}" for n in status.noticed),
                lent=lent,
            )
        )
    return sorted(out, key=lambda v: (v.namespace, v.name))


def summary(nodes: Sequence[NodeView], leases: Sequence[LeaseView]) -> ClusterSummary:
    counts: dict[tuple[str, str], Counts] = {}
    for node in nodes:
        for d in node.devices:
            key = (d.type, d.tier)
            counts.setdefault(key, Counts(d.type, d.tier)).add(d)
    tier_order = {"HA": 0, "MA": 1, "LA": 2}
    ordered = sorted(counts.values(), key=lambda c: (c.type, tier_order.get(c.tier, 9)))
    return ClusterSummary(
        gpus=tuple(ordered),
        nodes=len(nodes),
        silent_nodes=tuple(n.name for n in nodes if n.agent == "Silent"),
        unreadable_nodes=tuple(n.name for n in nodes if n.problem),
        leases=tuple(leases),
    )
