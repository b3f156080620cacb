"""Kueue Workloads as tidelease's admission check reads them (extender.kueue.workloads): pod sets
read by the extender's own pod parser, Kueue's conditions, the checks' states, the owner."""

from __future__ import annotations

from typing import Any

import pytest

from common import contract
from common.errors import InvalidInput
from common.model import Tier
from extender.kueue.workloads import API_VERSION, parse_workload

CHECK = "tidelease-lent-gpus"


def workload(
    *pod_sets: tuple[str, int, int],
    conditions: tuple[str, ...] = ("QuotaReserved",),
    state: str = "Pending",
    annotations: dict[str, str] | None = None,
    name: str = "job-train-1a2b3",
    created: str = "2026-11-30T04:00:00Z",
    message: str = "",
    check: str = CHECK,
) -> dict[str, Any]:
    """A Workload of (name, count, GPUs per pod) pod sets, with these conditions True, owned by
    the Job whose UID is ``job-`` and its name."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "namespace": "ml",
            "name": name,
            "uid": f"w-{name}",
            "creationTimestamp": created,
            "ownerReferences": [
                {"kind": "Job", "name": name, "uid": f"job-{name}", "controller": True}
            ],
        },
        "spec": {
            "queueName": "borrowed",
            "podSets": [
                {
                    "name": name,
                    "count": count,
                    "template": {
                        "metadata": {"annotations": dict(annotations or {})},
                        "spec": {
                            "containers": [
                                {
                                    "name": "train",
                                    "image": "registry.example/train:v1",
                                    "resources": {"limits": {contract.DEFAULT_GPU_RESOURCE: gpus}},
                                }
                            ]
                        },
                    },
                }
                for name, count, gpus in pod_sets
            ],
        },
        "status": {
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "admissionChecks": [{"name": check, "state": state, "message": message}],
        },
    }


def test_pod_sets_are_read_as_the_extender_reads_pods() -> None:
    w = parse_workload(
        workload(("leader", 1, 2), ("workers", 2, 4), annotations={contract.ANN_RELIABILITY: "MA"})
    )
    assert w.key == "ml/job-train-1a2b3"
    assert [(n.name, n.count, n.request.gpus) for n in w.needs] == [
        ("leader", 1, 2),
        ("workers", 2, 4),
    ]
    assert {n.request.min_tier for n in w.needs} == {Tier.MA}
    assert {n.request.namespace for n in w.needs} == {"ml"}
    assert w.quota_reserved
    assert (w.admitted, w.evicted, w.finished) == (False, False, False)
    assert w.checks == {CHECK: "Pending"}
    assert w.owner_uid == "job-job-train-1a2b3"
    assert w.created == 1796011200.0


def test_a_bad_workload_names_every_problem() -> None:
    bad = workload(("main", 2, 4))
    bad["spec"]["podSets"].append({"name": "x", "count": -1, "template": {}})
    bad["spec"]["podSets"].append({"name": "y", "count": 1})
    bad["spec"]["podSets"][0]["template"]["metadata"]["annotations"] = {
        contract.ANN_RELIABILITY: "best"
    }
    with pytest.raises(InvalidInput) as e:
        parse_workload(bad)
    text = str(e.value)
    assert "spec.podSets[1].count" in text
    assert "spec.podSets[2].template" in text
    assert "spec.podSets[0].template" in text
