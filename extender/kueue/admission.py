"""What tidelease's Kueue admission check says of every workload at once. Pure.

Lent capacity is shared, so the workloads are judged together, in one pass, against the lent
GPUs that are free now (:func:`extender.kueue.capacity.lent_capacity`):

1. **Holders** first: the workloads the check has let through (``Ready``) and Kueue has not
   evicted. Their pods already placed hold their GPUs in the ledger, so they are not free any
   more; the pods not placed yet get a reservation out of what is left, oldest workload first,
   so that nothing admitted is counted twice. A holder is sent back (``Retry``: Kueue evicts
   it, suspending its Job rather than failing it, and requeues it) when

   * a pod of it holds a reclaim notice whose time has come (the owner takes its GPUs back:
     the whole workload goes, after the owner's notice, as a gang does), or
   * its pods not placed yet have had no room in what is lent for ``lost_after_s`` (the GPUs
     kept for it were taken back before it was placed): it would hold Kueue's quota Pending.

2. **Waiting** workloads next, oldest first: those whose quota Kueue has reserved and on which
   the check is ``Pending``. One is ``Ready`` once what is left can hold all its pods (that
   becomes its reservation), else stays ``Pending`` with the reason. None is let through while
   a holder has no room (what was kept for it was taken back, or its pods were placed apart
   from where the reservation had them and left what remains in pieces).

So at every moment the GPUs of the workloads the check let through, placed or not, fit in what
is lent: Kueue never admits more borrowed GPUs than there are. The reservations are derived
again at each pass from what is stored (workloads, pods, ledgers), never remembered, so a
restarted controller resumes from the API server; only the time a holder's reservation was
first found lost is kept between passes (:attr:`Decisions.lost_since`; lost on a restart,
which only delays a ``Retry``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from extender.kueue.capacity import Capacity, PodSetNeed, Reservation, fit, less
from extender.kueue.workloads import CheckState, Workload

LOST_AFTER_S = 30.0  # a holder's pods without room this long: Retry


@dataclass(frozen=True, slots=True)
class PodsOf:
    """What the pods of one workload's owner (its Job) are doing now."""

    placed: Mapping[str, int] = field(default_factory=dict)  # pod set -> pods bound, running
    notice_at: float | None = None  # the earliest reclaim notice on any of them


@dataclass(frozen=True, slots=True)
class Decision:
    """A state to write for the check on one workload."""

    workload: Workload
    check: str
    state: CheckState
    message: str


@dataclass(frozen=True, slots=True)
class Decisions:
    writes: tuple[Decision, ...]
    reservations: tuple[Reservation, ...]  # what is kept for holders and new Ready ones
    lost_since: Mapping[str, float]  # holder key -> when its pods were first found without room
    next_at: float | None  # the next time a decision is due without any change (a notice)


def our_check(workload: Workload, checks: frozenset[str]) -> tuple[str, CheckState] | None:
    """The name and state of the check of ours on the workload (the first by name)."""
    for name in sorted(checks):
        state = workload.checks.get(name)
        if state is not None:
            return name, state
    return None


def unplaced(workload: Workload, pods: PodsOf) -> tuple[PodSetNeed, ...]:
    """The pods of the workload not placed yet, per pod set."""
    out = []
    for need in workload.needs:
        left = max(0, need.count - pods.placed.get(need.name, 0))
        if left and need.request.gpus > 0:
            out.append(PodSetNeed(need.name, left, need.request))
    return tuple(out)


def decide(
    workloads: Iterable[Workload],
    checks: frozenset[str],
    capacity: Capacity,
    pods: Mapping[str, PodsOf],
    *,
    now: float,
    lost_since: Mapping[str, float] | None = None,
    lost_after_s: float = LOST_AFTER_S,
) -> Decisions:
    """Every write the check owes now. ``checks``: the names of the AdmissionChecks of
    tidelease's controller; ``capacity``: the lent GPUs free now, per node and class;
    ``pods``: by the workload's owner, ``namespace/UID`` (:attr:`Workload.owner`)."""
    lost_before = lost_since or {}
    holders: list[tuple[Workload, str]] = []
    waiting: list[tuple[Workload, str]] = []
    for w in workloads:
        ours = our_check(w, checks)
        if ours is None or w.finished or w.evicted:
            continue
        name, state = ours
        if state == "Ready":
            holders.append((w, name))
        elif state == "Pending" and w.quota_reserved:
            waiting.append((w, name))
    order = lambda pair: (pair[0].created, pair[0].key)  # noqa: E731
    holders.sort(key=order)
    waiting.sort(key=order)

    writes: list[Decision] = []
    kept: list[Reservation] = []
    lost: dict[str, float] = {}
    next_at: float | None = None

    def due(at: float) -> None:
        nonlocal next_at
        next_at = at if next_at is None else min(next_at, at)

    left: Capacity = capacity
    for w, name in holders:
        mine = pods.get(w.owner, PodsOf())
        if mine.notice_at is not None and mine.notice_at <= now:
            writes.append(
                Decision(
                    w,
                    name,
                    "Retry",
                    "tidelease: the online job that lent its GPUs takes them back (its notice "
                    "has run out); Kueue requeues the workload",
                )
            )
            continue
        if mine.notice_at is not None:
            due(mine.notice_at)
        need = unplaced(w, mine)
        if not need:
            continue
        verdict = fit(w.key, need, left)
        if verdict.reservation is not None:
            kept.append(verdict.reservation)
            left = less(left, [verdict.reservation])
            continue
        since = lost_before.get(w.key, now)
        if now - since >= lost_after_s:
            writes.append(
                Decision(
                    w,
                    name,
                    "Retry",
                    f"tidelease: the lent GPUs kept for it were taken back before its pods "
                    f"were placed ({verdict.reason}); Kueue requeues the workload",
                )
            )
        else:
            lost[w.key] = since
            due(since + lost_after_s)

    for w, name in waiting:
        if lost:
            # A holder without room: letting another through now could hold more than is
            # lent, until that holder is placed or sent back.
            message = (
                f"tidelease: waiting for lent GPUs: {min(lost)} was let through earlier and "
                "has no room for its pods yet"
            )
            if message != w.messages.get(name):
                writes.append(Decision(w, name, "Pending", message))
            continue
        verdict = fit(w.key, w.needs, left)
        if verdict.reservation is not None:
            kept.append(verdict.reservation)
            left = less(left, [verdict.reservation])
            writes.append(Decision(w, name, "Ready", f"tidelease: {verdict.reason}"))
        else:
            message = f"tidelease: waiting for lent GPUs: {verdict.reason}"
            if message != w.messages.get(name):
                writes.append(Decision(w, name, "Pending", message))
    return Decisions(tuple(writes), tuple(kept), lost, next_at)
