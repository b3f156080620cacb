"""The filter verb's decision: which candidate nodes can host a pod. Pure over the cluster view.

The standby pool is the last resort of a reclaim: while the owner's pod can be placed on usable
devices, here or after evicting borrowers of its own lent devices, nodes that would need standby
devices are rejected, so kube-scheduler reclaims the lent devices (through the preempt verb) instead
of spending standby capacity. kube-scheduler runs preemption only when no node passes the filter,
which is why this is decided over all candidate nodes. Evicting other borrowers (of untagged
devices, or of other jobs' lent ones) is not reclaiming: a reclaim's usable devices are the free
ones and the owner's own tagged ones, so where only that would make room, the reclaim takes standby
devices, and evicts such borrowers only when even the standby pool cannot place it.

A pod's ``tidelease.io/gpu-topology`` is judged last, on nodes where the pod fits: the devices
the plan would take there (the tightest group of the plan's classes,
:func:`extender.scheduler.placement.devices_for`) must be joined by that link or closer, else
the node is rejected with the reason (unresolvable: preemption frees devices by count and
class, not by where they sit).

Reference: weflex Algorithm 1 (lines 19-23) (docs/references.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from operator import is_

from common.model import Device, DeviceClass, NodeName, PodRequest
from extender.cluster.state import (
    NO_INVENTORY_KEY,
    SILENT_KEY,
    ClusterState,
    Freeable,
    NodeState,
)
from extender.scheduler.placement import (
    NodePlan,
    Verdict,
    devices_for,
    own_tag,
    placement_shape,
    plan_node,
    remembered_plans,
    topology_refusal,
)
from extender.scheduler.returning import home_reason, home_unoffered_reason, return_homes
from extender.scheduler.victims import freeable, may_evict, resolvable_counts

AGENT_SILENT = "tidelease: node agent silent for too long; its GPUs are not offered"
NO_INVENTORY = (
    "tidelease: node has no GPU inventory (no GpuNode object; is the node agent running?)"
)
KEPT_FOR_KUEUE = (
    "lent GPUs here are kept for a Kueue workload admitted against them until its pods are "
    "placed (docs/kueue.md)"
)
LENT_ELSEWHERE = "tidelease: the owner's own lent GPUs are free on another node (right of return)"
STANDBY_KEPT = (
    "tidelease: standby GPUs are kept for reclaims that the owner's lent or free GPUs cannot meet"
)
STANDBY_ELSEWHERE = (
    "tidelease: more of the standby GPUs a reclaim needs, or better ones, are on another node"
)
RECLAIM_OWN_FIRST = (
    "tidelease: a reclaim evicts the borrowers of the owner's own lent GPUs, not others, "
    "while it can"
)


@dataclass(slots=True)
class FilterDecision:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # preemption may help
    unresolvable: dict[str, str] = field(default_factory=dict)  # preemption cannot help


Judged = tuple[NodePlan, bool]  # the plan, and whether evicting lower-priority pods helps


class _Judge:
    """Judges nodes for one request. Remembered across requests of the same placement shape
    (all that a judgement depends on, with the node's free devices and what evictions would
    free): a plan per free-device state (shared with prioritize) and a judgement per free-device
    state and freeable devices. Per request: a verdict per device class."""

    def __init__(self, cluster: ClusterState, req: PodRequest) -> None:
        self.req = req
        self.plans = remembered_plans(cluster.memo, req)
        # by free_key, or (free_key, freeable) where evictions would free something; one tuple
        # per entry, handed out again (a cold request allocates next to nothing)
        self.judged: dict[int | tuple[int, Freeable], Judged] = cluster.memo.setdefault(
            ("judged", *placement_shape(req)), {}
        )
        self.verdicts: dict[DeviceClass, Verdict] = {}

    def __call__(
        self, state: NodeState, holds_devices: bool, barred: Mapping[DeviceClass, int] | None = None
    ) -> Judged:
        """The plan on this node, and whether evicting lower-priority pods would make it fit.
        ``holds_devices``: the pod holds devices on this node (it never evicts itself);
        ``barred``: free devices here it may not take (kept for a Kueue workload of another
        owner, common/keptmarks.py)."""
        req = self.req
        if holds_devices or barred:
            return self._apart(state, holds_devices, barred or {})
        free_key = state.free_key
        plan = self.plans.get(free_key)
        if plan is None:
            plan = self.plans[free_key] = plan_node(state.free, req, self.verdicts)
        more: Freeable = frozenset()
        if not plan.fits:
            more = state.freeable(req.pod_priority)
        key = (free_key, more) if more else free_key
        judged = self.judged.get(key)
        if judged is None:
            helps = bool(more) and resolvable_counts(state.free, more, req, self.verdicts)
            judged = self.judged[key] = (plan, helps)
        return judged

    def _apart(
        self, state: NodeState, holds_devices: bool, barred: Mapping[DeviceClass, int]
    ) -> Judged:
        """A node judged for this pod alone. Where it already holds devices (a bind of it
        that wrote the ledger and did not finish: the extender killed between the two, or the
        Binding refused), those are its: it is judged on the free ones and its own (the bind
        takes its allocation again, :meth:`extender.scheduler.binding.Binder.bind`), never on
        the free ones alone, which would leave it unschedulable beside its own reservation
        until the reaper drops it, with nothing to make kube-scheduler try it again. Free
        devices ``barred`` to it are not counted. Not remembered: the answer is this pod's."""
        req = self.req
        free = Counter(state.free)
        if holds_devices:
            free.update(state.held_classes.get(req.uid, ()))
        free.subtract(barred)
        free = +free  # counts of zero and below dropped
        plan = plan_node(free, req, self.verdicts)
        if plan.fits:
            return (plan, False)
        if barred:
            plan = replace(plan, reason=f"{plan.reason}; {KEPT_FOR_KUEUE}")
        more = freeable(state.allocations.values(), state.held_classes, req)
        return (plan, bool(more) and resolvable_counts(free, more, req, self.verdicts))


