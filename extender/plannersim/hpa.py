"""Kubernetes' HorizontalPodAutoscaler (autoscaling/v2): its rules and defaults, one metric. Pure.

What a reactive policy does, written after kube-controller-manager's podautoscaler
(``replica_calculator.go``, ``horizontal.go``), so the simulator's baseline is the HPA an admin
gets, not a strawman:

* every sync period (``--horizontal-pod-autoscaler-sync-period``, 15 s) the replica calculator
  reads the metric of the *ready* pods: ``ratio = utilisation / target``; within the tolerance
  (``--horizontal-pod-autoscaler-tolerance``, 0.1) nothing changes, else the recommendation is
  ``ceil(ratio * ready)``;
* pods not ready yet (pending, pulling, loading the checkpoint) count as using 0 % of the target
  when the ratio asks for a scale-up: ``ratio' = utilisation * ready / (target * (ready +
  unready))``, and no change if that falls within the tolerance or flips the direction — while
  a scale-up is still starting, the HPA does not add to it unless the ready pods alone ask for
  more;
* behaviour defaults: scale-up stabilisation window 0 s, scale-up policies "100 % or 4 pods per
  15 s, whichever is more" (``selectPolicy: Max``); scale-down stabilisation window 300 s (the
  largest recommendation of the last 5 minutes wins), scale-down policy 100 % per 15 s;
* ``minReplicas``/``maxReplicas`` bound the result.

The metric here is a utilisation (GPU busy time over wall time, 0..1), so it saturates at 1:
an overloaded job reads 100 % whatever the backlog, and one round can add at most ``1 /
target - 1`` of the ready pods. With new pods useful only after the prelaunch window ``W``, the
HPA climbs a sharp rise in rounds of ``W`` — what makes it late (the paper the planner follows
saw the HPA add workers 20 minutes after a rise).

Reference: kale 1, 4.4 (docs/references.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class HpaSettings:
    target: float = 0.8  # target average utilisation (the admin's choice; see docs/planner.md)
    tolerance: float = 0.1  # --horizontal-pod-autoscaler-tolerance
    sync_s: float = 15.0  # --horizontal-pod-autoscaler-sync-period
    up_window_s: float = 0.0  # behavior.scaleUp.stabilizationWindowSeconds
    down_window_s: float = 300.0  # behavior.scaleDown.stabilizationWindowSeconds
    up_percent: float = 100.0  # behavior.scaleUp.policies: Percent 100 / 15 s
    up_pods: int = 4  # behavior.scaleUp.policies: Pods 4 / 15 s
    up_period_s: float = 15.0
    down_percent: float = 100.0  # behavior.scaleDown.policies: Percent 100 / 15 s
    down_period_s: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 96

    def validate(self) -> list[str]:
        problems = []
        if not 0.0 < self.target <= 1.0:
            problems.append("target must be in (0, 1]")
        if self.tolerance < 0:
            problems.append("tolerance must not be negative")
        if self.sync_s <= 0 or self.up_period_s <= 0 or self.down_period_s <= 0:
            problems.append("sync and policy periods must be positive")
        if not 1 <= self.min_replicas <= self.max_replicas:
            problems.append("want 1 <= min_replicas <= max_replicas")
        return problems


@dataclass(frozen=True, slots=True)
class HpaState:
    """What the controller remembers between syncs: its recommendations and scale events."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (time s, unstabilised recommendation)
    events: tuple[tuple[float, int], ...] = ()  # (time s, replicas added (+) or removed (-))


def recommend(ready: int, unready: int, utilisation: float, s: HpaSettings) -> int:
    """The replica calculator for a utilisation metric of the ready pods (``GetResourceReplicas``
    with unready pods): the replicas wanted, before behaviour and bounds."""
    current = ready + unready
    if ready == 0:
        return current
    ratio = utilisation / s.target
    if not (unready > 0 and ratio > 1.0):
        if abs(1.0 - ratio) <= s.tolerance:
            return current
        return math.ceil(ratio * ready)
    new_ratio = utilisation * ready / (s.target * current)  # unready pods at 0 %
    if abs(1.0 - new_ratio) <= s.tolerance or new_ratio < 1.0:
        return current
    return max(current, math.ceil(new_ratio * current))


def decide(
    state: HpaState, now_s: float, ready: int, unready: int, utilisation: float, s: HpaSettings
) -> tuple[int, HpaState]:
    """One sync: the replicas to set (``ready + unready`` when nothing changes) and the new
    state (``normalizeDesiredReplicasWithBehaviors``)."""
    current = ready + unready
    wanted = recommend(ready, unready, utilisation, s)
    # Stabilisation: the recommendation is bounded by the min over the scale-up window and the
    # max over the scale-down window (this one included).
    horizon = max(s.up_window_s, s.down_window_s)
    recs = tuple((t, r) for t, r in state.recommendations if t > now_s - horizon)
    up = min([wanted, *(r for t, r in recs if t > now_s - s.up_window_s)])
    down = max([wanted, *(r for t, r in recs if t > now_s - s.down_window_s)])
    stabilised = min(max(current, up), down)
    # Rate policies, relative to the replicas at the start of each policy period.
    desired = stabilised
    if desired > current:
        added = sum(d for t, d in state.events if d > 0 and t > now_s - s.up_period_s)
        removed = -sum(d for t, d in state.events if d < 0 and t > now_s - s.up_period_s)
        start = current - added + removed
        limit = max(math.ceil(start * (1.0 + s.up_percent / 100.0)), start + s.up_pods)
        desired = min(desired, limit, s.max_replicas)
    elif desired < current:
        added = sum(d for t, d in state.events if d > 0 and t > now_s - s.down_period_s)
        removed = -sum(d for t, d in state.events if d < 0 and t > now_s - s.down_period_s)
        start = current - added + removed
        limit = math.floor(start * (1.0 - s.down_percent / 100.0))
        desired = max(desired, limit, s.min_replicas)
    desired = max(s.min_replicas, min(s.max_replicas, desired))
    keep = max(s.up_period_s, s.down_period_s)
    events = tuple((t, d) for t, d in state.events if t > now_s - keep)
    if desired != current:
        events = (*events, (now_s, desired - current))
    return desired, replace(state, recommendations=(*recs, (now_s, wanted)), events=events)
