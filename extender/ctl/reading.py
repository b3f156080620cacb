"""What ``tidelease ctl`` reads: one list of each kind from the API server, applied to a cluster
state by the extender's own rules (:func:`~extender.cluster.watching.view_applier`).

The views and tables made of that state are in :mod:`extender.ctl.view`,
:mod:`extender.ctl.render` and :mod:`extender.ctl.explain`, which do no I/O.
"""

from __future__ import annotations

import argparse
import asyncio
import time
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

_CRDS = {
    "GpuNode": f"gpunodes.{contract.GROUP}",
    "GpuAllocation": f"gpuallocations.{contract.GROUP}",
    "GpuLease": f"gpuleases.{contract.GROUP}",
}


async def read(args: argparse.Namespace, colour: bool) -> str:
    """The command's output; the extender's defaults where the flags leave them unset."""
    defaults = ExtenderSettings()
    if args.agent_timeout is None:
        args.agent_timeout = defaults.agent_timeout_s
    if args.gpu_resource is None:
        args.gpu_resource = defaults.gpu_resource
    kube = await KubeClient.connect(args.kubeconfig)
    try:
        if args.agent_namespace is None:
            args.agent_namespace = await find_agent_namespace(kube)
        return await _answer(KubeStore(kube, args.agent_namespace), kube, args, colour, defaults)
    finally:
        await kube.close()


# The chart's ClusterRoleBinding of the agents' ServiceAccount (templates/agent-rbac.yaml):
# cluster-scoped, so only an admin (or the chart) makes it; its subject names the release's
# namespace.
AGENT_BINDING = "tidelease-agent"


async def find_agent_namespace(kube: KubeClient) -> str:
    """Where the release's agents keep their heartbeat Leases, found rather than assumed (a
    chart installed in any namespace). First the namespace of the agents' ServiceAccount in
    the chart's ClusterRoleBinding, which no tenant can write; for a caller who may not read
    it, the namespace holding most Leases labelled as the agents'; else
    :data:`~common.contract.DEFAULT_AGENT_NAMESPACE`."""
    try:
        binding = await kube.json(
            "GET", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{AGENT_BINDING}"
        )
    except TideleaseError:
        binding = {}
    for subject in binding.get("subjects") or []:
        if (
            isinstance(subject, dict)
            and subject.get("kind") == "ServiceAccount"
            and subject.get("name") == AGENT_BINDING
            and isinstance(subject.get("namespace"), str)
        ):
            return str(subject["namespace"])
    selector = f"{contract.AGENT_LABEL_KEY}={contract.AGENT_LABEL_VALUE}"
    try:
        listed = await kube.json(
            "GET", "/apis/coordination.k8s.io/v1/leases", query={"labelSelector": selector}
        )
    except TideleaseError:
        return contract.DEFAULT_AGENT_NAMESPACE
    return agent_namespace(listed.get("items") or [])


def agent_namespace(leases: list[dict[str, Any]]) -> str:
    """The namespace holding most of the agents' heartbeat ``leases`` (by name on a tie), or
    the default without any."""
    counts: dict[str, int] = {}
    for lease in leases:
        meta = lease.get("metadata") or {}
        name, namespace = str(meta.get("name") or ""), meta.get("namespace")
        if isinstance(namespace, str) and name.startswith(contract.AGENT_LEASE_PREFIX):
            counts[namespace] = counts.get(namespace, 0) + 1
    if not counts:
        return contract.DEFAULT_AGENT_NAMESPACE
    return min(counts, key=lambda ns: (-counts[ns], ns))


def context_namespace(kubeconfig: Path | None) -> str:
    """The namespace of the kubeconfig's current context, as kubectl defaults to it."""
    from kubernetes_asyncio.config import list_kube_config_contexts

    try:
        _, current = list_kube_config_contexts(str(kubeconfig) if kubeconfig else None)
    except Exception:  # in a cluster, or no kubeconfig: kubectl's default
        return "default"
    return str(((current or {}).get("context") or {}).get("namespace") or "default")


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
    store: KubeStore,
    kube: KubeClient,
    args: argparse.Namespace,
    colour: bool,
    defaults: ExtenderSettings,
) -> str:
    kinds: list[Kind] = ["GpuNode", "GpuAllocation", "Lease", "GpuLease"]
    if args.what == "explain":
        kinds += ["Pod", "Namespace"]  # the namespaces granted online jobs too, as the filter
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
        explanation = explain_pod(
            cluster, pod, defaults.weights, args.gpu_resource, names, now=time.time()
        )
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
