"""The filter and prioritize passes over every candidate node look each node's answer up by its
state key (ClusterState.decision_keys, score_keys, group_score_keys); the answers must be those
of judging each node one by one from its state, through every change a node's state goes
through: inventory added, changed and removed, ledgers written, reservations, agents silent,
Kueue's kept marks, topology published, pods gone, and node names nobody knows."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from common import builders, contract
from common.keptmarks import encode
from common.model import (
    Allocation,
    GpuUuid,
    Holder,
    NodeInventory,
    NodeName,
    PodRequest,
    PodUid,
    Priority,
    Tier,
)
from common.podrequest import parse_pod
from extender.cluster.state import ClusterState
from extender.scheduler.filtering import _evaluate
from extender.scheduler.scoring import ScoreWeights, _Scoring, prioritize_nodes
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, layout

NOW = 1796011500.0
NODES = [f"n{i}" for i in range(12)]
NAMES = [*NODES, "ghost"]  # a name no GpuNode ever had
POD_UID = "uid-the-pod"  # the pod whose requests are judged; it holds devices at times


def topology() -> Any:
    reading = NvmlReader(FakeNvml(layout("pcie-2socket-8"))).topology()
    assert reading.topology is not None
    return reading.topology


TOPOLOGY = topology()


def gpu_node(rng: random.Random, name: str) -> dict[str, Any]:
    owner = rng.choice([None, None, "recsys", "ads"])
    devs = builders.devices(
        name,
        8,
        tier=rng.choice([Tier.HA, Tier.HA, Tier.MA, Tier.LA]),
        owner=owner,
        standby=owner is None and rng.random() < 0.2,
    )
    if rng.random() < 0.2:
        bad = rng.randrange(8)
        devs[bad] = builders.devices(name, 1, healthy=False, start=bad)[0]
    obj = builders.gpu_node(name, devs, checkpoints=["ck-1"] if rng.random() < 0.3 else [])
    if rng.random() < 0.25:  # lent devices kept for a Kueue workload, live or lapsed
        kept = {GpuUuid(d.uuid): rng.choice(["team-a/Job/x", "default/Job/mine"]) for d in devs[:4]}
        until = NOW + rng.choice([-10, 60])
        obj["metadata"]["annotations"] = {contract.ANN_KEPT_FOR_KUEUE: encode(kept, until)}
    return obj


def change(rng: random.Random, state: ClusterState, step: int) -> None:
    """One change of one node's state, of any kind the view knows."""
    node = NodeName(rng.choice(NODES))
    what = rng.randrange(8)
    if what <= 1:
        state.apply_gpu_node("MODIFIED", gpu_node(rng, node))
    elif what == 2:
        state.apply_gpu_node("DELETED", {"metadata": {"name": node}})
    elif what == 3:  # a topology published
        devs = builders.devices(node, 8, tier=rng.choice([Tier.HA, Tier.MA]))
        state.set_inventory(NodeInventory(node=node, devices=tuple(devs), topology=TOPOLOGY))
    elif what == 4:  # the ledger rewritten: other pods, and at times the judged pod itself
        current = state.get(node)
        uuids = [d.uuid for d in current.devices] if current else []
        rng.shuffle(uuids)
        allocations = []
        for i, pod_uid in enumerate(["uid-a", "uid-b", POD_UID][: rng.randrange(4)]):
            take = tuple(GpuUuid(u) for u in uuids[3 * i : 3 * i + 3])
            if take:
                prio = rng.choice([Priority.LOW, Priority.HIGH])
                holder = Holder(PodUid(pod_uid), "default", pod_uid, prio, rng.choice([0, 500]))
                allocations.append(Allocation(holder, take, "2026-01-01T00:00:00+00:00"))
        state.set_ledger(node, tuple(allocations), str(step))
    elif what == 5:  # a gang pod's devices held in memory
        current = state.get(node)
        if current and current.devices:
            holder = Holder(PodUid(POD_UID), "default", "the-pod", Priority.LOW, 0)
            held = (GpuUuid(current.devices[-1].uuid),)
            state.reserve(node, Allocation(holder, held, "2026-01-01T00:00:00+00:00"), 1e12)
    elif what == 6:  # an agent silent, or heard again
        renewed = "2026-11-30T10:00:00.000000Z"
        lease = {
            "metadata": {"name": f"tidelease-agent-{node}", "namespace": "tidelease-system"},
            "spec": {"holderIdentity": node, "renewTime": renewed, "leaseDurationSeconds": 60},
        }
        state.apply_lease("MODIFIED", lease)
        state.sweep(NOW if rng.random() < 0.5 else 0.0, 60)
    else:
        state.pod_gone(PodUid(rng.choice(["uid-a", "uid-b", POD_UID])))
        state.unreserve(PodUid(POD_UID))


