"""``tidelease simulate``: compare leasing policies on a cluster and a trace, size the standby pool.

Without arguments: the built-in 10,000-GPU cluster and two-week trace, over three seeds (1, 2,
3), each drawing its own tiers, tides, borrowers and failures. Prints what was simulated, a row
per policy and the standby sizing, every figure as its mean over the seeds with a 95 %
confidence interval; writes PNG plots and ``summary.json`` into ``--out``. ``--seeds 1`` is one
run of ``--seed``, printed as it is. Bad input files end the command with every problem named
(``InvalidInput``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TextIO

from common.errors import InvalidInput
from extender.leasingsim.controlling import DEFAULT_POLICIES, Policy
from extender.leasingsim.estimating import DEFAULT_SEEDS, LEVEL, seeds_from
from extender.leasingsim.loading import cluster_document, load_cluster, load_trace, trace_csv
from extender.leasingsim.metrics import over_seeds
from extender.leasingsim.reporting import (
    describe,
    findings,
    policy_table,
    seeds_note,
    sizing_table,
)
from extender.leasingsim.runner import Runner
from extender.leasingsim.scenario import Scenario, check, draw_failures
from extender.leasingsim.scheduling import SchedulerSettings, Scoring
from extender.leasingsim.simulating import RunResult, SimSettings
from extender.leasingsim.sizing import CAP_SHARE, TARGET, Sizing, default_sizes, sweep
from extender.leasingsim.tides import DEFAULT_DAYS, default_cluster, default_trace

DEFAULT_OUT = Path("tidelease-sim-out")
# Standby pool without a sweep (hack/demo.sh runs none): this share of the cluster's GPUs, in
# whole nodes. 12 % is the default sweep's confirmed answer for the built-in cluster and failure
# model over seeds 1-3 (docs/simulator.md has the sweep; `tidelease simulate` runs it again);
# the share, not the count, is what holds across cluster sizes.
STANDBY_SHARE = 0.12
ORDER = tuple(Policy)  # the report's order
# the summary's figures estimated over the seeds in summary.json
_ESTIMATED = (
    "ha_start",
    "ha_end",
    "ha_min",
    "ha_max",
    "fulfilment_trough",
    "fulfilment_peak",
    "fulfilment_mean",
    "reclaims",
    "reclaims_full_ratio",
    "shortfall",
    "gpu_hours_lent",
    "on_lent_gpu_hours",
    "utilisation",
    "evictions",
)


def default_standby(total_gpus: int, node_gpus: int = 8) -> int:
    """The standby pool (GPUs) when the sweep does not choose: ``STANDBY_SHARE`` of the
    cluster, rounded up to whole nodes (a replica stands in on a whole node)."""
    node = max(1, node_gpus)
    return -(-round(STANDBY_SHARE * total_gpus) // node) * node


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster", type=Path, help="cluster description (YAML/JSON; default: built-in 10k GPUs)"
    )
    parser.add_argument(
        "--trace",
        type=Path,
        help="trace (YAML/JSON/CSV; default: generated for the cluster from --seed)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seed of everything drawn, the first of --seeds (default 1)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=DEFAULT_SEEDS,
        help="how many seeds (--seed, --seed+1, ...): every simulation is run per seed and every "
        f"figure reported as its mean with a {100 * LEVEL:g}%% confidence interval "
        f"(default {DEFAULT_SEEDS}; 1: one run, no interval)",
    )
    parser.add_argument(
        "--days",
        type=float,
        help=f"simulated days (default: {DEFAULT_DAYS:g} for a generated trace, a given trace's)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="shrink the built-in cluster (e.g. 0.1: 1,000 GPUs); ignored with --cluster",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default ./{DEFAULT_OUT})"
    )
    parser.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    parser.add_argument(
        "--standby-sweep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="sweep standby pool sizes for the smallest with >= 99.9%% full reclaims (default on)",
    )
    parser.add_argument(
        "--sweep-sizes",
        help="standby sizes (GPUs) the sweep tries, comma-separated (default: 0 to "
        f"{100 * CAP_SHARE:g}%% of the cluster's GPUs in whole nodes, by whole percents with "
        "several seeds, finer below 2%% with one; the sweep stops at the first confirmed answer)",
    )
    parser.add_argument(
        "--standby",
        type=int,
        help="standby pool (GPUs) of the right-of-return run (default: the sweep's answer, or "
        f"its largest size if none meets the target; without a sweep {100 * STANDBY_SHARE:g}%% "
        "of the cluster's GPUs in whole nodes)",
    )
    parser.add_argument(
        "--failure-scale",
        type=float,
        default=1.0,
        help="multiply the failure model's rates (default 1; ignored with a trace's failures)",
    )
    parser.add_argument(
        "--policies",
        default=",".join(p.value for p in DEFAULT_POLICIES),
        help="policies to compare, comma-separated: right-of-return, no-return (the plain "
        "kube-scheduler), tiers-no-tags (tidelease's scheduler without leases, an ablation), "
        "no-scaling (default: right-of-return,no-return,no-scaling)",
    )
    parser.add_argument(
        "--baseline-scoring",
        choices=[s.value for s in Scoring],
        default=SchedulerSettings().plain_scoring.value,
        help="how the plain kube-scheduler of no-return scores nodes (NodeResourcesFit over "
        "nvidia.com/gpu): MostAllocated, bin packing as GPU clusters configure it, or "
        "LeastAllocated, its stock spreading (default %(default)s)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="simulations run in parallel (worker processes; default: cores, at most 4)",
    )
    parser.add_argument(
        "--save-inputs",
        action="store_true",
        help="also write the cluster (cluster.yaml) and trace (trace.csv) that were simulated",
    )


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput(f"{option}: want comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise InvalidInput(f"{option}: want non-negative integers, got {text!r}")
    return values


def _policies(text: str) -> list[Policy]:
    known = {p.value: p for p in Policy}
    chosen = []
    for name in (x.strip() for x in text.split(",") if x.strip()):
        if name not in known:
            raise InvalidInput(f"--policies: unknown {name!r} (known: {', '.join(known)})")
        chosen.append(known[name])
    if not chosen:
        raise InvalidInput("--policies: none given")
    return [p for p in ORDER if p in chosen]


def scenario_from(args: argparse.Namespace, seed: int | None = None) -> Scenario:
    """The cluster and trace the arguments name (built-in ones by default), checked; drawn
    from ``seed`` (default ``--seed``)."""
    seed = args.seed if seed is None else seed
    problems = []
    if args.days is not None and args.days <= 0:
        problems.append(f"--days: want a positive number, got {args.days:g}")
    if args.scale <= 0:
        problems.append(f"--scale: want a positive number, got {args.scale:g}")
    if args.failure_scale < 0:
        problems.append(f"--failure-scale: want a non-negative number, got {args.failure_scale:g}")
    if problems:
        raise InvalidInput(problems)
    spec = load_cluster(args.cluster) if args.cluster else default_cluster(args.scale)
    nodes = spec.expand(seed)
    if args.trace:
        trace = load_trace(args.trace, nodes, days=args.days)
    else:
        trace = default_trace(list(nodes), days=args.days or DEFAULT_DAYS, seed=seed)
        problems = check(nodes, trace)
        if problems:
            raise InvalidInput(problems)
    failures = trace.failures
    if failures is None:
        model = spec.failure_model
        if args.failure_scale != 1.0:
            model = replace(
                model,
                rates_per_day=tuple((t, r * args.failure_scale) for t, r in model.rates_per_day),
            )
        failures = draw_failures(nodes, model, trace.minutes, seed)
    else:
        failures = tuple(f for f in failures if f.at < trace.minutes)
    return Scenario(nodes, trace, failures)


def _batch(jobs: int, seeds: int) -> int:
    """Sizes per round of the sweep: enough that a round's runs (one per size and seed) fill
    the workers evenly (``lcm(jobs, seeds) / seeds``)."""
    return jobs // math.gcd(jobs, seeds)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    stream = out or sys.stdout
    policies = _policies(args.policies)
    sizes = _ints(args.sweep_sizes, "--sweep-sizes") if args.sweep_sizes else None
    if args.standby is not None and args.standby < 0:
        raise InvalidInput(f"--standby: want a non-negative number of GPUs, got {args.standby}")
    if args.jobs < 1:
        raise InvalidInput(f"--jobs: want at least 1, got {args.jobs}")
    if args.seeds < 1:
        raise InvalidInput(f"--seeds: want at least 1, got {args.seeds}")
    if not args.no_plots:
        # Without matplotlib (the image), say so before the simulation rather than after it.
        importlib.import_module("extender.leasingsim.plotting")
    seeds = seeds_from(args.seed, args.seeds)
    scenarios = {k: scenario_from(args, k) for k in seeds}
    scenario = scenarios[seeds[0]]
    total = sum(n.gpus for n in scenario.nodes)
    node_gpus = max((n.gpus for n in scenario.nodes), default=8)
    if sizes is None:
        sizes = list(default_sizes(total, node_gpus, len(seeds)))
    print(describe(list(scenarios.values()), seeds), file=stream, flush=True)
    base = SimSettings(
        Policy.RIGHT_OF_RETURN,
        seed=args.seed,
        scheduler=SchedulerSettings(plain_scoring=Scoring(args.baseline_scoring)),
    )

    sizing: Sizing | None = None
    results: dict[Policy, list[RunResult]] = {}
    with Runner(scenarios, args.jobs) as runner:
        if args.standby_sweep:
            over = "" if len(seeds) == 1 else f" over seeds {seeds[0]}-{seeds[-1]}"
            print(f"sweeping standby sizes {sizes}{over} ...", file=stream, flush=True)
            swept = time.perf_counter()
            sizing = sweep(
                lambda batch: runner.run(
                    [replace(base, standby_gpus=s, seed=k) for s in batch for k in seeds]
                ),
                sizes,
                target=TARGET,
                batch=_batch(args.jobs, len(seeds)),
                level=LEVEL,
            )
            sweep_s = time.perf_counter() - swept
        todo: list[SimSettings] = []
        for policy in policies:
            if policy is Policy.RIGHT_OF_RETURN:
                standby = args.standby
                if standby is None:
                    fallback = default_standby(total, node_gpus)
                    standby = fallback if sizing is None else _chosen(sizing, fallback)
                reuse = sizing.results_for(standby) if sizing is not None else []
                if reuse:
                    results[policy] = reuse
                    continue
                todo.extend(replace(base, standby_gpus=standby, seed=k) for k in seeds)
            else:
                todo.extend(replace(base, policy=policy, seed=k) for k in seeds)
        for settings, result in zip(todo, runner.run(todo), strict=True):
            results.setdefault(settings.policy, []).append(result)

    ordered = [results[p] for p in policies]
    groups = [[r.summary for r in runs] for runs in ordered]
    print(file=stream)
    if len(seeds) > 1:
        print(seeds_note(seeds, LEVEL), file=stream)
    print(policy_table(groups), file=stream)
    if sizing is not None:
        print(file=stream)
        print(sizing_table(sizing, total), file=stream)
        print(
            f"The sweep ran {len(sizing.results)} simulations in {sweep_s:.0f} s "
            f"({args.jobs} at a time).",
            file=stream,
        )
    print(file=stream)
    print(findings(groups, sizing, total), file=stream)
    print(file=stream)
    for runs in ordered:
        s = runs[0].summary
        if len(runs) == 1:
            print(
                f"{s.policy}: simulated {scenario.trace.minutes / 1440:g} days of "
                f"{total:,} GPUs in {s.elapsed_s:.1f} s ({s.cpu_s:.1f} s of CPU, one core)",
                file=stream,
            )
        else:
            wall = sum(r.summary.elapsed_s for r in runs) / len(runs)
            cpu = sum(r.summary.cpu_s for r in runs) / len(runs)
            print(
                f"{s.policy}: simulated {scenario.trace.minutes / 1440:g} days of "
                f"{total:,} GPUs in {wall:.1f} s per seed ({cpu:.1f} s of CPU, one core), "
                f"{len(runs)} seeds",
                file=stream,
            )
    written = _write_outputs(args, scenario, ordered, sizing, seeds)
    for path in written:
        print(f"wrote {path}", file=stream)
    return 0


def _chosen(sizing: Sizing, fallback: int) -> int:
    if sizing.answer is not None:
        return sizing.answer
    return max((p.size for p in sizing.points), default=fallback)


def _write_outputs(
    args: argparse.Namespace,
    scenario: Scenario,
    results: list[list[RunResult]],
    sizing: Sizing | None,
    seeds: Sequence[int],
) -> list[Path]:
    out: Path = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidInput(f"--out {out}: cannot create: {e.strerror or e}") from e
    written: list[Path] = []
    first = [runs[0] for runs in results]
    summary: dict[str, Any] = {
        "seed": args.seed,
        "policies": [asdict(r.summary) for r in first],
        "stats": {r.summary.policy: r.stats for r in first},
    }
    if len(seeds) > 1:
        # the seed's own figures above are the first seed's; over the seeds:
        summary["seeds"] = list(seeds)
        summary["confidence"] = LEVEL
        summary["runs"] = [
            {"seed": r.settings.seed, **asdict(r.summary), "stats": r.stats}
            for runs in results
            for r in runs
        ]
        summary["estimates"] = {
            runs[0].summary.policy: {
                name: asdict(over_seeds([r.summary for r in runs], name)) for name in _ESTIMATED
            }
            for runs in results
        }
    if sizing is not None:
        summary["standby_sizing"] = {
            "target": sizing.target,
            "answer_gpus": sizing.answer,
            "points": [{**asdict(p), "ratio": p.ratio} for p in sizing.points],
        }
        if len(seeds) > 1:
            summary["standby_sizing"]["confidence"] = sizing.level
            summary["standby_sizing"]["seeds"] = [r.settings.seed for r in sizing.results]
            summary["standby_sizing"]["sizes"] = [
                {"size": p.size, "full": asdict(p.full)} for p in sizing.sizes
            ]
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    written.append(path)
    if args.save_inputs:
        spec = load_cluster(args.cluster) if args.cluster else default_cluster(args.scale)
        path = out / "cluster.yaml"
        path.write_text(cluster_document(scenario.nodes, spec.failure_model))
        written.append(path)
        path = out / "trace.csv"
        path.write_text(trace_csv(scenario.trace, scenario.failures))
        written.append(path)
    if not args.no_plots:
        from extender.leasingsim import plotting

        written.extend(plotting.write_all(results, sizing, out))
    return written


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m extender.leasingsim.cli``)."""
    parser = argparse.ArgumentParser(prog="tidelease simulate", description=__doc__)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except InvalidInput as e:
        for problem in e.problems:
            print(f"tidelease: {problem}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
