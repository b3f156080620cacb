"""How large a standby pool must be: sweep sizes, keep the smallest that meets the target. Pure.

A reclaim is *fully met* when as many lent devices came back, or standby devices stood in for
them, as the new replicas can hold. Devices are lost to failures while
lent (the failure model); the standby pool backfills them. The pool's size is split over GPU
types and tiers in proportion to the HA and MA devices the online jobs hold at the start
(:func:`~extender.simulation.controlling.standby_targets`).

The sweep runs the right-of-return policy once per size, in ascending order, ``batch`` sizes at
a time (they may run in parallel), and stops after the first batch in which a size meets the
target. Only sizes up to the answer are reported, so the report does not depend on ``batch``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extender.simulation.simulating import RunResult

DEFAULT_SIZES = (0, 32, 64, 128, 192, 256, 384, 512)
TARGET = 0.999


@dataclass(frozen=True, slots=True)
class SizingPoint:
    size: int  # standby GPUs
    reclaims: int
    full: int
    shortfall: int
    lost: int
    backfilled: int
    forfeited: int

    @property
    def ratio(self) -> float:
        return self.full / self.reclaims if self.reclaims else 1.0


@dataclass(frozen=True, slots=True)
class Sizing:
    target: float
    points: tuple[SizingPoint, ...]
    answer: int | None  # smallest size meeting the target; None if none swept does
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
        shortfall=s.shortfall,
        lost=s.lost,
        backfilled=s.backfilled,
        forfeited=s.forfeited,
    )


def sweep(
    run: Callable[[Sequence[int]], Sequence[RunResult]],
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    target: float = TARGET,
    batch: int = 1,
) -> Sizing:
    """``run(sizes)``: the right-of-return runs for those standby sizes, in the same order."""
    ordered = sorted(set(sizes))
    done: list[RunResult] = []
    answer: int | None = None
    for i in range(0, len(ordered), max(1, batch)):
        done.extend(run(ordered[i : i + max(1, batch)]))
        met = [point(r).size for r in done if point(r).ratio >= target]
        if met:
            answer = min(met)
            break
    kept = [r for r in done if answer is None or r.settings.standby_gpus <= answer]
    return Sizing(
        target=target,
        points=tuple(point(r) for r in kept),
        answer=answer,
        results=tuple(kept),
    )
