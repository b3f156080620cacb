"""``tidelease plan-simulate``: the planner's simulator from the command line."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("tidelease-plan-out"), help="output folder")
    p.add_argument("--seed", type=int, default=7, help="seed of the traces (default 7)")


def run(args: argparse.Namespace) -> int:
    from extender.simulation.planner import run as simulate
    from extender.simulation.planner import summary, write

    report = simulate(args.seed)
    print(summary(report))
    for path in write(report, args.out):
        print(f"wrote {path}")
    return 0
