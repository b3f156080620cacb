"""kube-scheduler's cycle for one GPU pod, under one of two profiles. Pure.

* **tidelease** (``Profile.TIDELEASE``): kube-scheduler with the tidelease extender. filter
  (:func:`extender.scheduler.filtering.filter_nodes`) -> prioritize
  (:func:`extender.scheduler.scoring.prioritize_nodes`) -> the best score among the nodes that
  passed -> bind: the devices of :func:`extender.scheduler.placement.pick_devices`, recorded in
  the node's ledger.
* **plain** (``Profile.PLAIN``): kube-scheduler as it ships, with the NVIDIA device plugin: a GPU
  is an ``nvidia.com/gpu``, one as good as another (weflex 2.3, C3: "native Kubernetes scheduling
  mechanisms [...] treat all resources of equivalent priority as interchangeable"). A node fits
  where its free healthy GPUs (allocatable less requested; the plugin reports a failed GPU
  unhealthy) are enough, of the pod's GPU type (a node label); it scores by ``NodeResourcesFit``
  with the ``MostAllocated`` strategy over ``nvidia.com/gpu`` (bin packing, what GPU clusters
  configure so that 8-GPU pods find whole nodes); the kubelet hands out any free healthy
  devices (its device manager takes them from an unordered set: drawn at random here). No
  tiers, tags or standby devices: the pod's ``min_tier`` cannot be expressed.

Ties are broken as kube-scheduler breaks them, at random (seeded): ``selectHost`` samples the
highest-scoring nodes uniformly (reservoir sampling). The scheduler's node list (its snapshot's
order) is a random permutation of the nodes, drawn once per run.

When no node passes, high-priority pods preempt as kube-scheduler's DefaultPreemption does: from
a random offset in the node list, it collects the nodes where eviction would make room (the
filter's ``FailedNodes``) until it has ``max(10 % of the nodes, 100)`` candidates, finds the
victims on each (tidelease: the extender's
:func:`extender.scheduler.victims.choose_victims`; plain: :func:`select_victims`, kube-
scheduler's ``SelectVictimsOnNode``), picks the candidate as ``pickOneNodeForPreemption`` does
(tidelease: the fewest victims; plain: the lowest highest victim priority, the lowest sum of
priorities, the fewest victims, the latest start of the highest-priority victims), the rest of
the ties at random, evicts its victims and runs the cycle once more.

Three shortcuts keep a two-week run of 10,000 GPUs fast, none changing an answer:

* The filter is asked only about nodes with at least as many free healthy devices as the pod
  wants (no other node can pass: every device a plan takes is free and healthy), outside the
  standby pool unless the pod is a reclaim (no other pod's plan takes a standby device); the rest
  of the nodes matter only for preemption, which walks them as kube-scheduler does. The
  statistics count the filter calls of the unabridged cycle (one per cycle with a node of enough
  free healthy devices). Under the plain profile those nodes are exactly the ones that fit.
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

import enum
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

MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore


class Scoring(enum.Enum):
    """``NodeResourcesFit``'s scoring strategy (its ``scoringStrategy.type``)."""

    LEAST_ALLOCATED = "LeastAllocated"  # kube-scheduler's default: spread
    MOST_ALLOCATED = "MostAllocated"  # bin packing


class Profile(enum.Enum):
    """Which scheduler places the pods (the module's docstring)."""

    TIDELEASE = "tidelease"
    PLAIN = "plain"


