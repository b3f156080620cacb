"""kube-scheduler's cycle for one GPU pod, as it runs with the tidelease extender. Pure.

filter (:func:`extender.scheduler.filtering.filter_nodes`) -> prioritize
(:func:`extender.scheduler.scoring.prioritize_nodes`) -> the best score among the nodes that
passed, ties by name (as :class:`extender.scheduler.driver.SchedulerDriver` picks) -> bind: the
devices of :func:`extender.scheduler.placement.pick_devices`, recorded in the node's ledger.

When no node passes, high-priority pods preempt as kube-scheduler's DefaultPreemption does: from
a random node (seeded), it collects the nodes the filter marked as resolvable by eviction
(``FailedNodes``) until it has ``max(10 % of the nodes, 100)`` candidates, asks the extender's
preempt (:func:`extender.scheduler.victims.choose_victims` per node), evicts the victims of the
node with the fewest (ties by name) and runs the cycle once more.

Three shortcuts keep a two-week run of 10,000 GPUs fast, none changing an answer:

* The filter is asked only about nodes with at least as many free healthy devices as the pod
  wants (no other node can pass: every device a plan takes is free and healthy), outside the
  standby pool unless the pod is a reclaim (no other pod's plan takes a standby device); the rest
  of the nodes matter only for preemption, which walks them as kube-scheduler does. The
  statistics count the filter calls of the unabridged cycle (one per cycle with a node of enough
  free healthy devices).
* A pod that is no reclaim passes or not on a node, and scores there, whatever the other nodes
  are; its candidates are scored first and the filter asked about the best (it nearly always
  passes), not about every candidate.
* A reclaim pod (``ClusterState.with_reclaim``: its owner's lease is reclaiming) is filtered
  over those nodes and the nodes with devices tagged with its owner: the filter keeps the
  standby pool only while the pod passes without it, or could after evicting the borrowers of
  its owner's lent devices, and neither can happen on any other node; for preemption the
  latter are looked for among the tagged nodes only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from common.model import Device, Holder, NodeName, PodRequest
from extender.leasingsim.world import SimCluster
from extender.scheduler.filtering import filter_nodes, own_resolvable
from extender.scheduler.placement import (
    pick_planned,
    placement_shape,
    plan_node,
    remembered_plans,
)
from extender.scheduler.scoring import ScoreWeights, prioritize_nodes
from extender.scheduler.victims import choose_victims

Evict = Callable[[Holder], object]
Victims = tuple[int, tuple[Holder, ...] | None]  # at a node version, choose_victims' answer
VICTIMS_KEPT = 200_000


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    # DefaultPreemption's minCandidateNodesPercentage and minCandidateNodesAbsolute
    candidates_percent: int = 10
    candidates_min: int = 100


@dataclass(frozen=True, slots=True)
class Placement:
    node: NodeName
    devices: tuple[Device, ...]
    evicted: tuple[Holder, ...] = ()


@dataclass(slots=True)
class SchedulerStats:
    placed: int = 0
    unschedulable: int = 0
    preemptions: int = 0
    filter_calls: int = 0
    choose_victims_calls: int = 0


class Scheduler:
    def __init__(self, world: SimCluster, settings: SchedulerSettings, rng: random.Random) -> None:
        self.world = world
        self.settings = settings
        self.rng = rng
        self.stats = SchedulerStats()
        # victims per request shape, per node, at a node version: choose_victims is pure in the
        # node's devices and ledger, which the version identifies (versions only grow, so an
        # answer at an older one is never asked again: only the latest is kept). All of it is
        # forgotten once ``VICTIMS_KEPT`` answers were remembered, counting the replaced ones.
        self._victims: dict[tuple[object, ...], dict[NodeName, Victims]] = {}
        self._remembered = 0

    def place(
        self,
        req: PodRequest,
        *,
        within: Collection[NodeName] | None = None,
        evict: Evict | None = None,
    ) -> Placement | None:
        """Schedule and bind one pod; ``within``: the only nodes it may go to (a node affinity);
        ``evict``: how to evict a victim (``None``: the pod never preempts)."""
        req = self.world.state.with_reclaim(req)  # as the extender's every verb does
        universe = self._universe(req, within)
        placed = self._cycle(req, universe, within)
        if placed is not None or evict is None:
            if placed is None:
                self.stats.unschedulable += 1
            return placed
        chosen = self._preempt(req, universe)
        if chosen is None:
            self.stats.unschedulable += 1
            return None
        self.stats.preemptions += 1
        for victim in chosen:
            evict(victim)
        placed = self._cycle(req, universe, within)
        if placed is None:
            self.stats.unschedulable += 1
            return None
        return Placement(placed.node, placed.devices, chosen)

    # --- the scheduling cycle ---
    def _universe(self, req: PodRequest, within: Collection[NodeName] | None) -> list[NodeName]:
        nodes = self.world.nodes_of(req.gpu_type)
        if within is None:
            return nodes
        return [n for n in nodes if n in within]

    def _candidates(self, req: PodRequest, within: Collection[NodeName] | None) -> list[NodeName]:
        """The nodes the pod may pass on: with enough free healthy devices, outside the standby
        pool unless it is a reclaim (the only pod a standby device is usable to)."""
        world = self.world
        if req.reclaim:
            nodes = world.with_free(req.gpus, req.gpu_type)
        else:
            nodes = world.with_open(req.gpus, req.gpu_type)
        if within is None:
            return nodes
        return [n for n in nodes if n in within]

    def _filter(self, req: PodRequest, names: Sequence[NodeName]) -> tuple[list[str], list[str]]:
        self.stats.filter_calls += 1
        d = filter_nodes(self.world.state, req, names)
        return d.passed, list(d.failed)

    def passed(
        self, req: PodRequest, universe: Sequence[NodeName], within: Collection[NodeName] | None
    ) -> list[str]:
        """The nodes ``filter_nodes`` passes for this pod, asking it only what can pass."""
        cands = self._candidates(req, within)
        if req.reclaim:
            own = self.world.tagged_nodes(req.owner)
            if within is not None:
                own = [n for n in own if n in within]
            if req.gpu_type is not None:
                own = [n for n in own if self.world.specs[n].gpu_type == req.gpu_type]
            cands = sorted(set(cands).union(own))
        elif not cands and self._asks(req, within):
            # Free devices, but all in the standby pool: the filter would be asked (and counted)
            # and pass none of them.
            self.stats.filter_calls += 1
            return []
        if not cands:
            return []
        return self._filter(req, cands)[0]

    def _asks(self, req: PodRequest, within: Collection[NodeName] | None) -> bool:
        """Whether some node (of ``within``) has ``req.gpus`` free healthy devices, standby ones
        included: whether the filter is asked about the pod at all (its counted calls do not
        depend on which of those nodes are left out as sure to fail)."""
        if within is None:
            return self.world.any_free(req.gpus, req.gpu_type)
        return any(n in within for n in self.world.with_free(req.gpus, req.gpu_type))

    def _best(
        self, req: PodRequest, universe: Sequence[NodeName], within: Collection[NodeName] | None
    ) -> NodeName | None:
        """The node the pod is bound to: of the nodes the filter passes, the best score, ties
        by name; None where none passes.

        For a pod that is no reclaim, whether a node passes and its score are the node's own
        (a reclaim's filter weighs the nodes against each other), so the candidates are scored
        first and the filter asked about the best of them: where it passes (nearly always: it
        is a candidate for its free devices), it is the best that passes, without asking about
        every candidate; where not, the filter is asked about all of them. Counted as one
        filter call either way."""
        weights = self.settings.weights
        state = self.world.state
        if req.reclaim or req.gpus <= 0:
            passed = self.passed(req, universe, within)
        else:
            cands = self._candidates(req, within)
            if not cands:
                if self._asks(req, within):  # free devices, but all standby: none would pass
                    self.stats.filter_calls += 1
                return None
            self.stats.filter_calls += 1
            scores = prioritize_nodes(state, req, cands, weights)
            top = max(v for _, v in scores)
            first = min(n for n, v in scores if v == top)
            if filter_nodes(state, req, [first]).passed:
                return NodeName(first)
            passed = filter_nodes(state, req, cands).passed
        if not passed:
            return None
        scores = prioritize_nodes(state, req, passed, weights)
        top = max(v for _, v in scores)
        return NodeName(min(n for n, v in scores if v == top))

    def _cycle(
        self, req: PodRequest, universe: Sequence[NodeName], within: Collection[NodeName] | None
    ) -> Placement | None:
        best = self._best(req, universe, within)
        if best is None:
            return None
        world = self.world
        state = world.state.nodes[best]
        # The plan the filter and prioritize made for this node's free devices (pick_devices'
        # own, made once per free-device state and request shape), then its devices.
        plan = remembered_plans(world.state.memo, req).get(state.free_key)
        if plan is None:
            plan = plan_node(state.free, req)
        if not plan.fits:  # cannot happen: the filter passed this node
            raise AssertionError(f"{best}: filter passed but no devices to pick: {plan.reason}")
        devices = pick_planned(plan, state.devices, world.allocated_on(best))
        world.bind(best, req.holder(), devices)
        self.stats.placed += 1
        return Placement(best, devices)

    # --- preemption ---
    def _walk(self, req: PodRequest, universe: Sequence[NodeName], want: int) -> list[str]:
        """Up to ``want`` nodes where evicting lower-priority pods would let the pod fit, walking
        the nodes from a random one, as DefaultPreemption collects its candidates."""
        n = len(universe)
        if n == 0:
            return []
        start = self.rng.randrange(n)
        chunk = max(want, 64)
        found: list[str] = []
        for lo in range(0, n, chunk):
            names = [universe[(start + i) % n] for i in range(lo, min(n, lo + chunk))]
            found.extend(self._filter(req, names)[1])
            if len(found) >= want:
                return found[:want]
        return found

    def preemption_candidates(
        self, req: PodRequest, universe: Sequence[NodeName], want: int
    ) -> list[str]:
        """Up to ``want`` of the nodes the filter answers with ``FailedNodes`` (for a pod that
        passes nowhere), from a random one on."""
        if req.reclaim:
            # the filter's answer for a reclaim that passes nowhere: the nodes where evicting
            # the borrowers of its own lent devices makes room (all among the nodes with its
            # tags), or if there are none, those where any eviction does, standby included
            allowed = set(universe)
            tagged = [n for n in self.world.tagged_nodes(req.owner) if n in allowed]
            if tagged:
                plain = replace(req, reclaim=False)
                own = own_resolvable(self.world.state, self._filter(plain, tagged)[1], plain)
                if own:
                    return sorted(own)[:want]
        return self._walk(req, universe, want)

    def _preempt(self, req: PodRequest, universe: Sequence[NodeName]) -> tuple[Holder, ...] | None:
        s = self.settings
        n = len(universe)
        want = min(n, max(n * s.candidates_percent // 100, s.candidates_min))
        walked = self.preemption_candidates(req, universe, want)
        if not walked:
            return None
        shape = (*placement_shape(req), req.pod_priority)
        world = self.world
        best: tuple[int, str, tuple[Holder, ...]] | None = None
        known = self._victims.get(shape)
        for name in walked:
            node = NodeName(name)
            version = world.version[node]
            found = None if known is None else known.get(node)
            if found is not None and found[0] == version:
                victims = found[1]
            else:
                self.stats.choose_victims_calls += 1
                state = world.state.nodes[node]
                victims = choose_victims(state.devices, list(state.allocations.values()), req)
                if self._remembered > VICTIMS_KEPT:
                    self._victims.clear()
                    self._remembered = 0
                known = self._victims.setdefault(shape, {})
                known[node] = (version, victims)
                self._remembered += 1
            if victims is None:
                continue
            rank = (len(victims), name, victims)
            if best is None or rank[:2] < best[:2]:
                best = rank
        return None if best is None else best[2]
