"""``tidelease plan-simulate``: the planner's simulator from the command line.

The autoscaler comparison's options keep the name of the paper it reproduces (``--kale-trace``;
the help says "kale comparison"): users' scripts pass them.

Reference: kale (docs/references.md).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("tidelease-plan-out"), help="output folder")
    p.add_argument("--seed", type=int, default=7, help="seed of the traces (default 7)")
    p.add_argument(
        "--kale-trace",
        choices=("surges", "embedded"),
        default="surges",
        help="trace of the kale comparison: a daily tide with sharp rises (default) or the "
        "embedded tidal trace",
    )
    p.add_argument(
        "--prelaunch",
        type=float,
        default=None,
        metavar="SECONDS",
        help="kale comparison: W, how long a new worker takes to be useful; the planner's lead "
        "follows it (default 420)",
    )
    p.add_argument(
        "--pause",
        type=float,
        default=None,
        metavar="SECONDS",
        help="kale comparison: the job's re-form pause at each scaling action (default 120)",
    )
    p.add_argument(
        "--hpa-target",
        type=float,
        default=None,
        metavar="FRACTION",
        help="kale comparison: the HPA's target GPU utilisation (default 0.8)",
    )


def run(args: argparse.Namespace) -> int:
    from common.errors import InvalidInput
    from extender.plannersim.comparison import (
        AUTOSCALER_COMPARISON,
        AUTOSCALER_HPA,
        AUTOSCALER_PLANNER,
        summary,
        write,
    )
    from extender.plannersim.comparison import run as simulate

    comparison, planner, hpa = AUTOSCALER_COMPARISON, AUTOSCALER_PLANNER, AUTOSCALER_HPA
    if args.prelaunch is not None:
        comparison = replace(comparison, prelaunch_s=args.prelaunch)
        planner = replace(planner, lead_s=args.prelaunch)
    if args.pause is not None:
        comparison = replace(comparison, pause_s=args.pause)
        planner = replace(planner, pause_s=args.pause)
    if args.hpa_target is not None:
        hpa = replace(hpa, target=args.hpa_target)
    problems = [*comparison.validate(), *planner.validate(), *hpa.validate()]
    if problems:
        raise InvalidInput("plan-simulate: " + "; ".join(problems))
    report = simulate(
        args.seed,
        autoscaler_trace_name=args.kale_trace,
        autoscaler_settings=comparison,
        autoscaler_planner=planner,
        hpa=hpa,
    )
    print(summary(report))
    for path in write(report, args.out):
        print(f"wrote {path}")
    return 0