Evict = Callable[[Holder], object]
Victims = tuple[int, tuple[Holder, ...] | None]  # at a node version, choose_victims' answer
VICTIMS_KEPT = 200_000


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    # DefaultPreemption's minCandidateNodesPercentage and minCandidateNodesAbsolute
    candidates_percent: int = 10
    candidates_min: int = 100
    # the plain profile's NodeResourcesFit strategy
    plain_scoring: Scoring = Scoring.MOST_ALLOCATED


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
    def __init__(
        self,
        world: SimCluster,
        settings: SchedulerSettings,
        rng: random.Random,
        profile: Profile = Profile.TIDELEASE,
    ) -> None:
        self.world = world
        self.settings = settings
        self.rng = rng
        self.profile = profile
        self.stats = SchedulerStats()
        # kube-scheduler's node list: a random permutation (its snapshot's order), per GPU type
        order = list(world.names)
        rng.shuffle(order)
        self._order: dict[str | None, list[NodeName]] = {None: order}
        for name in order:
            self._order.setdefault(world.specs[name].gpu_type, []).append(name)
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
        """The nodes of the pod's GPU type (and of ``within``) in the scheduler's order."""
        nodes = self._order.get(req.gpu_type, [])
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
        if self.profile is Profile.PLAIN:
            return self._best_plain(req, within)
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
            first = self.select_host(prioritize_nodes(state, req, cands, weights))
            if filter_nodes(state, req, [first]).passed:
                return NodeName(first)
            passed = filter_nodes(state, req, cands).passed
        if not passed:
            return None
        return NodeName(self.select_host(prioritize_nodes(state, req, passed, weights)))

    def select_host(self, scores: Sequence[tuple[str, int]]) -> str:
        """kube-scheduler's ``selectHost``: one of the highest-scoring nodes, uniformly at random
        (sorted first: the candidates come in no fixed order, the seed's draw must not depend
        on it)."""
        top = max(v for _, v in scores)
        best = [n for n, v in scores if v == top]
        return best[0] if len(best) == 1 else self.rng.choice(sorted(best))

    def _best_plain(self, req: PodRequest, within: Collection[NodeName] | None) -> NodeName | None:
        """The plain profile's pick: of the nodes with enough free healthy GPUs of the type (all
        that fit), the best ``NodeResourcesFit`` score (:func:`resources_fit`), ties at random."""
        cands = self.world.with_free(req.gpus, req.gpu_type)
        if within is not None:
            cands = [n for n in cands if n in within]
        if not cands:
            return None
        self.stats.filter_calls += 1
        nodes, healthy = self.world.state.nodes, self.world.healthy
        strategy = self.settings.plain_scoring
        scores = [
            (n, resources_fit(strategy, healthy[n], nodes[n].free_total, req.gpus)) for n in cands
        ]
        return NodeName(self.select_host(scores))

    def _cycle(
        self, req: PodRequest, universe: Sequence[NodeName], within: Collection[NodeName] | None
    ) -> Placement | None:
        best = self._best(req, universe, within)
        if best is None:
            return None
        world = self.world
        if self.profile is Profile.PLAIN:
            # the kubelet's device manager: any free healthy devices (an unordered set)
            taken = world.holder_of
            free = [d for d in world.by_node[best] if d.cls.healthy and d.uuid not in taken]
            picked = sorted(self.rng.sample(free, req.gpus), key=lambda d: d.index)
            world.bind(best, req.holder(), picked)
            self.stats.placed += 1
            return Placement(best, tuple(picked))
        state = world.state.nodes[best]
        # The plan the filter and prioritize made for this node's free devices (pick_devices'
        # own, made once per free-device state and request shape), then its devices.
        plan = remembered_plans(world.state.memo, req).get(state.free_key)
        if plan is None:
            plan = plan_node(state.free, req)
        if not plan.fits:  # cannot happen: the filter passed this node
            raise AssertionError(f"{best}: filter passed but no devices to pick: {plan.reason}")
        devices = pick_planned(plan, state.devices, world.allocated_on(best), state.topology)
        world.bind(best, req.holder(), devices)
        self.stats.placed += 1
        return Placement(best, devices)

    # --- preemption ---
    def _walk(
        self,
        universe: Sequence[NodeName],
        want: int,
        failed: Callable[[list[NodeName]], list[str]],
    ) -> list[str]:
        """Up to ``want`` nodes where evicting lower-priority pods would let the pod fit
        (``failed``: those of some nodes), walking the node list from a random offset, as
        DefaultPreemption collects its candidates."""
        n = len(universe)
        if n == 0:
            return []
        start = self.rng.randrange(n)
        chunk = max(want, 64)
        found: list[str] = []
        for lo in range(0, n, chunk):
            names = [universe[(start + i) % n] for i in range(lo, min(n, lo + chunk))]
            found.extend(failed(names))
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
        return self._walk(universe, want, lambda names: self._filter(req, names)[1])

    def _preempt(self, req: PodRequest, universe: Sequence[NodeName]) -> tuple[Holder, ...] | None:
        s = self.settings
        n = len(universe)
        want = min(n, max(n * s.candidates_percent // 100, s.candidates_min))
        if self.profile is Profile.PLAIN:
            return self._preempt_plain(req, universe, want)
        walked = self.preemption_candidates(req, universe, want)
        if not walked:
            return None
        shape = (*placement_shape(req), req.pod_priority)
        world = self.world
        ranked: list[tuple[tuple[int, ...], str, tuple[Holder, ...]]] = []
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
            if victims is not None:
                ranked.append(((len(victims),), name, victims))
        return self._pick_candidate(ranked)

    def _pick_candidate(
        self, ranked: Sequence[tuple[tuple[int, ...], str, tuple[Holder, ...]]]
    ) -> tuple[Holder, ...] | None:
        """The victims of the candidate with the smallest rank, ties at random."""
        if not ranked:
            return None
        top = min(r[0] for r in ranked)
        best = sorted((r for r in ranked if r[0] == top), key=lambda r: r[1])
        return (best[0] if len(best) == 1 else self.rng.choice(best))[2]

    def _preempt_plain(
        self, req: PodRequest, universe: Sequence[NodeName], want: int
    ) -> tuple[Holder, ...] | None:
        world = self.world
        found: dict[str, tuple[Holder, ...]] = {}

        def failed(names: list[NodeName]) -> list[str]:
            out: list[str] = []
            for name in names:
                victims = select_victims(
                    self._pods_on(name), world.state.nodes[name].free_total, req
                )
                if victims is not None:
                    found[name] = victims
                    out.append(name)
            return out

        walked = self._walk(universe, want, failed)
        started = world.started
        ranked = []
        for name in walked:
            victims = found[name]
            top = max((h.pod_priority for h in victims), default=0)
            earliest = min(
                (started[h.pod_uid] for h in victims if h.pod_priority == top), default=0
            )
            rank = (top, sum(h.pod_priority for h in victims), len(victims), -earliest)
            ranked.append((rank, name, victims))
        return self._pick_candidate(ranked)

    def _pods_on(self, node: NodeName) -> list[tuple[Holder, int, int]]:
        """The pods on a node: holder, healthy devices held, start (bind order)."""
        world = self.world
        devices, started = world.devices, world.started
        return [
            (a.holder, sum(1 for u in a.devices if devices[u].cls.healthy), started[h])
            for h, a in world.ledger[node].items()
        ]


def resources_fit(strategy: Scoring, healthy: int, free: int, gpus: int) -> int:
    """``NodeResourcesFit``'s score (0-100) of a node with ``healthy`` allocatable and ``free``
    free GPUs for a pod of ``gpus``: ``LeastAllocated``, the share left free after placement;
    ``MostAllocated``, the share requested."""
    if healthy <= 0:
        return 0
    requested = min(healthy, healthy - free + gpus)
    if strategy is Scoring.MOST_ALLOCATED:
        return requested * MAX_NODE_SCORE // healthy
    return (healthy - requested) * MAX_NODE_SCORE // healthy


def select_victims(
    pods: Sequence[tuple[Holder, int, int]], free: int, req: PodRequest
) -> tuple[Holder, ...] | None:
    """kube-scheduler's ``SelectVictimsOnNode`` for a pod of ``req.gpus`` interchangeable GPUs
    on a node with ``free`` free healthy GPUs and these pods (holder, healthy GPUs held, start):
    every pod of lower priority is a potential victim; ``None`` where the pod does not fit
    even without them all. Then as many as possible are reprieved, the most important first
    (higher priority, then earlier start): a pod stays when the preemptor fits without its
    GPUs. Returns the rest, the victims (``()``: none needed)."""
    lower = [p for p in pods if p[0].pod_priority < req.pod_priority]
    room = free + sum(g for _, g, _ in lower)
    if room < req.gpus:
        return None
    victims = []
    for holder, gpus, _ in sorted(lower, key=lambda p: (-p[0].pod_priority, p[2])):
        if room - gpus >= req.gpus:
            room -= gpus  # reprieved: it keeps its GPUs
        else:
            victims.append(holder)
    return tuple(victims)