def _shape(req: PodRequest) -> tuple[object, ...]:
    """Everything of a request that filtering depends on (its UID aside, handled apart)."""
    return ("filter", *placement_shape(req), req.pod_priority)


# A node's answer within a pass (_evaluate): passes, fails (preemption may help), fails for
# good, or is left out (not offered); and the reason. Every node that passes gets _PASS itself.
PASSED, FAILED, UNRESOLVABLE, LEFT_OUT = 0, 1, 2, 3
Answer = tuple[int, str]
_PASS: Answer = (PASSED, "")


def _answer(judged: Judged) -> Answer:
    plan, helps = judged
    if plan.fits:
        return _PASS
    return (FAILED if helps else UNRESOLVABLE, plan.reason)


def _evaluate(
    cluster: ClusterState,
    names: Iterable[str],
    req: PodRequest,
    *,
    keep_plans: bool,
    now: float | None = None,
) -> tuple[FilterDecision, dict[str, NodePlan], dict[str, str]]:
    """The decision over the nodes that offer devices; with ``keep_plans`` the plan per such
    node; the reason for each node that offers none (left out of the decision).

    Without plans to keep or a topology to judge (most requests), each node's answer is looked
    up by its decision key (``ClusterState.decision_keys``) in the answers remembered for the
    request's shape, in passes the interpreter runs in C; a node whose key has none yet, and the
    nodes where the pod holds devices or devices are kept for Kueue, are judged one by one
    (:class:`_Evaluation`), as every node is otherwise."""
    evaluation = _Evaluation(cluster, req, keep_plans=keep_plans, now=now)
    if keep_plans or evaluation.refusals is not None:
        for name in names:
            evaluation.add(name, evaluation.node(name))
        return evaluation.decision, evaluation.plans, evaluation.missing
    names = names if isinstance(names, list | tuple) else list(names)
    answers = evaluation.remembered
    found: list[Answer | None] = list(map(answers.get, map(cluster.decision_keys.get, names)))
    apart = cluster.holds_on(req.uid)
    if now is not None:
        apart |= cluster.kept_nodes
    if apart or None in found:
        for i, name in enumerate(names):
            if found[i] is None or name in apart:
                found[i] = evaluation.node(name)
    evaluation.decision.passed.extend(compress(names, map(is_, found, repeat(_PASS))))
    for name, answer in zip(names, found, strict=True):
        if answer is not _PASS:
            evaluation.add(name, answer)  # type: ignore[arg-type]
    return evaluation.decision, evaluation.plans, evaluation.missing


