"""Node scores for the prioritize verb (0-10, kube-scheduler's MaxExtenderPriority). Pure.

A score is a weighted sum of four parts, each in [0, 1]:

* cache — the node holds the pod's checkpoint and/or images: a pod that loads locally restarts
  in seconds instead of minutes;
* return — for a high-priority pod, the share of its devices that carry its own tag (the owner
  gets the same devices back); for a borrower, the share that is untagged (fewer evictions later);
* reliability — best fit: devices whose tier is just what the pod asked for, keeping higher
  tiers free for pods that need them;
* packing — how full the node is after placement, keeping whole nodes free for large pods.

Then a tie-break below them all, for a pod of 2+ GPUs on a node that publishes its topology:
the tightness of the devices it would take there (:func:`common.topology.tightness` of the
group :func:`extender.scheduler.placement.devices_for` picks, 0 to 1) adds up to
:data:`TOPOLOGY_NUDGE` of a point before rounding. Less than one point, it lifts a node by one
point at most: past nodes of the same score, never past one that scored higher without it (at
most level with it). A whole-point score (the usual) is lifted by a group joined by NVLink or
one PCIe switch (tightness 2/3 or more), not by a looser one. kube-scheduler's 0-10 scale has
no room for a stricter tie-break. Nodes without topology, and pods of one GPU, keep their
scores exactly.

Reference: weflex 3.3, Algorithm 1 (PICKGPUS) (docs/references.md).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from common import topology as topo
from common.model import NodeCache, PodRequest, Priority, Tier
from extender.cluster.state import NO_INVENTORY_KEY, SILENT_KEY, ClusterState, NodeState
from extender.scheduler.placement import (
    NodePlan,
    group_for,
    own_tag,
    placement_shape,
    plan_node,
    remembered_plans,
)


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    cache: float = 4.0
    ownership: float = 3.0
    reliability: float = 1.0
    packing: float = 2.0

    @property
    def total(self) -> float:
        return self.cache + self.ownership + self.reliability + self.packing


MAX_SCORE = 10
# Of a point, the most a group's tightness adds to a score before rounding (a tie-break: < 1).
TOPOLOGY_NUDGE = 0.75
_TIER_SPAN = int(Tier.HA) - int(Tier.LA)


def cache_part(cache: NodeCache, req: PodRequest) -> float:
    """1.0 when the node holds everything the pod loads; checkpoint counts 60 %, images 40 %."""
    wants_ckpt = req.checkpoint is not None
    wants_images = bool(req.images)
    if not wants_ckpt and not wants_images:
        return 0.0
    ckpt = 1.0 if wants_ckpt and req.checkpoint in cache.checkpoints else 0.0
    images = len(req.images & cache.images) / len(req.images) if wants_images else 0.0
    if not wants_images:
        return ckpt
    if not wants_ckpt:
        return images
    return 0.6 * ckpt + 0.4 * images


def plan_parts(
    plan: NodePlan, req: PodRequest, node_devices: int, free_after: int
) -> tuple[float, float, float]:
    """(return, reliability, packing) parts of a fitting plan."""
    taken = plan.taken
    if taken == 0 or node_devices == 0:
        return (0.0, 0.0, 0.0)
    if req.priority is Priority.HIGH:
        good = sum(n for c, n in plan.take if own_tag(c, req))
    else:
        good = sum(n for c, n in plan.take if c.owner is None and not c.standby)
    ownership = good / taken
    excess = sum((int(c.tier) - int(req.min_tier)) * n for c, n in plan.take) / taken
    reliability = 1.0 - excess / _TIER_SPAN
    packing = 1.0 - free_after / node_devices
    return (ownership, reliability, packing)


Parts = tuple[float, float, float]


def fit_parts(plan: NodePlan, req: PodRequest, node_devices: int, node_free: int) -> Parts | None:
    """:func:`plan_parts` of a plan on a node with these devices, or None where it does not fit:
    all of a score that depends on the node's devices."""
    if not plan.fits:
        return None
    return plan_parts(plan, req, node_devices, max(0, node_free - plan.taken))


def weighted(
    parts: Parts | None,
    cache: NodeCache,
    req: PodRequest,
    weights: ScoreWeights,
    tightness: float | None = None,
) -> int:
    """The score from :func:`fit_parts` and the node's cache; ``tightness`` (0 to 1) of the
    group the pod would take, where the node publishes its topology: the tie-break."""
    if parts is None:
        return 0
    ownership, reliability, packing = parts
    total = (
        weights.cache * cache_part(cache, req)
        + weights.ownership * ownership
        + weights.reliability * reliability
        + weights.packing * packing
    )
    if weights.total <= 0:
        return 0
    # Round half up (not to even): a half-point edge must not vanish on one side only.
    nudge = 0.0 if tightness is None else TOPOLOGY_NUDGE * tightness
    return max(0, min(MAX_SCORE, math.floor(MAX_SCORE * total / weights.total + 0.5 + nudge)))


