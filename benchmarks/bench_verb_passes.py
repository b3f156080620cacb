"""The filter and prioritize passes over every candidate node, as the verbs run them: each node's
answer looked up by its state key (ClusterState.decision_keys, score_keys) in passes run in C,
against judging each node one by one from its state (the baseline: how every pass ran before,
and still runs where plans are kept or a topology is judged), measured in the same run, the two
alternated, every answer checked equal to the baseline's.

    python -m benchmarks.bench_verb_passes [--nodes 1250] [--calls 200] [--rounds 6] [--smoke]

The cluster is benchmarks.bench_extender's (tiers, tags, standby, failures, partial
allocations); the candidates are a window of 40 % of the nodes at a rotating start, as
kube-scheduler sends them at this size (percentageOfNodesToScore); before each call one node's
ledger changes, as a bind changes it, so some keys are new each time. Prints the CPU
milliseconds per call of each (median over the rounds) and their ratio. ``--smoke``: 60
nodes, 10 calls, 2 rounds: that it still works.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

from benchmarks.bench_extender import cluster, pods
from common.model import Allocation, GpuUuid, Holder, NodeName, PodRequest, PodUid, Priority
from extender.cluster.state import ClusterState
from extender.cluster.watching import PodCache, view_applier
from extender.scheduler.admitting import placed_request
from extender.scheduler.filtering import _evaluate
from extender.scheduler.scoring import ScoreWeights, _Scoring, prioritize_nodes

WEIGHTS = ScoreWeights()


def view(n_nodes: int) -> ClusterState:
    state = ClusterState()
    apply = view_applier(state, PodCache())
    for obj in cluster(n_nodes):
        apply(obj["kind"], "ADDED", obj)
    return state


Pass = Callable[[ClusterState, PodRequest, list[str]], object]


def filter_pass(
    state: ClusterState, req: PodRequest, names: list[str], *, one_by_one: bool
) -> object:
    """The filter's answers in reply order (the pass that keeps plans judges one by one)."""
    decision, _, missing = _evaluate(state, names, req, keep_plans=one_by_one, now=time.time())
    return (decision.passed, list(decision.failed.items()),
            list(decision.unresolvable.items()), list(missing.items()))  # fmt: skip


def scores_by_key(state: ClusterState, req: PodRequest, names: list[str]) -> object:
    return prioritize_nodes(state, req, names, WEIGHTS)


def scores_one_by_one(state: ClusterState, req: PodRequest, names: list[str]) -> object:
    scoring = _Scoring(state, req, WEIGHTS)
    return [(name, scoring.node(name)) for name in names]


def run(
    state: ClusterState, reqs: list[PodRequest], how: Pass, calls: int, seed: int
) -> tuple[float, list[object]]:
    """CPU ms per call of ``how`` over ``calls`` calls per request, a node changed before
    each (the same changes for every ``how`` of one seed); and the answers."""
    rng = random.Random(seed)
    names = sorted(state.nodes)
    window = max(1, int(0.4 * len(names)))
    answers = []
    spent = 0.0
    before: dict[NodeName, tuple[tuple[Allocation, ...], str]] = {}
    for i in range(calls):
        node = NodeName(rng.choice(names))
        found = state.nodes[node]
        before.setdefault(node, (tuple(found.ledger.values()), found.ledger_version))
        devices = found.devices
        held = rng.randrange(len(devices) + 1)
        allocations = tuple(
            Allocation(
                Holder(PodUid(f"bench-{node}-{k}"), "default", f"b-{k}", Priority.LOW, 0),
                (GpuUuid(devices[k].uuid),),
                "2026-01-01T00:00:00+00:00",
            )
            for k in range(held)
        )
        state.set_ledger(node, allocations, str(i))
        start = (i * window) % len(names)
        candidates = (names[start:] + names[:start])[:window]
        t = time.process_time()
        for req in reqs:
            answers.append(how(state, req, candidates))
        spent += time.process_time() - t
    for node, (ledger, version) in before.items():  # as it was, for the next run
        state.set_ledger(node, ledger, version)
    return 1000 * spent / (calls * len(reqs)), answers


def compare(state: ClusterState, reqs: list[PodRequest], base: Pass, ours: Pass,
            calls: int, rounds: int) -> tuple[float, float]:  # fmt: skip
    """Median CPU ms per call of ``base`` and ``ours``, alternated; every answer equal."""
    times: dict[str, list[float]] = {"base": [], "ours": []}
    for r in range(rounds):
        order = [("base", base), ("ours", ours)]
        if r % 2:
            order.reverse()
        got = {}
        for name, how in order:
            ms, got[name] = run(state, reqs, how, calls, seed=r)
            times[name].append(ms)
        if got["base"] != got["ours"]:
            sys.exit(f"round {r}: the answers differ from the baseline's")
    return statistics.median(times["base"]), statistics.median(times["ours"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=1250)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.nodes, args.calls, args.rounds = 60, 10, 2
    state = view(args.nodes)
    reqs = [
        placed_request(state, pod, resource="nvidia.com/gpu", online_class="tidelease-online",
                       release_key=None)
        for pod in pods().values()
    ]  # fmt: skip
    print(f"{args.nodes} nodes, {len(reqs)} pods, {args.calls} calls each, "
          f"median of {args.rounds} rounds (CPU ms per call)")  # fmt: skip
    print(f"{'pass':<22}{'one by one':>12}{'by key':>10}{'ratio':>8}")
    for label, base, ours in (
        ("filter", partial(filter_pass, one_by_one=True), partial(filter_pass, one_by_one=False)),
        ("prioritize", scores_one_by_one, scores_by_key),
    ):
        b, o = compare(state, reqs, base, ours, args.calls, args.rounds)
        print(f"{label:<22}{b:>12.3f}{o:>10.3f}{o / b:>7.2f}x")
    print("every answer equal to the one-by-one pass's")


if __name__ == "__main__":
    main()