class _Evaluation:
    """One filter pass for one request: the decision so far, and each node's answer."""

    def __init__(
        self, cluster: ClusterState, req: PodRequest, *, keep_plans: bool, now: float | None
    ) -> None:
        self.cluster, self.req, self.keep_plans, self.now = cluster, req, keep_plans, now
        self.decision = FilterDecision()
        self.plans: dict[str, NodePlan] = {}
        self.missing: dict[str, str] = {}
        self.judge = _Judge(cluster, req)
        shape = _shape(req)
        self.memo: dict[int, Judged] = cluster.memo.setdefault(shape, {})
        # The answer per decision key, for nodes judged by their key alone; the keys of nodes
        # not offered, and of nodes not known (None), are answered from the start.
        self.remembered: dict[int | None, Answer] = cluster.memo.setdefault(("answer", shape), {})
        if not self.remembered:
            self.remembered.update(
                {
                    None: (LEFT_OUT, NO_INVENTORY),
                    NO_INVENTORY_KEY: (LEFT_OUT, NO_INVENTORY),
                    SILENT_KEY: (LEFT_OUT, AGENT_SILENT),
                }
            )
        # tidelease.io/gpu-topology, for pods of 2+ GPUs: the refusal ("" none) per group_key
        self.refusals: dict[int, str] | None = None
        if req.gpu_topology is not None and req.gpus >= 2:
            self.refusals = cluster.memo.setdefault(("topology", *placement_shape(req)), {})

    def node(self, name: str) -> Answer:
        """The node's answer, judged (remembered by its decision key where the answer depends
        on nothing else); its plan kept, with ``keep_plans``."""
        req, now = self.req, self.now
        state = self.cluster.nodes.get(name)  # type: ignore[call-overload]
        if state is None or not state.has_inventory:
            return (LEFT_OUT, NO_INVENTORY)
        if state.silent:
            return (LEFT_OUT, AGENT_SILENT)
        uid = req.uid
        judged: Judged | None
        barred = state.barred_for(req, now) if now is not None and state.kept.devices else None
        if uid in state.allocations or barred:  # the pod's own devices or bars: its answer
            judged = self.judge(state, uid in state.allocations, barred)
        else:
            judged = self.memo.get(state.decision_key)
            if judged is None:
                judged = self.memo[state.decision_key] = self.judge(state, False)
            if self.refusals is None:
                self.remembered[state.decision_key] = _answer(judged)
        plan, _ = judged
        if self.keep_plans:
            self.plans[name] = plan
        if self.refusals is not None and plan.fits:
            if uid in state.allocations or barred:  # free devices of its own: not remembered
                refusal = _topology_refusal(state, plan, req, now)
            elif state.group_key == 0:  # no topology: refused the same way on every such node
                refusal = topology_refusal(req, range(plan.taken), None)
            else:
                found = self.refusals.get(state.group_key)
                if found is None:
                    found = self.refusals[state.group_key] = _topology_refusal(
                        state, plan, req, None
                    )
                refusal = found
            if refusal:
                self.plans.pop(name, None)
                return (UNRESOLVABLE, refusal)
        return _answer(judged)

    def add(self, name: str, answer: Answer) -> None:
        kind, reason = answer
        if kind == PASSED:
            self.decision.passed.append(name)
        elif kind == FAILED:
            self.decision.failed[name] = reason
        elif kind == UNRESOLVABLE:
            self.decision.unresolvable[name] = reason
        else:
            self.missing[name] = reason


