"""When a borrower gang has lost a member, which of its other members to evict. Pure.

A gang's pods are useful only together (common.gangs). tidelease's own reclaim evicts a gang
whole (extender.rightofreturn.rules.plan_reclaim), but kube-scheduler's preemption deletes the
victims of one node only (the extender's preempt verb chooses them to break as few gangs as it
can, extender.scheduler.gangvictims), and a drain or the API's evictions take pods one by one.
Without this rule the members elsewhere would keep their GPUs, producing nothing.

A gang is **broken** when one of its members is deleted (or being deleted) carrying the
condition ``DisruptionTarget`` (Kubernetes sets it on a pod it preempts, evicts through the
Eviction API or removes from a tainted node; tidelease sets it on a reclaimed borrower): a
disruption, not a member that finished or that its own controller replaced. The members that
existed then (created before the disruption: a job's controller may start the gang again, and
its new pods are a new attempt) and still hold a node (bound, not terminating, not finished)
are evicted, low-priority pods only: a gang member that declares ``tidelease.io/priority:
high`` is an online job's, never evicted by this rule. A member with a reclaim notice keeps its
notice's time: it is evicted once that time has come, not before (a reclaim notices a gang
whole and evicts it whole at that time, but a reclaim that ends sooner, its devices freed by
kube-scheduler's preemption of one member, evicts no more, and the rest of the gang would keep
its GPUs for nothing: the soak found one). A gang is one
of a namespace (its key starts with it), so a pod of another namespace is never a member,
whatever it declares.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from common import contract
from common.gangs import gang_of, parse_time
from common.objects import DISRUPTION_TARGET


@dataclass(frozen=True, slots=True)
class Member:
    """One pod of a gang, as far as this rule needs it."""

    namespace: str
    name: str
    uid: str
    gang: str
    node: str  # "" while unbound
    created: float  # its creationTimestamp (epoch seconds; 0 unknown)
    terminating: bool
    finished: bool  # Succeeded or Failed
    disrupted: str | None  # the DisruptionTarget reason, when its status is True
    disrupted_at: float  # that condition's lastTransitionTime (0 unknown)
    high: bool  # tidelease.io/priority: high
    # its reclaim notice's time (epoch seconds; 0.0 when the notice does not parse), or None
    notice_at: float | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def member_of(pod: Mapping[str, Any]) -> Member | None:
    """The pod as a gang member; None for a pod in no gang."""
    gang = gang_of(pod)
    if gang is None:
        return None
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    disrupted, disrupted_at = None, 0.0
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == DISRUPTION_TARGET and c.get("status") == "True":
            disrupted = str(c.get("reason") or "unknown")
            disrupted_at = parse_time(c.get("lastTransitionTime")) or 0.0
    annotations = meta.get("annotations") or {}
    notice = annotations.get(contract.ANN_RECLAIM_NOTICE) if isinstance(annotations, dict) else None
    return Member(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        gang=gang,
        node=str(spec.get("nodeName") or ""),
        created=parse_time(meta.get("creationTimestamp")) or 0.0,
        terminating=bool(meta.get("deletionTimestamp")),
        finished=status.get("phase") in ("Succeeded", "Failed"),
        disrupted=disrupted,
        disrupted_at=disrupted_at,
        high=isinstance(annotations, dict) and annotations.get(contract.ANN_PRIORITY) == "high",
        notice_at=None if notice is None else parse_time(notice) or 0.0,
    )


def breaks(member: Member, deleted: bool) -> bool:
    """Whether this member's end breaks its gang: deleted or being deleted, disrupted."""
    return member.disrupted is not None and (deleted or member.terminating)


def _mates(members: Iterable[Member], cause: Member, present: Collection[str]) -> list[Member]:
    since = cause.disrupted_at or float("inf")
    return sorted(
        (
            m
            for m in members
            if m.uid != cause.uid
            and m.node
            and not m.terminating
            and not m.finished
            and not m.high
            and (m.uid in present or m.created < since)
        ),
        key=lambda m: m.name,
    )


def mates_to_evict(
    members: Iterable[Member], cause: Member, present: Collection[str] = (), *, now: float
) -> tuple[Member, ...]:
    """The members to evict at ``now`` once ``cause`` broke the gang: those that existed then
    (their UIDs in ``present``, the members known when the break was seen, or created in a
    second before the disruption's) and still hold a node, low priority only, by name; one with
    a reclaim notice only once its notice's time has come (a reclaim notices a gang whole and
    evicts it whole then, one member after the other: the first one gone does not make this
    rule evict the others sooner). Timestamps have whole seconds: a member made in the second
    of the disruption is one only if it was ``present`` (kube-scheduler may preempt a member
    within a second of its creation; a gang started again within that second is not taken for
    the old one)."""
    return tuple(
        m for m in _mates(members, cause, present) if m.notice_at is None or m.notice_at <= now
    )


def next_notice(
    members: Iterable[Member], cause: Member, present: Collection[str] = (), *, now: float
) -> float | None:
    """The earliest notice time after ``now`` of a member :func:`mates_to_evict` leaves until
    then; None when there is none."""
    waiting = [
        m.notice_at
        for m in _mates(members, cause, present)
        if m.notice_at is not None and m.notice_at > now
    ]
    return min(waiting, default=None)
