"""The filter verb's decision: which candidate nodes can host a pod. Pure over the cluster view.

The standby pool is the last resort of a reclaim (Algorithm 1, lines 19-23): while the owner's
pod can be placed on usable devices, here or after evicting borrowers of its lent devices, nodes
that would need standby devices are rejected, so kube-scheduler reclaims the lent devices
(through the preempt verb) instead of spending standby capacity. kube-scheduler runs preemption
only when no node passes the filter, which is why this is decided over all candidate nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from common.model import PodRequest
from extender.clusterstate import ClusterState, NodeState, Signature
from extender.placement import NodePlan, plan_node
from extender.preemption import may_evict, resolvable

NO_INVENTORY = (
    "tidelease: node has no GPU inventory (no GpuNode object; is the node agent running?)"
)
STANDBY_KEPT = (
    "tidelease: standby GPUs are kept for reclaims that the owner's lent or free GPUs cannot meet"
)


@dataclass(slots=True)
class FilterDecision:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # preemption may help
    unresolvable: dict[str, str] = field(default_factory=dict)  # preemption cannot help


def _evaluate(
    nodes: Sequence[tuple[str, NodeState]], req: PodRequest
) -> tuple[FilterDecision, dict[str, NodePlan]]:
    decision = FilterDecision()
    cache: dict[Signature, NodePlan] = {}
    plans: dict[str, NodePlan] = {}
    for name, state in nodes:
        plan = cache.get(state.signature)
        if plan is None:
            plan = cache[state.signature] = plan_node(state.free, req)
        plans[name] = plan
        if plan.fits:
            decision.passed.append(name)
            continue
        allocations = list(state.allocations.values())
        if any(may_evict(a.holder, req) for a in allocations) and resolvable(
            state.devices, allocations, req
        ):
            decision.failed[name] = plan.reason
        else:
            decision.unresolvable[name] = plan.reason
    return decision, plans


def filter_nodes(cluster: ClusterState, req: PodRequest, names: Iterable[str]) -> FilterDecision:
    if req.gpus == 0:
        return FilterDecision(passed=list(names))
    known: list[tuple[str, NodeState]] = []
    missing: dict[str, str] = {}
    for name in names:
        state = cluster.get(name)
        if state is None or not state.has_inventory:
            missing[name] = NO_INVENTORY
        else:
            known.append((name, state))

    decision, _ = _evaluate(known, req)
    if req.reclaim:
        without_standby, plans = _evaluate(known, replace(req, reclaim=False))
        if without_standby.passed or without_standby.failed:
            # The owner's pod fits, or will after evicting borrowers, without the standby pool.
            decision = without_standby
            states = dict(known)
            for name, plan in plans.items():
                needs_standby = not plan.fits and plan_node(states[name].free, req).fits
                if needs_standby and name not in decision.failed:
                    decision.unresolvable[name] = STANDBY_KEPT
    decision.unresolvable.update(missing)
    return decision