def _topology_refusal(state: NodeState, plan: NodePlan, req: PodRequest, now: float | None) -> str:
    """Why the devices the plan takes here miss the pod's tidelease.io/gpu-topology ("": they
    meet it): the free devices are those bind would see (``now``: Kueue's kept marks too)."""
    taken = set(state.unavailable_to(req, now) if now is not None else state.taken_for(req.uid))
    free: list[Device] = [d for d in state.devices if d.uuid not in taken]
    chosen = devices_for(plan, free, state.topology)
    return topology_refusal(req, [d.index for d in chosen], state.topology)


def filter_nodes(
    cluster: ClusterState, req: PodRequest, names: Iterable[str], *, now: float | None = None
) -> FilterDecision:
    """Which of ``names`` can host the pod. ``now``: the time (epoch seconds) the GpuNodes'
    kept marks are judged at (common/keptmarks.py); None: marks are not looked at (the
    simulator, which runs no Kueue)."""
    if req.gpus == 0:
        return FilterDecision(passed=list(names))
    if req.reclaim:
        names = list(names)  # evaluated twice
    decision, plans, missing = _evaluate(cluster, names, req, keep_plans=req.reclaim, now=now)
    if req.reclaim:
        plain = replace(req, reclaim=False)
        without_standby, strict_plans, _ = _evaluate(
            cluster, names, plain, keep_plans=True, now=now
        )
        own = own_resolvable(cluster, without_standby.failed, plain)
        if without_standby.passed or own:
            # The owner's pod fits without the standby pool, or will after evicting the
            # borrowers of its own lent devices.
            with_standby = plans  # memoized per node state, like every plan here
            decision, plans = without_standby, strict_plans
            for name in [n for n in decision.failed if n not in own]:
                decision.unresolvable[name] = RECLAIM_OWN_FIRST
                del decision.failed[name]
            for name, plan in strict_plans.items():
                needs_standby = not plan.fits and with_standby[name].fits
                if needs_standby and name not in decision.failed:
                    decision.unresolvable[name] = STANDBY_KEPT
        _right_of_return(decision, plans, req)
        _home_only(decision, req, return_homes(cluster, req))
    decision.unresolvable.update(missing)
    return decision


def _home_only(decision: FilterDecision, req: PodRequest, homes: frozenset[NodeName]) -> None:
    """A returning pod whose lent devices can come back goes there and nowhere else
    (extender.scheduler.returning): every other node is rejected as unresolvable, so
    kube-scheduler places it there, preempts the borrowers there, or lets it wait there while
    their eviction (the leasing controller's, after its notice) runs its course, even where
    no preemption could help there now: preempting borrowers elsewhere would evict them for
    nothing, without notice.

    Where kube-scheduler offered none of those nodes, its own filters turned them down: most
    often its resource fit, which counts a borrower being evicted there until it is gone. The
    pod still waits (every node offered is rejected; the borrower's deletion makes
    kube-scheduler try it again), until the reclaim is overdue (the lease Degraded
    ReclaimOverdue): from then on it takes what kube-scheduler offers, a stand-in rather than
    no place at all (a home node cordoned or tainted for good)."""
    judged = (*decision.passed, *decision.failed, *decision.unresolvable)
    if not any(h in judged for h in homes):
        if homes and not req.reclaim_overdue:
            reason = home_unoffered_reason(homes)
            for name in [*decision.passed, *decision.failed]:
                decision.unresolvable[name] = reason
            decision.passed.clear()
            decision.failed.clear()
        return
    reason = home_reason(req, homes)
    for name in [*decision.passed, *decision.failed]:
        if name not in homes:
            decision.unresolvable[name] = reason
    decision.passed[:] = [n for n in decision.passed if n in homes]
    for name in [n for n in decision.failed if n not in homes]:
        del decision.failed[name]


