"""``tidelease ctl`` and ``kubectl tidelease``: what tidelease sees, read from the API server with
the user's kubeconfig. The same commands under both names (docs/operating.md, "Seeing what
tidelease sees").

One list of each kind, applied to a cluster state by the extender's own rules
(:func:`~extender.cluster.watching.view_applier`); the views and tables are pure
(:mod:`extender.ctl.view`, :mod:`extender.ctl.render`, :mod:`extender.ctl.explain`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import contract
from common.errors import InvalidInput, NotFound, TideleaseError, Unavailable
from common.kubeclient import KubeClient
from common.objects import parse_gpu_node
from extender.cluster.kubestore import KubeStore
from extender.cluster.state import ClusterState
from extender.cluster.store import Kind
from extender.cluster.watching import PodCache, view_applier
from extender.ctl import render
from extender.ctl.explain import explain_pod
from extender.ctl.view import lease_views, node_views, summary
from extender.scheduler.settings import ExtenderSettings

PROG = "kubectl tidelease"
_DEFAULTS = ExtenderSettings()
_CRDS = {
    "GpuNode": f"gpunodes.{contract.GROUP}",
    "GpuAllocation": f"gpuallocations.{contract.GROUP}",
    "GpuLease": f"gpuleases.{contract.GROUP}",
}


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
        choices=render.FORMATS,
        default=default("table"),
        help="table, json or yaml",
    )
    parser.add_argument(
        "--agent-namespace",
        default=default(contract.DEFAULT_AGENT_NAMESPACE),
        help="where the node agents keep their heartbeat Leases",
    )
    parser.add_argument(
        "--agent-timeout",
        type=float,
        default=default(_DEFAULTS.agent_timeout_s),
        help="seconds without a heartbeat after which a node's agent counts as silent",
    )
    parser.add_argument(
        "--gpu-resource", default=default(_DEFAULTS.gpu_resource), help="the GPU resource"
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
    # The view's rules log what a long-running extender must tell (a GpuNode it ignores, an
    # agent gone silent); here the tables say it, once.
    logging.getLogger("extender.cluster").setLevel(logging.CRITICAL)
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ and args.output == "table"
    try:
        text = asyncio.run(_text(args, colour))
    except TideleaseError as e:
        for problem in e.problems if isinstance(e, InvalidInput) else [str(e)]:
            print(f"{PROG}: {problem}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


def context_namespace(kubeconfig: Path | None) -> str:
    """The namespace of the kubeconfig's current context, as kubectl defaults to it."""
    from kubernetes_asyncio.config import list_kube_config_contexts

    try:
        _, current = list_kube_config_contexts(str(kubeconfig) if kubeconfig else None)
    except Exception:  # in a cluster, or no kubeconfig: kubectl's default
        return "default"
    return str(((current or {}).get("context") or {}).get("namespace") or "default")


async def _text(args: argparse.Namespace, colour: bool) -> str:
    kube = await KubeClient.connect(args.kubeconfig)
    try:
        return await _answer(KubeStore(kube, args.agent_namespace), kube, args, colour)
    finally:
        await kube.close()


# An API server that says "not now" (429 while its storage initialises, 5xx) is asked again, a
# few times, before the command gives up with its answer.
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)


async def _list(store: KubeStore, kind: Kind) -> list[dict[str, Any]]:
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return await _list_once(store, kind)
        except Unavailable:
            if delay is None:
                raise
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def _list_once(store: KubeStore, kind: Kind) -> list[dict[str, Any]]:
    try:
        return await store.list_objects(kind)
    except NotFound as e:
        crd = _CRDS.get(kind)
        if crd is None:
            raise
        raise NotFound(
            f"the API server does not serve {crd}: are tidelease's CRDs installed? "
            "(docs/install.md)"
        ) from e
    except InvalidInput as e:
        if "HTTP 403" in str(e):
            raise InvalidInput(f"not allowed to list {kind} objects: {e}") from e
        raise


async def _answer(
    store: KubeStore, kube: KubeClient, args: argparse.Namespace, colour: bool
) -> str:
    kinds: list[Kind] = ["GpuNode", "GpuAllocation", "Lease", "GpuLease"]
    if args.what == "explain":
        kinds.append("Pod")
    listed = {kind: await _list(store, kind) for kind in kinds}
    cluster = ClusterState()
    apply = view_applier(cluster, PodCache(args.gpu_resource))
    for kind in kinds:
        for obj in listed[kind]:
            apply(kind, "ADDED", obj)
    now = time.time()
    cluster.sweep(now, args.agent_timeout)
    fmt = args.output

    def out(value: Any, table: str) -> str:
        return table if fmt == "table" else render.dump(value, fmt)

    if args.what == "explain":
        namespace = args.namespace or context_namespace(args.kubeconfig)
        try:
            pod = await kube.json("GET", f"/api/v1/namespaces/{namespace}/pods/{args.pod}")
        except NotFound as e:
            raise NotFound(f"pod {namespace}/{args.pod} not found") from e
        names = [str((n.get("metadata") or {}).get("name", "")) for n in listed["GpuNode"]]
        explanation = explain_pod(cluster, pod, _DEFAULTS.weights, args.gpu_resource, names)
        return out(explanation, render.explain(explanation, colour))

    problems: dict[str, str] = {}
    for obj in listed["GpuNode"]:
        try:
            parse_gpu_node(obj)
        except InvalidInput as e:
            problems[str((obj.get("metadata") or {}).get("name", ""))] = "; ".join(e.problems)
    nodes = node_views(cluster, listed["GpuNode"], problems)
    if args.what == "nodes":
        return out(nodes, render.nodes(nodes, colour))
    if args.what == "node":
        found = [n for n in nodes if n.name == args.name]
        if not found:
            raise NotFound(f"no GpuNode {args.name} (is its agent running?)")
        return out(found[0], render.node(found[0], colour))

    leases = lease_views(cluster, listed["GpuLease"], now)
    if args.what == "status":
        s = summary(nodes, leases)
        return out(s, render.status(s, colour))
    if args.what in ("leases", "lease"):
        namespace = args.namespace or context_namespace(args.kubeconfig)
        if args.what == "leases":
            shown = [v for v in leases if args.all_namespaces or v.namespace == namespace]
            return out(shown, render.leases(shown, colour))
        one = [v for v in leases if v.namespace == namespace and v.name == args.name]
        if not one:
            raise NotFound(f"no GpuLease {namespace}/{args.name}")
        return out(one[0], render.lease(one[0], colour))
    raise InvalidInput(f"unknown command {args.what}")