def group_tightness(state: NodeState, plan: NodePlan) -> float | None:
    """How tight the group the plan takes on this node is (0 to 1); None where it does not
    fit or the node publishes no topology."""
    if not plan.fits or state.topology is None:
        return None
    group = group_for(plan, state.free_devices, state.topology)
    return topo.tightness(topo.group_score(topo.link_table(state.topology), group), len(group))


def score(
    plan: NodePlan,
    cache: NodeCache,
    req: PodRequest,
    *,
    node_devices: int,
    node_free: int,
    weights: ScoreWeights,
) -> int:
    """The node's score, 0 for a node the pod does not fit."""
    return weighted(fit_parts(plan, req, node_devices, node_free), cache, req, weights)


def prioritize_nodes(
    cluster: ClusterState, req: PodRequest, names: Iterable[str], weights: ScoreWeights
) -> list[tuple[str, int]]:
    """A score for every candidate node; nodes without inventory or room score 0.

    Remembered across requests: the score per node state (score_key) for requests of the same
    shape, and, for all requests of the same placement shape whatever they load (checkpoint,
    images), the plan and :func:`fit_parts` per free-device state (free_key: the free devices
    and the number of devices, all that fit_parts depends on). For a pod of 2+ GPUs on a node
    with topology, the group's tightness per group_key (the topology and which devices are
    free), and the score per (score_key, group_key).

    Each node's score is looked up by its key (``ClusterState.score_keys``, or
    ``group_score_keys`` for a pod of 2+ GPUs) in passes the interpreter runs in C; only the
    nodes whose key has no score yet are scored one by one (:class:`_Scoring`)."""
    names = names if isinstance(names, list | tuple) else list(names)
    if req.gpus == 0:
        return [(name, 0) for name in names]
    scoring = _Scoring(cluster, req, weights)
    index = cluster.group_score_keys if scoring.tight_of is not None else cluster.score_keys
    values: list[int | None] = list(map(scoring.memo.get, map(index.get, names)))
    if None in values:
        for i, name in enumerate(names):
            if values[i] is None:
                values[i] = scoring.node(name)
    return list(zip(names, values, strict=True))  # type: ignore[arg-type]


class _Scoring:
    """The scores of one request shape, remembered by state key; a node scored by its state."""

    def __init__(self, cluster: ClusterState, req: PodRequest, weights: ScoreWeights) -> None:
        self.cluster, self.req, self.weights = cluster, req, weights
        shape = ("score", *placement_shape(req), req.checkpoint, req.images, weights)
        self.memo: dict[Hashable, int] = cluster.memo.setdefault(shape, {})
        if not self.memo:  # nodes not offered (their index keys), and nodes not known
            self.memo.update({None: 0, NO_INVENTORY_KEY: 0, SILENT_KEY: 0})
        self.tight_of: dict[int, float | None] | None = None
        if req.gpus >= 2:
            self.tight_of = cluster.memo.setdefault(("tightness", *placement_shape(req)), {})
        self.plans = remembered_plans(cluster.memo, req)
        self.parts_of: dict[int, Parts | None] = cluster.memo.setdefault(
            ("fit_parts", *placement_shape(req)), {}
        )

    def node(self, name: str) -> int:
        state = self.cluster.nodes.get(name)  # type: ignore[call-overload]
        if state is None or not state.offering:
            return 0
        req, plans, tight_of = self.req, self.plans, self.tight_of
        group = state.group_key if tight_of is not None else 0
        key: Hashable = (state.score_key, group) if group else state.score_key
        value = self.memo.get(key)
        if value is None:
            free_key = state.free_key
            if free_key in self.parts_of:
                parts = self.parts_of[free_key]
            else:
                parts = self.parts_of[free_key] = fit_parts(
                    _plan(plans, state, req), req, len(state.devices), state.free_total
                )
            tightness: float | None = None
            if group and tight_of is not None and parts is not None:
                if group in tight_of:
                    tightness = tight_of[group]
                else:
                    plan = _plan(plans, state, req)
                    tightness = tight_of[group] = group_tightness(state, plan)
            value = self.memo[key] = weighted(parts, state.cache, req, self.weights, tightness)
        return value


def _plan(plans: dict[int, NodePlan], state: NodeState, req: PodRequest) -> NodePlan:
    """The plan for the node's free devices, remembered by free-device state."""
    plan = plans.get(state.free_key)
    if plan is None:
        plan = plans[state.free_key] = plan_node(state.free, req)
    return plan
