"""Why a GPU pod is not placed, node by node: the extender's own filter and prioritize, run
against the cluster state as the extender sees it. Pure.

No second implementation of the rules: :func:`explain_pod` calls
:func:`~extender.scheduler.filtering.filter_nodes` and
:func:`~extender.scheduler.scoring.prioritize_nodes` over every GPU node the view knows (where
kube-scheduler would send the nodes that passed its own filters), with the pod parsed as the
filter parses it and made a reclaim where the owner's lease is reclaiming.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from common.errors import InvalidInput
from common.model import PodRequest
from common.tenancy import DEFAULT_ONLINE_PRIORITY_CLASS
from extender.cluster.state import ClusterState
from extender.scheduler.admitting import placed_request
from extender.scheduler.filtering import filter_nodes
from extender.scheduler.scoring import ScoreWeights, prioritize_nodes

FITS = "fits"
MAY_PREEMPT = "no (preemption may help)"
NO = "no"


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    verdict: str  # fits | no (preemption may help) | no
    score: int | None  # prioritize's score, for a node that fits
    reason: str  # the filter's reason, for a node that does not


@dataclass(frozen=True, slots=True)
class Explanation:
    pod: str
    request: str
    bound_to: str | None = None
    invalid: str | None = None  # the filter's answer to a pod it cannot read
    fitting: int = 0
    nodes: tuple[NodeVerdict, ...] = ()


def describe(req: PodRequest) -> str:
    parts = [f"{req.gpus} GPU(s)", f"priority {req.priority.value}"]
    if req.owner:
        parts.append(f"owner {req.owner}")
    parts.append(f"tier {req.min_tier.name} or better")
    parts.append(f"type {req.gpu_type or 'any'}")
    if req.reclaim:
        group = f" of lent group {req.lent_group}" if req.lent_group else ""
        parts.append(f"a reclaim{group} (its lease is reclaiming)")
    return ", ".join(parts)


def explain_pod(
    cluster: ClusterState,
    pod: Mapping[str, Any],
    weights: ScoreWeights,
    resource: str,
    gpu_nodes: Iterable[str] = (),
    online_class: str = DEFAULT_ONLINE_PRIORITY_CLASS,
    now: float | None = None,
) -> Explanation:
    """``gpu_nodes``: the GpuNodes listed, with those the view dropped (one that does not parse
    offers nothing: kube-scheduler still asks about it, and the filter says why). ``now``:
    the time kept marks are judged at (:func:`filter_nodes`)."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    bound_to = str((pod.get("spec") or {}).get("nodeName") or "") or None
    try:
        req = placed_request(cluster, pod, resource=resource, online_class=online_class)
    except InvalidInput as e:
        return Explanation(key, "-", bound_to, invalid=f"tidelease: {e}")
    request = describe(req)
    if bound_to:
        return Explanation(key, request, bound_to)
    if req.gpus == 0:
        return Explanation(
            key, request, invalid=f"the pod asks for no {resource}: tidelease does not place it"
        )
    names = sorted({*gpu_nodes, *(str(state.node) for state in cluster)})
    decision = filter_nodes(cluster, req, names, now=now)
    scores = dict(prioritize_nodes(cluster, req, decision.passed, weights))
    fitting = sorted(decision.passed, key=lambda n: (-scores[n], n))
    nodes = [NodeVerdict(n, FITS, scores[n], "") for n in fitting]
    nodes += [NodeVerdict(n, MAY_PREEMPT, None, r) for n, r in sorted(decision.failed.items())]
    nodes += [NodeVerdict(n, NO, None, r) for n, r in sorted(decision.unresolvable.items())]
    return Explanation(key, request, fitting=len(fitting), nodes=tuple(nodes))