def requests() -> list[PodRequest]:
    pods = [
        builders.pod("b1", 1, uid=POD_UID, pod_priority=100),
        builders.pod("b4", 4, uid=POD_UID, controller=("Job", "mine")),
        builders.pod("b2", 2, uid=POD_UID, checkpoint="ck-1", pod_priority=1000),
        builders.pod("b6", 6, uid=POD_UID, pod_priority=1000),
        builders.pod("o2", 2, uid=POD_UID, priority=Priority.HIGH, owner="recsys"),
        builders.pod("o8", 8, uid=POD_UID, priority=Priority.HIGH, owner="ads", pod_priority=9),
    ]
    return [parse_pod(p) for p in pods]


def one_by_one_filter(state: ClusterState, req: PodRequest, now: float | None) -> Any:
    """Every node judged from its state (the pass that keeps plans does so)."""
    decision, _, missing = _evaluate(state, NAMES, req, keep_plans=True, now=now)
    return decision, missing


def test_the_passes_answer_as_judging_each_node_from_its_state() -> None:
    weights = ScoreWeights()
    seen: Counter[str] = Counter()
    for seed in range(6):
        rng = random.Random(seed)
        state = ClusterState()
        for name in NODES:
            state.apply_gpu_node("ADDED", gpu_node(rng, name))
        for step in range(60):
            change(rng, state, step)
            for req in requests():
                for now in (None, NOW):
                    fast, _, fast_missing = _evaluate(state, NAMES, req, keep_plans=False, now=now)
                    slow, slow_missing = one_by_one_filter(state, req, now)
                    assert fast.passed == slow.passed
                    # the same reasons, in the same order (the reply's bytes)
                    assert list(fast.failed.items()) == list(slow.failed.items())
                    assert list(fast.unresolvable.items()) == list(slow.unresolvable.items())
                    assert list(fast_missing.items()) == list(slow_missing.items())
                    seen.update(
                        passed=len(fast.passed),
                        failed=len(fast.failed),
                        unresolvable=len(fast.unresolvable),
                        missing=len(fast_missing),
                    )
                scoring = _Scoring(state, req, weights)
                scores = prioritize_nodes(state, req, NAMES, weights)
                assert scores == [(name, scoring.node(name)) for name in NAMES]
                seen.update(scored=sum(1 for _, s in scores if s > 0))
    # The changes reached every kind of answer, not a few alone.
    assert all(seen[k] > 100 for k in ("passed", "failed", "unresolvable", "missing", "scored")), (
        seen
    )


def test_a_node_forgotten_leaves_no_key_behind() -> None:
    rng = random.Random(3)
    state = ClusterState()
    state.apply_gpu_node("ADDED", gpu_node(rng, "n0"))
    assert NodeName("n0") in state.decision_keys
    state.apply_gpu_node("DELETED", {"metadata": {"name": "n0"}})  # no ledger: forgotten
    assert state.get("n0") is None
    for index in (state.decision_keys, state.score_keys, state.group_score_keys):
        assert NodeName("n0") not in index
    assert NodeName("n0") not in state.kept_nodes
