"""Where a gated pod could go (extender.queues.fitting): the nodeSelector, required node
affinity, taints and cordons kube-scheduler would read, and one node's free GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from extender.queues.fitting import Capacity, NodeFacts, constraints, eligible, node_facts

NODE = node_facts(
    {
        "metadata": {"name": "n1", "labels": {"pool": "a", "gpus": "8"}},
        "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                            {"key": "soft", "effect": "PreferNoSchedule"}]},
    }
)  # fmt: skip
TOLERATE = [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]


@pytest.mark.parametrize(
    ("spec", "ok"),
    [
        ({"tolerations": TOLERATE}, True),
        ({}, False),  # the NoSchedule taint
        ({"tolerations": [{"operator": "Exists"}]}, True),
        ({"tolerations": [{"key": "gpu", "value": "no"}]}, False),
        ({"tolerations": TOLERATE, "nodeSelector": {"pool": "a"}}, True),
        ({"tolerations": TOLERATE, "nodeSelector": {"pool": "b"}}, False),
        ({"tolerations": TOLERATE, "nodeName": "n2"}, False),
        ({"tolerations": TOLERATE, "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]},
                {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]},
            ]}}}}, True),
        ({"tolerations": TOLERATE, "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]},
            ]}}}}, False),
    ],
)  # fmt: skip
def test_what_kube_scheduler_would_read(spec: dict[str, Any], ok: bool) -> None:
    assert eligible(constraints(spec), NODE) is ok


def test_a_cordoned_node_takes_nothing_and_pods_pack_onto_the_fullest_node() -> None:
    cordoned = NodeFacts("c", unschedulable=True)
    cap = Capacity(
        {"c": cordoned, "x": NodeFacts("x"), "y": NodeFacts("y")}, {"c": 8, "x": 3, "y": 5}
    )
    anywhere = constraints({})
    assert cap.fit(anywhere, 2) == "x"
    assert cap.fit(anywhere, 2) == "y"  # x has 1 left
    assert cap.fit(anywhere, 4) is None  # y has 3, c is cordoned
    assert cap.most_free(anywhere) == 3
