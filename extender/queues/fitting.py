"""Where a gated pod could go: the nodes it may run on and their free GPUs. Pure.

The queues controller releases a batch pod only when it fits now; a GPU count summed over the
cluster would say yes for a pod held to other nodes, and the queues' order would be lost to
kube-scheduler's. So each pod is fitted the way kube-scheduler would at the least: all its GPUs
on one node whose labels its ``nodeSelector`` and required node affinity
(``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``) accept, whose
``NoSchedule``/``NoExecute`` taints it tolerates, that is not cordoned and that has the GPUs
free. What this leaves out (pod affinity, topology spread, other resources) kube-scheduler
still decides: a released pod it cannot place waits, and its GPUs count as taken until then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Taint = tuple[str, str, str]  # key, value, effect


@dataclass(frozen=True, slots=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    taints = tuple(
        (str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
        for t in spec.get("taints") or []
        if isinstance(t, dict)
    )
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return NodeFacts(str(meta.get("name", "")), labels, taints, bool(spec.get("unschedulable")))


@dataclass(frozen=True, slots=True)
class Constraints:
    """A pod's say on its node, as read from its spec."""

    selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    # required node affinity: any term may match; a term's expressions all must
    terms: tuple[tuple[Mapping[str, Any], ...], ...] = ()
    node_name: str = ""  # set once bound


def constraints(spec: Mapping[str, Any]) -> Constraints:
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = tuple(
        tuple(e for e in term.get("matchExpressions") or [] if isinstance(e, dict))
        for term in affinity.get("nodeSelectorTerms") or []
        if isinstance(term, dict)
    )
    return Constraints(
        selector=tuple(
            sorted((str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items())
        ),
        tolerations=tuple(t for t in spec.get("tolerations") or [] if isinstance(t, dict)),
        terms=terms,
        node_name=str(spec.get("nodeName") or ""),
    )


def _tolerated(taint: Taint, tolerations: Iterable[Mapping[str, Any]]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t.get("effect") != effect:
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == key:
                return True
        elif t.get("key") == key and str(t.get("value", "")) == value:
            return True
    return False


def _matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = str(expression.get("key", "")), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    have = labels.get(key)
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            a, b = int(have), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def eligible(c: Constraints, node: NodeFacts) -> bool:
    if c.node_name:
        return c.node_name == node.name
    if node.unschedulable:
        return False
    if any(node.labels.get(k) != v for k, v in c.selector):
        return False
    if c.terms and not any(all(_matches(e, node.labels) for e in term) for term in c.terms):
        return False
    return all(
        _tolerated(t, c.tolerations) for t in node.taints if t[2] in ("NoSchedule", "NoExecute")
    )


class Capacity:
    """Free GPUs per node, taken as pods are fitted (a pass's working copy)."""

    def __init__(self, nodes: Mapping[str, NodeFacts], free: Mapping[str, int]) -> None:
        self.nodes = dict(nodes)
        self.free = {n: f for n, f in free.items() if n in self.nodes}

    def copy(self) -> Capacity:
        return Capacity(self.nodes, self.free)

    def eligible_nodes(self, c: Constraints) -> set[str]:
        return {name for name in self.free if eligible(c, self.nodes[name])}

    def fit(self, c: Constraints, gpus: int, *, excluded: Iterable[str] = ()) -> str | None:
        """The node the pod would take (the fullest that holds it, packing), taken; None."""
        skip = set(excluded)
        best: tuple[int, str] | None = None
        for name, left in self.free.items():
            fits = name not in skip and left >= gpus and eligible(c, self.nodes[name])
            if fits and (best is None or (left, name) < best):
                best = (left, name)
        if best is None:
            return None
        self.free[best[1]] -= gpus
        return best[1]

    def take(self, node: str, gpus: int) -> None:
        """GPUs a placed pod holds that the ledgers do not show yet."""
        if node in self.free:
            self.free[node] = max(0, self.free[node] - gpus)

    def fits(self, c: Constraints, gpus: int) -> bool:
        """Whether the pod would fit, taking nothing."""
        return any(
            left >= gpus and eligible(c, self.nodes[name]) for name, left in self.free.items()
        )

    def most_free(self, c: Constraints) -> int:
        """The most free GPUs on one node the pod may use."""
        return max(
            (left for name, left in self.free.items() if eligible(c, self.nodes[name])), default=0
        )
