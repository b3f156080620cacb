"""A gang's pods placed one after another without two of them counting on the same devices.

kube-scheduler places a gang's pods one at a time and, with the Workload API's gang scheduling,
holds each at Permit until every member has a place; only then does it bind them (the
extender's bind verb, which writes the ledger). So while the members are being placed, none of
them is in the ledger, and without more the extender's filter would offer the next member the
devices it has just offered the previous one: kube-scheduler's own count of ``nvidia.com/gpu``
stops an over-full node, not two members planned onto the same lent devices (the ones a
borrower may use, where other free devices of the node are standby, or tagged for a reclaim).

So the filter answers a gang's pod with one node, the one it would score best, and holds the
devices it would take there for the pod (:meth:`extender.cluster.state.ClusterState.reserve`):
in memory, counted as taken for every other pod's filter, score, preemption and bind; kube-
scheduler, with one node left, places the pod there. The bind writes the held devices to the
ledger. The hold ends when the pod is bound (the ledger has it), gone, filtered again without
its node among the candidates, or after ``gang_reserve_ttl_s`` (the upstream gang's own wait at
Permit is five minutes). A held node is the pod's own on a later filter (it passes there on its
own devices, extender.scheduler.filtering), so a retried member finds its place again.

Only gang pods (common.gangs) are answered so; every other pod is placed as before.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from common.model import Allocation, NodeName, PodRequest
from extender.cluster.state import ClusterState
from extender.scheduler.filtering import FilterDecision
from extender.scheduler.placement import pick_devices
from extender.scheduler.scoring import ScoreWeights, prioritize_nodes


def held_elsewhere(node: str) -> str:
    return f"tidelease: a gang's pod goes where its GPUs are held for it (node {node})"


def hold_for_gang(
    cluster: ClusterState,
    req: PodRequest,
    decision: FilterDecision,
    weights: ScoreWeights,
    *,
    now: float,
    ttl_s: float,
) -> FilterDecision:
    """The filter's ``decision`` for a gang pod narrowed to one node, its devices held for the
    pod there until monotonic ``now + ttl_s``; unchanged where nothing passed (a hold the pod
    had is dropped then: it is placed nowhere now)."""
    held = cluster.reservation(req.uid)
    if not decision.passed:
        if held is not None:
            cluster.unreserve(req.uid)
        return decision
    chosen: str
    if held is not None and held[0] in decision.passed:
        chosen = str(held[0])
        # still held: its time runs from this answer
        cluster.reserve(held[0], held[1], now + ttl_s)
    else:
        chosen = _best(cluster, req, decision.passed, weights)
        state = cluster.get(chosen)
        if state is None:
            return decision
        taken = state.unavailable_to(req, time.time())
        plan, devices = pick_devices(state.devices, taken, req, state.topology)
        if not plan.fits:  # the filter said it fits: nothing changed in between (one loop)
            return decision
        since = datetime.now(UTC).isoformat()
        allocation = Allocation(req.holder(), tuple(d.uuid for d in devices), since)
        cluster.reserve(NodeName(chosen), allocation, now + ttl_s)
    reason = held_elsewhere(chosen)
    for name in decision.passed:
        if name != chosen:
            decision.unresolvable[name] = reason
    decision.passed[:] = [chosen]
    return decision


def _best(cluster: ClusterState, req: PodRequest, names: list[str], weights: ScoreWeights) -> str:
    """The node the extender scores best for the pod; the first by name among equals."""
    scores = prioritize_nodes(cluster, req, names, weights)
    return min(scores, key=lambda ns: (-ns[1], ns[0]))[0]
