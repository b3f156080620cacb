"""How large a standby pool must be: sweep sizes, keep the smallest that meets the target. Pure.

The question (the paper gives its pool only as "dozens of spare nodes", leaving the size to
estimation): the smallest standby pool with which at least 99.9 % of reclaims are *full* under the
cluster's failure model. A reclaim is full when every device it asks back is matched, by the same
device or another of the owner's lent devices, a standby device on loan or any other device the
replica found, of the same GPU type and an equal or better tier (returned in kind), within the
grace period + 10 s
(:class:`~extender.leasingsim.controlling.ReclaimRecord`). Lent devices fail while lent; a replica
whose devices cannot all come back takes a whole node of standby devices on loan, so the pool must
hold whole nodes, of tiers as good as the groups they stand in for. The pool's size is split over
GPU types and tiers in proportion to the devices the online jobs hold at the start
(:func:`~extender.leasingsim.controlling.standby_targets`).

The sweep runs the right-of-return policy once per size and seed, in ascending order of size,
``batch`` sizes at a time (they may run in parallel). Over several seeds each size's share of
full reclaims is the mean of the per-seed shares with its t interval
(:mod:`~extender.leasingsim.estimating`), and a size *meets* the target when the interval's
lower bound does; with one seed the bound is the seed's share itself. Whether a reclaim is full
depends on which failures hit which lent groups at which peaks, so the share is not strictly
monotone in the size; the answer is the smallest size from which ``confirm`` consecutive swept
sizes all meet the target, and the sweep stops there. The answer is therefore non-decreasing in
the target (a size that meets a higher target meets a lower one). Only sizes up to the last one
confirming are reported, so the report does not depend on ``batch``.

Reference: weflex 3.3 (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from extender.leasingsim.estimating import LEVEL, Estimate, estimate, seeds_for, share

if TYPE_CHECKING:
    from extender.leasingsim.simulating import RunResult


TARGET = 0.999
CONFIRM = 2
# The largest standby pool the default sweep tries, as a share of the cluster's GPUs. A standby
# device is one no borrower may use: on the built-in cluster the leases lend about 17 % of the
# GPUs on average, so a pool of 20 % would hold back more than leasing gives borrowers; past it
# leasing with right of return gains nothing, and an admin gains more by accepting fewer full
# reclaims.
CAP_SHARE = 0.20
# standby sizes tried by default, as shares of the cluster's GPUs (rounded to whole nodes), up to
# the cap: with one seed, finer below 2 % and whole percents above; with several, where each
# size costs a run per seed (about a minute of a core for the built-in cluster), every fourth
# percent: the default three-seed sweep answers in five sizes (about ten minutes on two cores),
# and --sweep-sizes refines it. The sweep stops at the first confirmed answer, so the sizes past
# it cost nothing.
SEEDED_SHARES = tuple(k / 100 for k in range(0, round(100 * CAP_SHARE) + 1, 4))
DEFAULT_SHARES = (
    0.0025,
    0.005,
    0.0075,
    0.015,
    *(k / 100 for k in range(round(100 * CAP_SHARE) + 1)),
)


def default_sizes(total_gpus: int, node_gpus: int = 8, seeds: int = 1) -> tuple[int, ...]:
    """Sizes for a cluster of ``total_gpus`` swept over ``seeds`` seeds: the default shares
    rounded up to whole nodes."""
    node = max(1, node_gpus)
    shares = DEFAULT_SHARES if seeds <= 1 else SEEDED_SHARES
    sizes = {-(-round(share * total_gpus) // node) * node for share in shares}
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
class SizeEstimate:
    """One standby size over the seeds: the per-seed points and the share of full reclaims."""

    size: int
    points: tuple[SizingPoint, ...]  # one per seed, in the order of the seeds
    full: Estimate  # share of reclaims full: mean over the seeds, t interval
    level: float = LEVEL

    def seeds_to_meet(self, target: float) -> int | None:
        """How many seeds would confirm this size (its interval's lower bound at the target),
        projected from its seeds' shares (:func:`~.estimating.seeds_for`)."""
        return seeds_for([p.ratio for p in self.points], target, self.level)

    def of(self, name: str) -> Estimate:
        """The mean and interval of one of :class:`SizingPoint`'s counts (e.g. ``shortfall``)."""
        return estimate([float(getattr(p, name)) for p in self.points], self.level)


def by_size(points: Sequence[SizingPoint], level: float = LEVEL) -> list[SizeEstimate]:
    """The points grouped by size (ascending), each size's share of full reclaims estimated."""
    grouped: dict[int, list[SizingPoint]] = {}
    for p in points:
        grouped.setdefault(p.size, []).append(p)
    return [
        SizeEstimate(size, tuple(ps), share([p.ratio for p in ps], level), level)
        for size, ps in sorted(grouped.items())
    ]


@dataclass(frozen=True, slots=True)
class Sizing:
    target: float
    points: tuple[SizingPoint, ...]  # one per size and seed, by size then seed
    answer: int | None  # smallest size meeting the target (confirmed); None if none swept does
    results: tuple[RunResult, ...]  # the runs behind the points, same order
    level: float = LEVEL

    @property
    def sizes(self) -> tuple[SizeEstimate, ...]:
        return tuple(by_size(self.points, self.level))

    @property
    def seeds(self) -> int:
        """How many seeds each size was run with."""
        return max((len(s.points) for s in self.sizes), default=0)

    @property
    def largest(self) -> int:
        return max((p.size for p in self.points), default=0)

    def nearest(self) -> SizeEstimate | None:
        """Below the answer (or without one), the smallest size whose mean meets the target
        but whose interval does not: one more seeds could confirm (None with one seed)."""
        for p in self.sizes:
            if self.answer is not None and p.size >= self.answer:
                return None
            if p.full.spread and p.full.mean >= self.target > p.full.low:
                return p
        return None

    def results_for(self, size: int) -> list[RunResult]:
        """The runs of ``size``, one per seed."""
        return [r for p, r in zip(self.points, self.results, strict=True) if p.size == size]

    def result_for(self, size: int) -> RunResult | None:
        found = self.results_for(size)
        return found[0] if found else None


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


def answer_of(
    points: Sequence[SizingPoint],
    target: float,
    confirm: int = CONFIRM,
    level: float = LEVEL,
) -> int | None:
    """The smallest size from which ``confirm`` consecutive sizes meet the target (the lower
    bound of their share of full reclaims over the seeds, the share itself with one seed); the
    largest size alone counts when it meets it and no larger size was swept."""
    ordered = by_size(points, level)
    need = max(1, confirm)
    for i, p in enumerate(ordered):
        run = ordered[i : i + need]
        if all(q.full.low >= target for q in run) and (
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
    level: float = LEVEL,
) -> Sizing:
    """``run(sizes)``: the right-of-return runs for those standby sizes, every seed's (in any
    order: the runs are grouped by their settings' size and seed)."""
    ordered = sorted(set(sizes))
    need = max(1, confirm)
    done: list[RunResult] = []
    for i in range(0, len(ordered), max(1, batch)):
        done.extend(run(ordered[i : i + max(1, batch)]))
        points = [point(r) for r in done]
        found = answer_of(points, target, need, level)
        # confirmed by `need` sizes, not merely by being the largest swept so far
        if found is not None and len({p.size for p in points if p.size >= found}) >= need:
            break
    done.sort(key=lambda r: (r.settings.standby_gpus, r.settings.seed))
    points = [point(r) for r in done]
    answer = answer_of(points, target, need, level)
    kept = list(done)
    if answer is not None:
        last = sorted({p.size for p in points if p.size >= answer})[:need][-1]
        kept = [r for r in done if r.settings.standby_gpus <= last]
    return Sizing(
        target=target,
        points=tuple(point(r) for r in kept),
        answer=answer,
        results=tuple(kept),
        level=level,
    )
