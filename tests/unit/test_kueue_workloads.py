"""Kueue Workloads as tidelease's admission check reads them (extender.kueue.workloads): pod sets
read by the extender's own pod parser, Kueue's conditions, and what the check says: Ready once
the lent GPUs hold every pod, Pending until then, nothing for a workload Kueue has not chosen,
has evicted or has finished."""

from __future__ import annotations

from typing import Any

import pytest

from common import contract
from common.errors import InvalidInput
from common.model import DeviceClass, JobKey, NodeName, Tier
from extender.kueue.workloads import API_VERSION, judge, parse_workload

CHECK = "tidelease-lent-gpus"
LENT = DeviceClass("H20", Tier.HA, True, JobKey("online/recsys"))


def workload(
    *pod_sets: tuple[str, int, int],
    conditions: tuple[str, ...] = ("QuotaReserved",),
    state: str = "Pending",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Workload of (name, count, GPUs per pod) pod sets, with these conditions True."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"namespace": "ml", "name": "job-train-1a2b3", "uid": "w-1"},
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
            "admissionChecks": [{"name": CHECK, "state": state, "message": ""}],
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


def test_ready_once_the_lent_gpus_hold_every_pod() -> None:
    """The issue's example: 2 pods x 4 GPUs Pending while fewer than 8 are lent, Ready at 8."""
    w = parse_workload(workload(("main", 2, 4)))
    seven = {NodeName("n1"): {LENT: 4}, NodeName("n2"): {LENT: 3}}
    pending = judge(w, CHECK, seven)
    assert pending.state == "Pending"
    assert "waiting for lent GPUs" in pending.message
    eight = {NodeName("n1"): {LENT: 4}, NodeName("n2"): {LENT: 4}}
    ready = judge(w, CHECK, eight)
    assert ready.state == "Ready"
    assert ready.verdict is not None
    assert ready.verdict.reservation is not None
    assert ready.verdict.reservation.gpus == 8


@pytest.mark.parametrize(
    ("conditions", "state", "why"),
    [
        ((), "Pending", "no quota reserved"),
        (("QuotaReserved", "Evicted"), "Pending", "Kueue resets"),
        (("QuotaReserved", "Finished"), "Pending", "Kueue resets"),
        (("QuotaReserved", "Admitted"), "Ready", "already Ready"),
    ],
)
def test_left_alone_when_kueue_has_not_chosen_it_or_is_done_with_it(
    conditions: tuple[str, ...], state: str, why: str
) -> None:
    w = parse_workload(workload(("main", 1, 1), conditions=conditions, state=state))
    lots = {NodeName("n1"): {LENT: 8}}
    judged = judge(w, CHECK, lots)
    assert judged.state is None
    assert why in judged.message


def test_a_workload_without_the_check_is_not_ours() -> None:
    w = parse_workload(workload(("main", 1, 1)))
    assert judge(w, "another-check", {NodeName("n1"): {LENT: 8}}).state is None
