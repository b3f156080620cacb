"""The planner's output as the leasing controller's input: a GpuLease spec change. Pure.

The leasing controller (extender/leasing/controller.py) steers an online job to ``target_gpus``:
``spec.schedule``'s entry in force, or ``spec.desiredGPUs`` when there is no schedule
(extender/rightofreturn/rules.py). The planner speaks that language two ways:

* :func:`desired_patch` — live: a JSON merge patch setting ``desiredGPUs`` to the planned
  count (and removing any schedule, which would otherwise win), sent every planning step when the
  count changes; the count was already chosen ``W`` ahead (:mod:`autoscaling`).
* :func:`schedule_from_plan` — ahead of time: a day's stabilised plan compressed into at most
  96 ``{at: "HH:MM", gpus}`` entries (the CRD's limit), each change moved earlier by the
  prelaunch window ``W`` for a rise (later never: a fall takes effect at its own time).

GPUs are workers times ``gpusPerReplica``, rounded up to whole replicas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from extender.rightofreturn.rules import ScheduleEntry

MAX_SCHEDULE_ENTRIES = 96  # the chart's crds/gpuleases.yaml: spec.schedule.maxItems
DAY_MIN = 1440


def gpus_for(workers: int, gpus_per_worker: int, gpus_per_replica: int) -> int:
    """GPUs for ``workers``, rounded up to whole replicas of the lease's workload."""
    gpus = workers * gpus_per_worker
    return math.ceil(gpus / gpus_per_replica) * gpus_per_replica


@dataclass(frozen=True, slots=True)
class LeaseDirective:
    """What the planner wants of one GpuLease, and why."""

    namespace: str
    name: str
    desired_gpus: int | None = None
    schedule: tuple[ScheduleEntry, ...] = ()
    reason: str = ""

    def merge_patch(self) -> dict[str, Any]:
        """The JSON merge patch (RFC 7386) for the GpuLease's spec."""
        spec: dict[str, Any] = {}
        if self.desired_gpus is not None:
            spec["desiredGPUs"] = self.desired_gpus
        if self.schedule:
            spec["schedule"] = [
                {"at": f"{e.minute_of_day // 60:02d}:{e.minute_of_day % 60:02d}", "gpus": e.gpus}
                for e in sorted(self.schedule, key=lambda e: e.minute_of_day)
            ]
        elif self.desired_gpus is not None:
            spec["schedule"] = None  # a schedule would take precedence over desiredGPUs
        return {"spec": spec}


def desired_patch(
    namespace: str, name: str, gpus: int, current_gpus: int | None, reason: str
) -> LeaseDirective | None:
    """A directive setting ``desiredGPUs``; ``None`` when the lease already asks for it."""
    if current_gpus == gpus:
        return None
    return LeaseDirective(namespace, name, desired_gpus=gpus, reason=reason)


def schedule_from_plan(
    plan: Sequence[int],
    *,
    start_minute: int,
    step_min: int,
    lead_min: int,
    gpus_per_worker: int = 1,
    gpus_per_replica: int = 1,
) -> tuple[ScheduleEntry, ...]:
    """A day's plan (worker counts from ``start_minute`` of the day, UTC, every ``step_min``) as
    schedule entries. A rise is scheduled ``lead_min`` early and the higher count holds over
    the lead window; runs are merged; when more than 96 changes remain, the shortest runs are
    merged into their larger neighbour until they fit (never below the plan)."""
    if not plan:
        return ()
    steps = min(len(plan), DAY_MIN // step_min)
    gpus = [gpus_for(w, gpus_per_worker, gpus_per_replica) for w in plan[:steps]]
    lead_steps = math.ceil(lead_min / step_min)
    led = [max(gpus[k : k + 1 + lead_steps]) for k in range(steps)]  # hold the max ahead
    runs: list[list[int]] = []  # [first step, gpus, length]
    for k, g in enumerate(led):
        if runs and runs[-1][1] == g:
            runs[-1][2] += 1
        else:
            runs.append([k, g, 1])
    while len(runs) > MAX_SCHEDULE_ENTRIES:
        i = min(range(len(runs)), key=lambda j: (runs[j][2], j))
        j = i - 1 if i > 0 else i + 1
        if i + 1 < len(runs) and (i == 0 or runs[i + 1][1] > runs[i - 1][1]):
            j = i + 1
        keep, drop = (runs[j], runs[i])
        keep[1] = max(keep[1], drop[1])
        keep[0] = min(keep[0], drop[0])
        keep[2] += drop[2]
        del runs[i]
        merged: list[list[int]] = []
        for r in runs:
            if merged and merged[-1][1] == r[1]:
                merged[-1][2] += r[2]
            else:
                merged.append(r)
        runs = merged
    return tuple(
        ScheduleEntry((start_minute + first * step_min) % DAY_MIN, g) for first, g, _ in runs
    )
