"""Simulator speed: the built-in 10,000-GPU cluster over two simulated weeks, one policy at a time,
pinned to one core.

    python -m benchmarks.bench_simulation [--policy right-of-return] [--days 14] [--scale 1]
                                          [--smoke]

Prints the wall and CPU time of each run (generating the trace is not counted) and what it did
(placements, preemptions, filter calls). Target (issue 5): under 60 s per policy. By default the
demo's three policies (``--policy tiers-no-tags`` adds the ablation). ``--smoke``: those on a
5 % cluster over two simulated days, to check that the benchmark still works.
"""

from __future__ import annotations

import argparse
import os
import time

from extender.leasingsim.cli import default_standby
from extender.leasingsim.controlling import DEFAULT_POLICIES, Policy
from extender.leasingsim.scenario import Scenario, draw_failures
from extender.leasingsim.simulating import SimSettings, simulate
from extender.leasingsim.tides import default_cluster, default_trace

TARGET_S = 60.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--policy", choices=[x.value for x in Policy], action="append")
    p.add_argument("--days", type=float, default=14.0)
    p.add_argument("--scale", type=float, default=1.0, help="of the built-in cluster")
    p.add_argument(
        "--standby", type=int, help="GPUs (right of return; default: tidelease simulate's)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, to check it still runs")
    args = p.parse_args()
    if args.smoke:  # the smoke sizes, unless given
        p.set_defaults(days=2.0, scale=0.05)
        args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        core = sorted(os.sched_getaffinity(0))[-1]
        os.sched_setaffinity(0, {core})
        print(f"pinned to core {core}")

    started = time.perf_counter()
    spec = default_cluster(args.scale)
    nodes = spec.expand(args.seed)
    trace = default_trace(list(nodes), days=args.days, seed=args.seed)
    failures = draw_failures(nodes, spec.failure_model, trace.minutes, args.seed)
    scenario = Scenario(nodes, trace, failures)
    gpus = sum(n.gpus for n in nodes)
    print(
        f"scenario: {gpus:,} GPUs on {len(nodes):,} nodes, {args.days:g} days in "
        f"{trace.steps:,} steps, {len(trace.online)} online jobs, {len(trace.borrowers):,} "
        f"borrower jobs, {len(failures):,} failures (generated in "
        f"{time.perf_counter() - started:.1f} s)"
    )
    print(
        f"{'policy':<16} {'wall s':>7} {'cpu s':>7} {'steps/s':>8} {'placed':>8} "
        f"{'preempt':>8} {'filters':>8}  target < {TARGET_S:.0f} s"
    )
    for name in args.policy or [x.value for x in DEFAULT_POLICIES]:
        standby = args.standby
        if standby is None:
            standby = default_standby(gpus, max(n.gpus for n in nodes))
        settings = SimSettings(Policy(name), seed=args.seed, standby_gpus=standby)
        cpu = time.process_time()
        wall = time.perf_counter()
        result = simulate(scenario, settings)
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        st = result.stats
        print(
            f"{name:<16} {wall:7.1f} {cpu:7.1f} {trace.steps / wall:8.0f} {st['placed']:8,} "
            f"{st['preemptions']:8,} {st['filter_calls']:8,}  "
            f"{'ok' if wall < TARGET_S else 'TOO SLOW'}"
        )


if __name__ == "__main__":
    main()