def own_resolvable(cluster: ClusterState, names: Iterable[str], req: PodRequest) -> set[str]:
    """Of these nodes, those where the owner's pod fits once the pods borrowing its own lent
    devices are evicted (all their devices freed), other pods staying.

    The answer on a node depends on its free devices and, per other pod, on its priority, pod
    priority and the classes of the devices it holds: all of it in the node's ``decision_key``.
    So it is remembered per request shape and decision key in the cluster view's memo, as the
    filter's judgements are; a node where the pod itself holds devices (it is never its own
    victim) is answered afresh."""
    owner = req.owner
    out: set[str] = set()
    if owner is None:
        return out
    memo: dict[int, bool] = cluster.memo.setdefault(_own_shape(req), {})
    verdicts: dict[DeviceClass, Verdict] = {}
    uid = req.uid
    get = cluster.nodes.get
    for name in names:
        state = get(name)  # type: ignore[call-overload]
        if state is None:
            continue
        fits: bool | None
        if uid in state.allocations:
            fits = _own_resolvable(state, req, verdicts)
        else:
            fits = memo.get(state.decision_key)
            if fits is None:
                fits = memo[state.decision_key] = _own_resolvable(state, req, verdicts)
        if fits:
            out.add(name)
    return out


def _own_shape(req: PodRequest) -> tuple[object, ...]:
    """Everything of a request that :func:`_own_resolvable` depends on (its UID aside)."""
    return ("own", *placement_shape(req), req.pod_priority)


def _own_resolvable(
    state: NodeState, req: PodRequest, verdicts: dict[DeviceClass, Verdict]
) -> bool:
    counts: Counter[DeviceClass] = Counter()
    for a in state.allocations.values():
        classes = state.held_classes.get(a.holder.pod_uid, ())
        if may_evict(a.holder, req) and any(own_tag(c, req) for c in classes):
            counts.update(classes)
    if not counts:
        return False
    free: Mapping[DeviceClass, int] = state.free
    if req.uid in state.allocations:  # its own reservation is its own (_Judge._holding)
        free = Counter(state.free)
        free.update(state.held_classes.get(req.uid, ()))
    return resolvable_counts(free, counts.items(), req, verdicts)


def return_share(plan: NodePlan, req: PodRequest) -> tuple[float, float, float]:
    """Of the devices the plan takes: the share that are the owner's own lent ones, then the
    share from the standby pool (the rest are other devices: a stand-in takes as few as it
    can), then their mean tier (a stand-in replaces lent devices that cannot come back, so it
    takes the best tiers it can: equal or better, FETCHSTANDBY(k, r) of weflex Algorithm 1)."""
    if not plan.taken:
        return (0.0, 0.0, 0.0)
    own = sum(n for c, n in plan.take if own_tag(c, req))
    tiers = sum(int(c.tier) * n for c, n in plan.take)
    return (own / plan.taken, plan.standby_used / plan.taken, tiers / plan.taken)


def _right_of_return(decision: FilterDecision, plans: dict[str, NodePlan], req: PodRequest) -> None:
    """A reclaim goes where it takes back the most of its own lent devices, and where it needs
    standby devices, where it takes the most of them, of the best tiers: nodes that would give
    it less are rejected while better ones pass (scores alone could be outweighed by
    kube-scheduler's own plugins)."""
    shares = {name: return_share(plans[name], req) for name in decision.passed}
    best = max(shares.values(), default=(0.0, 0.0, 0.0))
    if best[:2] <= (0.0, 0.0):
        return
    keep = [name for name in decision.passed if shares[name] >= best]
    for name in decision.passed:
        if shares[name] < best:
            decision.unresolvable[name] = LENT_ELSEWHERE if best[0] > 0 else STANDBY_ELSEWHERE
    decision.passed[:] = keep
