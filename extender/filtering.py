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

from common.model import DeviceClass, PodRequest
from extender.clusterstate import ClusterState, NodeState, Signature
from extender.placement import NodePlan, Verdict, placement_shape, plan_node
from extender.preemption import freeable, resolvable_counts

AGENT_SILENT = "tidelease: node agent silent for too long; its GPUs are not offered"
NO_INVENTORY = (
    "tidelease: node has no GPU inventory (no GpuNode object; is the node agent running?)"
)
LENT_ELSEWHERE = "tidelease: the owner's own lent GPUs are free on another node (right of return)"
STANDBY_KEPT = (
    "tidelease: standby GPUs are kept for reclaims that the owner's lent or free GPUs cannot meet"
)


@dataclass(slots=True)
class FilterDecision:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # preemption may help
    unresolvable: dict[str, str] = field(default_factory=dict)  # preemption cannot help


class _Judge:
    """Per-request memo: a plan per free-device signature, a preemption hint per signature and
    freeable devices, a verdict per device class."""

    def __init__(self, req: PodRequest) -> None:
        self.req = req
        self.plans: dict[Signature, NodePlan] = {}
        self.helps: dict[tuple[Signature, frozenset[tuple[DeviceClass, int]]], bool] = {}
        self.verdicts: dict[DeviceClass, Verdict] = {}

    def __call__(self, state: NodeState) -> tuple[NodePlan, bool]:
        """The plan on this node, and whether evicting lower-priority pods would make it fit."""
        req = self.req
        plan = self.plans.get(state.signature)
        if plan is None:
            plan = self.plans[state.signature] = plan_node(state.free, req, self.verdicts)
        if plan.fits:
            return plan, False
        more = freeable(state.allocations.values(), state.held_classes, req)
        if not more:
            return plan, False
        key = (state.signature, more)
        helps = self.helps.get(key)
        if helps is None:
            helps = self.helps[key] = resolvable_counts(state.free, more, req, self.verdicts)
        return plan, helps


def _shape(req: PodRequest) -> tuple[object, ...]:
    """Everything of a request that filtering depends on (its UID aside, handled apart)."""
    return ("filter", *placement_shape(req), req.pod_priority)


def _evaluate(
    cluster: ClusterState, nodes: Sequence[tuple[str, NodeState]], req: PodRequest
) -> tuple[FilterDecision, dict[str, NodePlan]]:
    decision = FilterDecision()
    judge = _Judge(req)
    memo: dict[int, tuple[NodePlan, bool]] = cluster.memo.setdefault(_shape(req), {})
    plans: dict[str, NodePlan] = {}
    passed, failed, unresolvable = decision.passed, decision.failed, decision.unresolvable
    uid = req.uid
    for name, state in nodes:
        judged: tuple[NodePlan, bool] | None
        if uid in state.allocations:  # the pod's own devices: not a shared answer
            judged = judge(state)
        else:
            judged = memo.get(state.decision_key)
            if judged is None:
                judged = memo[state.decision_key] = judge(state)
        plan, helps = judged
        plans[name] = plan
        if plan.fits:
            passed.append(name)
        elif helps:
            failed[name] = plan.reason
        else:
            unresolvable[name] = plan.reason
    return decision, plans


def filter_nodes(cluster: ClusterState, req: PodRequest, names: Iterable[str]) -> FilterDecision:
    if req.gpus == 0:
        return FilterDecision(passed=list(names))
    known: list[tuple[str, NodeState]] = []
    missing: dict[str, str] = {}
    get = cluster.nodes.get
    for name in names:
        state = get(name)  # type: ignore[call-overload]
        if state is None or not state.has_inventory:
            missing[name] = NO_INVENTORY
        elif state.silent:
            missing[name] = AGENT_SILENT
        else:
            known.append((name, state))

    decision, plans = _evaluate(cluster, known, req)
    if req.reclaim:
        without_standby, strict_plans = _evaluate(cluster, known, replace(req, reclaim=False))
        if without_standby.passed or without_standby.failed:
            # The owner's pod fits, or will after evicting borrowers, without the standby pool.
            with_standby = plans  # memoized per node state, like every plan here
            decision, plans = without_standby, strict_plans
            for name, plan in strict_plans.items():
                needs_standby = not plan.fits and with_standby[name].fits
                if needs_standby and name not in decision.failed:
                    decision.unresolvable[name] = STANDBY_KEPT
        _right_of_return(decision, plans, req)
    decision.unresolvable.update(missing)
    return decision


def _own_share(plan: NodePlan, req: PodRequest) -> float:
    own = sum(n for c, n in plan.take if c.owner is not None and c.owner == req.owner)
    return own / plan.taken if plan.taken else 0.0


def _right_of_return(decision: FilterDecision, plans: dict[str, NodePlan], req: PodRequest) -> None:
    """A reclaim goes where it takes back the most of its own lent devices: nodes that would
    give it fewer are rejected while better ones pass (scores alone could be outweighed by
    kube-scheduler's own plugins)."""
    shares = {name: _own_share(plans[name], req) for name in decision.passed}
    best = max(shares.values(), default=0.0)
    if best <= 0:
        return
    keep = [name for name in decision.passed if shares[name] >= best]
    for name in decision.passed:
        if shares[name] < best:
            decision.unresolvable[name] = LENT_ELSEWHERE
    decision.passed[:] = keep
