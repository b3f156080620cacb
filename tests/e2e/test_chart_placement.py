"""The chart's extender replicas never share a node, as the real kube-scheduler reads the
rendered Deployment (issue 38): its pod template's affinity as `helm template` writes it, three
replicas on a group of two kwok nodes: two run, on different nodes, and the third waits with
kube-scheduler's own anti-affinity reason."""

from __future__ import annotations

from typing import Any

import pytest

from common import builders
from tests.chart import find, render
from tests.e2e.harness import GROUP_LABEL, Cluster, NodeGroup
from tests.e2e.kube import wait_for

pytestmark = pytest.mark.cluster


def extender_like(namespace: str) -> dict[str, Any]:
    """The chart's extender Deployment with its placement as rendered (labels, selector,
    affinity), its containers a stand-in that kwok runs, kept to the test's node group."""
    rendered = find(render(), "Deployment", "tidelease-extender")
    template = rendered["spec"]["template"]
    spec = template["spec"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "extender-like", "namespace": namespace},
        "spec": {
            "replicas": 3,
            "selector": rendered["spec"]["selector"],
            "template": {
                "metadata": {"labels": template["metadata"]["labels"]},
                "spec": {
                    "affinity": spec["affinity"],
                    "containers": [{"name": "extender", "image": "local/app:v1"}],
                    "nodeSelector": {},  # set by the test: its group
                    "tolerations": [],
                },
            },
        },
    }


def test_two_extender_replicas_never_share_a_node(
    cluster: Cluster, group: NodeGroup, namespace: str
) -> None:
    group.add_node("a", lambda name: builders.devices(name, 8))
    group.add_node("b", lambda name: builders.devices(name, 8))
    group.wait_ready()
    deployment = extender_like(namespace)
    spec = deployment["spec"]["template"]["spec"]
    spec["nodeSelector"] = {GROUP_LABEL: group.id}
    spec["tolerations"] = [{"key": GROUP_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
    kube = cluster.kube
    kube.create(deployment)

    def placed() -> tuple[list[str], list[str]] | None:
        pods = kube.list("Pod", namespace)
        nodes = [p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")]
        waiting = [
            str(c.get("message"))
            for p in pods
            if not p["spec"].get("nodeName")
            for c in p["status"].get("conditions") or []
            if c.get("reason") == "Unschedulable"
        ]
        return (nodes, waiting) if len(pods) == 3 and len(nodes) == 2 and waiting else None

    nodes, waiting = wait_for(placed, what="two replicas placed, the third refused", timeout=60)
    assert sorted(nodes) == sorted(group.nodes), nodes
    assert any("anti-affinity" in m for m in waiting), waiting
