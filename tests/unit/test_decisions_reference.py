"""Filter and prioritize, memoised over node states and request shapes and kept across requests,
agree with a plain reference that decides every node from its devices and live allocations, over
a cluster that changes between requests (allocations added and released, pods gone, tiers, tags
and caches changed, agents silent and back, inventories removed and re-added, reclaiming leases).
And the replies' fast encodings are byte for byte what json.dumps writes of the protocol objects.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from common import builders
from common.model import (
    Allocation,
    DeviceClass,
    Holder,
    JobKey,
    NodeCache,
    NodeInventory,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from common.podrequest import parse_pod
from extender.cluster.state import ClusterState, NodeState
from extender.scheduler import wire
from extender.scheduler.filtering import (
    AGENT_SILENT,
    LENT_ELSEWHERE,
    NO_INVENTORY,
    RECLAIM_OWN_FIRST,
    STANDBY_ELSEWHERE,
    STANDBY_KEPT,
    FilterDecision,
    filter_nodes,
)
from extender.scheduler.placement import NodePlan, free_counts, plan_node
from extender.scheduler.scoring import ScoreWeights, prioritize_nodes, score
from extender.scheduler.victims import may_evict, resolvable

W = ScoreWeights()
JOBS = ["a", "b", "c"]
TYPES = ["H20", "H20", "A100"]
PRIORITIES = [0, 100, 1000, 5000]


# --- the reference: every node decided on its own, nothing remembered ---


def _free(state: NodeState, mine: PodUid | None = None) -> Counter[DeviceClass]:
    """The node's free devices; with ``mine``, that pod's own held ones too (a bind of it
    that wrote the ledger and never finished: its reservation is its own to place on)."""
    held = [u for a in _others(state, mine) for u in a.devices]
    return free_counts(state.devices, held)


def _others(state: NodeState, mine: PodUid | None) -> list[Allocation]:
    return [a for a in state.allocations.values() if a.holder.pod_uid != mine]


def _judge(state: NodeState, req: PodRequest) -> tuple[NodePlan, bool]:
    plan = plan_node(_free(state, req.uid), req)
    if plan.fits:
        return plan, False
    return plan, resolvable(state.devices, _others(state, req.uid), req)


def _own_resolvable(state: NodeState, req: PodRequest) -> bool:
    by_uuid = {d.uuid: d.cls for d in state.devices}
    counts = _free(state, req.uid)
    freed = False
    for a in state.allocations.values():
        classes = [by_uuid[u] for u in a.devices if u in by_uuid]
        if may_evict(a.holder, req) and any(c.owner == req.owner for c in classes):
            counts.update(classes)
            freed = True
    return freed and plan_node(counts, req).fits


def _share(plan: NodePlan, req: PodRequest) -> tuple[float, float, float]:
    taken = sum(n for _, n in plan.take)
    if not taken:
        return (0.0, 0.0, 0.0)
    own = sum(n for c, n in plan.take if c.owner is not None and c.owner == req.owner)
    standby = sum(n for c, n in plan.take if c.standby)
    tiers = sum(int(c.tier) * n for c, n in plan.take)
    return (own / taken, standby / taken, tiers / taken)


def reference_filter(cluster: ClusterState, req: PodRequest, names: list[str]) -> FilterDecision:
    if req.gpus == 0:
        return FilterDecision(passed=list(names))
    known: list[tuple[str, NodeState]] = []
    missing: dict[str, str] = {}
    for name in names:
        state = cluster.nodes.get(NodeName(name))
        if state is None or not state.has_inventory:
            missing[name] = NO_INVENTORY
        elif state.silent:
            missing[name] = AGENT_SILENT
        else:
            known.append((name, state))

    def evaluate(r: PodRequest) -> tuple[FilterDecision, dict[str, NodePlan]]:
        d, plans = FilterDecision(), {}
        for name, state in known:
            plan, helps = _judge(state, r)
            plans[name] = plan
            if plan.fits:
                d.passed.append(name)
            elif helps:
                d.failed[name] = plan.reason
            else:
                d.unresolvable[name] = plan.reason
        return d, plans

    decision, plans = evaluate(req)
    if req.reclaim:
        plain = replace(req, reclaim=False)
        strict, strict_plans = evaluate(plain)
        own = {n for n in strict.failed if _own_resolvable(cluster.nodes[NodeName(n)], plain)}
        if strict.passed or own:
            with_standby = plans
            decision, plans = strict, strict_plans
            for name in [n for n in decision.failed if n not in own]:
                decision.unresolvable[name] = RECLAIM_OWN_FIRST
                del decision.failed[name]
            for name, plan in strict_plans.items():
                if not plan.fits and with_standby[name].fits and name not in decision.failed:
                    decision.unresolvable[name] = STANDBY_KEPT
        shares = {name: _share(plans[name], req) for name in decision.passed}
        best = max(shares.values(), default=(0.0, 0.0, 0.0))
        if best[:2] > (0.0, 0.0):
            for name in decision.passed:
                if shares[name] < best:
                    reason = LENT_ELSEWHERE if best[0] > 0 else STANDBY_ELSEWHERE
                    decision.unresolvable[name] = reason
            decision.passed[:] = [n for n in decision.passed if shares[n] >= best]
    decision.unresolvable.update(missing)
    return decision


def reference_prioritize(
    cluster: ClusterState, req: PodRequest, names: list[str]
) -> list[tuple[str, int]]:
    out = []
    for name in names:
        state = cluster.nodes.get(NodeName(name))
        if state is None or not state.offering or req.gpus == 0:
            out.append((name, 0))
            continue
        free = _free(state)
        value = score(
            plan_node(free, req),
            state.cache,
            req,
            node_devices=len(state.devices),
            node_free=sum(n for c, n in free.items() if c.healthy),
            weights=W,
        )
        out.append((name, value))
    return out


# --- a changing cluster ---


def _node(rng: random.Random, name: str) -> NodeInventory:
    gpu_type = rng.choice(TYPES)
    owner = rng.choice(JOBS) if rng.random() < 0.35 else None
    devices = []
    for i in range(8):
        devices += builders.devices(
            name,
            1,
            gpu_type=gpu_type,
            tier=rng.choices(list(Tier), [1, 2, 6])[0],
            healthy=rng.random() > 0.03,
            owner=owner if rng.random() < 0.8 else None,
            standby=owner is None and rng.random() < 0.15,
            start=i,
        )
    cache = NodeCache(
        images=frozenset(rng.choice([(), ("img:a",), ("img:a", "img:b")])),
        checkpoints=frozenset(rng.choice([(), ("ck-1",)])),
    )
    return NodeInventory(NodeName(name), tuple(devices), cache)


class World:
    def __init__(self, rng: random.Random, n_nodes: int) -> None:
        self.rng = rng
        self.cluster = ClusterState()
        self.names = [f"n{i:03d}" for i in range(n_nodes)]
        self.removed: dict[NodeName, NodeInventory] = {}
        self.step = 0
        for name in self.names:
            self.cluster.set_inventory(_node(rng, name))
            for _ in range(rng.choice([0, 0, 1, 2])):
                self.allocate(self.cluster.nodes[NodeName(name)])

    def allocate(self, state: NodeState) -> None:
        rng = self.rng
        held = {u for a in state.ledger.values() for u in a.devices}
        free = [d.uuid for d in state.devices if d.uuid not in held]
        if not free:
            return
        self.step += 1
        high = rng.random() < 0.25
        holder = Holder(
            PodUid(f"uid-h{self.step}"),
            "default",
            f"h{self.step}",
            Priority.HIGH if high else Priority.LOW,
            rng.choice(PRIORITIES),
            JobKey(rng.choice(JOBS)) if high else None,
        )
        devices = tuple(rng.sample(free, rng.randint(1, min(4, len(free)))))
        self.cluster.set_ledger(
            state.node, (*state.ledger.values(), Allocation(holder, devices)), str(self.step)
        )

    def mutate(self) -> None:
        c, rng = self.cluster, self.rng
        name = NodeName(rng.choice(self.names))
        state = c.nodes.get(name)
        if state is None:  # removed with nothing allocated: the state went with it
            c.set_inventory(self.removed.pop(name))
            return
        what = rng.random()
        if what < 0.35 and state.has_inventory:
            self.allocate(state)
        elif what < 0.6 and state.ledger:
            keep = list(state.ledger.values())
            keep.pop(rng.randrange(len(keep)))
            c.set_ledger(state.node, tuple(keep), "x")
        elif what < 0.7 and state.ledger:
            c.pod_gone(rng.choice(list(state.ledger)))
        elif what < 0.82 and state.has_inventory:
            inv = _node(rng, str(state.node))
            c.set_inventory(replace(inv, devices=state.devices[:4] + inv.devices[4:]))
        elif what < 0.88:
            state.heartbeat = 0.0 if not state.silent else 100.0
            c.sweep(100.0, 60)
        elif what < 0.94:
            if state.has_inventory:
                self.removed[state.node] = NodeInventory(state.node, state.devices, state.cache)
                c.remove_inventory(state.node)
            elif state.node in self.removed:
                c.set_inventory(self.removed.pop(state.node))
        else:
            job = rng.choice(JOBS)
            c.apply_gpu_lease(
                "MODIFIED",
                {
                    "metadata": {"name": f"lease-{job}", "namespace": "default"},
                    "spec": {"owner": job},
                    "status": {"phase": rng.choice(["Reclaiming", "Lent"])},
                },
            )

    def pod(self, i: int) -> dict[str, Any]:
        rng = self.rng
        high = rng.random() < 0.45
        owner = rng.choice([*JOBS, "z"]) if high or rng.random() < 0.2 else None
        held = [u for s in self.cluster for u in s.allocations]
        uid = rng.choice(held) if held and rng.random() < 0.15 else f"uid-p{i}"
        return builders.pod(
            f"p{i}",
            rng.choice([0, 1, 2, 2, 4, 4, 8, 9]),
            uid=uid,
            priority=Priority.HIGH if high else Priority.LOW,
            owner=owner,
            tier=rng.choice([None, Tier.MA, Tier.HA]),
            gpu_type=rng.choice([None, None, "H20", "A100"]),
            reclaim=high and owner is not None and rng.random() < 0.4,
            checkpoint=rng.choice([None, "ck-1"]),
            image=rng.choice(["img:a", "img:c"]),
            pod_priority=rng.choice([*PRIORITIES, 50, 2000, 100000]),
        )


@pytest.mark.parametrize(("seed", "memo_limit"), [(1, None), (2, None), (3, None), (4, 2)], ids=str)
def test_memoised_verbs_agree_with_the_reference(seed: int, memo_limit: int | None) -> None:
    """memo_limit 2: shapes are dropped from the memo all the time, mid-request included."""
    rng = random.Random(seed)
    world = World(rng, 90)
    if memo_limit is not None:
        world.cluster.memo.limit = memo_limit
    earlier: list[PodRequest] = []
    for i in range(150):
        for _ in range(rng.choice([0, 1, 1, 3])):
            world.mutate()
        if earlier and rng.random() < 0.35:
            req = rng.choice(earlier)  # repeats: answers remembered from before the changes
        else:
            req = parse_pod(world.pod(i))
            earlier.append(req)
        req = world.cluster.with_reclaim(req)
        names = list(world.names) if rng.random() < 0.7 else rng.sample(world.names, 30)
        names.append("ghost")
        if rng.random() < 0.1:
            names.append(names[0])  # kube-scheduler never repeats a node; the answer is defined
        got = filter_nodes(world.cluster, req, names)
        want = reference_filter(world.cluster, req, names)
        assert got.passed == want.passed, (i, req)
        assert got.failed == want.failed, (i, req)
        assert got.unresolvable == want.unresolvable, (i, req)
        scores = prioritize_nodes(world.cluster, req, names, W)
        assert scores == reference_prioritize(world.cluster, req, names), (i, req)


# --- reply encoding ---

ODD = ["n-1", 'quo"te', "back\\slash", "ünï", "tab\there", "\u2028", "emoji-\U0001f680"]


def _args(names: list[str], full: bool) -> wire.ExtenderArgs:
    if full:
        items = tuple({"metadata": {"name": n}, "status": {"x": [1, 2.5]}} for n in names)
        return wire.ExtenderArgs({}, tuple(names), items)
    return wire.ExtenderArgs({}, tuple(names), None)


@pytest.mark.parametrize("full", [False, True])
def test_filter_reply_encoding_is_json_dumps(full: bool) -> None:
    names = [*ODD, *(f"node-{i}" for i in range(20))]
    args = _args(names, full)
    failed = {n: f'tidelease: reason {i % 3} \u00e9"' for i, n in enumerate(names[1:8])}
    unresolvable = {n: "tidelease: x" for n in names[8:15]}
    passed = [n for n in names if n not in failed and n not in unresolvable]
    reply = wire.filter_result(args, passed, failed, unresolvable)
    fast = wire.encode(wire.encoded_filter_result(args, passed, failed, unresolvable))
    assert fast == wire.encode(reply)
    assert json.loads(fast) == reply
    empty = wire.encoded_filter_result(args, [], {}, {})
    assert wire.encode(empty) == wire.encode(wire.filter_result(args, [], {}, {}))


def test_priority_list_encoding_is_json_dumps() -> None:
    scores = [(n, i % 11) for i, n in enumerate([*ODD, *(f"node-{i}" for i in range(30))])]
    scores.append(("big", 123456789))
    fast = wire.encode(wire.encoded_host_priority_list(scores))
    assert fast == wire.encode(wire.host_priority_list(scores))
    assert wire.encode(wire.encoded_host_priority_list([])) == b"[]"


def test_the_answer_memo_is_bounded_at_insert_least_recently_used_out() -> None:
    """20,000 distinct shapes and no node change: the memo never holds more than its bound
    (it grew without one until a node changed), and a shape asked again stays."""
    from extender.cluster.state import MEMO_SHAPES

    world = World(random.Random(5), 20)
    cluster = world.cluster
    kept = cluster.memo.setdefault(("probe", "hot"), {0: "hot"})
    for i in range(20_000):
        cluster.memo.setdefault(("probe", i), {0: i})
        assert len(cluster.memo) <= MEMO_SHAPES
        if i % 1000 == 0:
            assert cluster.memo.setdefault(("probe", "hot"), {}) is kept  # asked again
    assert ("probe", "hot") in cluster.memo
    assert ("probe", 0) not in cluster.memo  # the oldest went first
    assert ("probe", 19_999) in cluster.memo
