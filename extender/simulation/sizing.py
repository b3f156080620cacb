"""How large a standby pool must be: sweep sizes, keep the smallest that meets the target. Pure.

The question (weflex 3.3 leaves it to estimation): the smallest standby pool with which at
least 99.9 % of reclaims are *full* under the cluster's failure model. A reclaim is full when
every device it asks back is matched, by the same device or another of the owner's lent
devices or a standby device on loan, of the same GPU type and an equal or better tier, within
the grace period + 10 s (:class:`~extender.simulation.controlling.ReclaimRecord`). Lent devices
fail while lent; a replica whose devices cannot all come back takes a whole node of standby
devices on loan, so the pool must hold whole nodes, of tiers as good as the groups they stand
in for. The pool's size is split over GPU types and tiers in proportion to the devices the
online jobs hold at the start (:func:`~extender.simulation.controlling.standby_targets`).

The sweep runs the right-of-return policy once per size, in ascending order, ``batch`` sizes
at a time (they may run in parallel). Whether a reclaim is full depends on which failures hit
which lent groups at which peaks, so the ratio is not strictly monotone in the size; the
answer is the smallest size from which ``confirm`` consecutive swept sizes all meet the target,
and the sweep stops there. Only sizes up to the last one confirming are reported, so the
report does not depend on ``batch``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from extender.simulation.simulating import RunResult


TARGET = 0.999
CONFIRM = 2
# standby sizes tried by default, as shares of the cluster's GPUs (rounded to whole nodes)
DEFAULT_SHARES = (0.0, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05)


def default_sizes(total_gpus: int, node_gpus: int = 8) -> tuple[int, ...]:
    """Sizes for a cluster of ``total_gpus``: the default shares rounded up to whole nodes."""
    node = max(1, node_gpus)
    sizes = {-(-round(share * total_gpus) // node) * node for share in DEFAULT_SHARES}
    return tuple(sorted(sizes))


@dataclass(frozen=True, slots=True)
class SizingPoint:
    size: int  # standby GPUs
    reclaims: int
    full: int
    timely: int
    due: int
    shortfall: int
    lost: int
    backfilled: int
    foreign: int
    forfeited: int

    @property
    def ratio(self) -> float:
        return self.full / self.reclaims if self.reclaims else 1.0


@dataclass(frozen=True, slots=True)
class Sizing:
    target: float
    points: tuple[SizingPoint, ...]
    answer: int | None  # smallest size meeting the target (confirmed); None if none swept does
    results: tuple[RunResult, ...]  # the runs behind the points, same order

    def result_for(self, size: int) -> RunResult | None:
        for p, r in zip(self.points, self.results, strict=True):
            if p.size == size:
                return r
        return None


def point(result: RunResult) -> SizingPoint:
    s = result.summary
    return SizingPoint(
        size=result.settings.standby_gpus,
        reclaims=s.reclaims,
        full=s.reclaims_full,
        timely=s.reclaims_timely,
        due=s.due,
        shortfall=s.shortfall,
        lost=s.lost,
        backfilled=s.backfilled,
        foreign=s.foreign,
        forfeited=s.forfeited,
    )


def answer_of(points: Sequence[SizingPoint], target: float, confirm: int = CONFIRM) -> int | None:
    """The smallest size from which ``confirm`` consecutive points (by size) meet the target;
    the largest point alone counts when it meets it and no larger size was swept."""
    ordered = sorted(points, key=lambda p: p.size)
    need = max(1, confirm)
    for i, p in enumerate(ordered):
        run = ordered[i : i + need]
        if all(q.ratio >= target for q in run) and (
            len(run) == need or i + len(run) == len(ordered)
        ):
            return p.size
    return None


def sweep(
    run: Callable[[Sequence[int]], Sequence[RunResult]],
    sizes: Sequence[int],
    *,
    target: float = TARGET,
    batch: int = 1,
    confirm: int = CONFIRM,
) -> Sizing:
    """``run(sizes)``: the right-of-return runs for those standby sizes, in the same order."""
    ordered = sorted(set(sizes))
    need = max(1, confirm)
    done: list[RunResult] = []
    for i in range(0, len(ordered), max(1, batch)):
        done.extend(run(ordered[i : i + max(1, batch)]))
        points = [point(r) for r in done]
        found = answer_of(points, target, need)
        # confirmed by `need` points, not merely by being the largest swept so far
        if found is not None and sum(1 for p in points if p.size >= found) >= need:
            break
    points = [point(r) for r in done]
    answer = answer_of(points, target, need)
    kept = list(done)
    if answer is not None:
        last = sorted(p.size for p in points if p.size >= answer)[:need][-1]
        kept = [r for r in done if r.settings.standby_gpus <= last]
    return Sizing(
        target=target,
        points=tuple(point(r) for r in kept),
        answer=answer,
        results=tuple(kept),
    )
