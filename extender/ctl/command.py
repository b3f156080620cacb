"""``tidelease ctl`` and ``kubectl tidelease``: what tidelease sees, read from the API server with
the user's kubeconfig. The same commands under both names (docs/operating.md, "Seeing what
tidelease sees").

This module only registers the commands: every ``tidelease`` process (the node agent too)
loads it at start, so what reads the cluster (:mod:`extender.ctl.reading`, the API client and
the scheduler's rules) is imported when a command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import contract
from common.errors import InvalidInput, TideleaseError

PROG = "kubectl tidelease"
FORMATS = ("table", "json", "yaml")


def _options(parser: argparse.ArgumentParser, *, after: bool) -> None:
    """The options every command takes, before the command or (``after``) after it, as
    kubectl takes them: ``kubectl tidelease status -o json``."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if after else value  # after: only where given

    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=default(None),
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=default("table"),
        help="table, json or yaml",
    )
    parser.add_argument(
        "--agent-namespace",
        default=default(None),
        help="where the node agents keep their heartbeat Leases (default: found from the "
        f"agents' Leases, the namespace holding most of them; {contract.DEFAULT_AGENT_NAMESPACE} "
        "when none can be listed)",
    )
    parser.add_argument(
        "--agent-timeout",
        type=float,
        default=default(None),
        help="seconds without a heartbeat after which a node's agent counts as silent "
        "(default: the extender's agent_timeout_s)",
    )
    parser.add_argument(
        "--gpu-resource",
        default=default(None),
        help="the GPU resource (default: the extender's gpu_resource)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options(parser, after=False)
    cmds = parser.add_subparsers(dest="what", required=True, metavar="COMMAND")
    commands = {
        "status": cmds.add_parser("status", help="GPUs by type and tier, silent agents, leases"),
        "nodes": cmds.add_parser("nodes", help="every GPU node: its agent, its devices by state"),
        "node": cmds.add_parser("node", help="one node's devices"),
        "leases": cmds.add_parser("leases", help="every GpuLease"),
        "lease": cmds.add_parser("lease", help="one GpuLease: its lent devices, borrowers"),
        "explain": cmds.add_parser("explain", help="why a GPU pod is not placed, node by node"),
    }
    commands["node"].add_argument("name")
    commands["lease"].add_argument("name")
    commands["explain"].add_argument("pod")
    for name in ("leases", "lease", "explain"):
        commands[name].add_argument(
            "-n", "--namespace", help="default: the kubeconfig context's namespace"
        )
    commands["leases"].add_argument("-A", "--all-namespaces", action="store_true")
    for sub in commands.values():
        _options(sub, after=True)
    parser.set_defaults(run=run)


def register(sub: Any) -> None:
    """``tidelease ctl`` (the extender side's subcommands, extender.main)."""
    ctl = sub.add_parser(
        "ctl",
        help="see what tidelease sees: GPUs, nodes, leases, why a pod waits "
        "(also installed as kubectl-tidelease)",
    )
    add_arguments(ctl)


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl-tidelease`` executable: ``kubectl tidelease ...`` once it is on PATH."""
    parser = argparse.ArgumentParser(prog=PROG, description="See what tidelease sees.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from extender.ctl.reading import read

    # The view's rules log what a long-running extender must tell (a GpuNode it ignores, an
    # agent gone silent); here the tables say it, once.
    logging.getLogger("extender.cluster").setLevel(logging.CRITICAL)
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ and args.output == "table"
    try:
        text = asyncio.run(read(args, colour))
    except TideleaseError as e:
        for problem in e.problems if isinstance(e, InvalidInput) else [str(e)]:
            print(f"{PROG}: {problem}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0
