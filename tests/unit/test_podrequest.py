"""The pod-author contract: every annotation, its default, and what an invalid value gets."""

from __future__ import annotations

from typing import Any

import pytest

from common import builders, contract
from common.checkpointref import CheckpointRef, parse_checkpoint_ref
from common.errors import InvalidInput
from common.model import Priority, Tier
from common.podrequest import parse_pod


def test_defaults_when_no_annotation() -> None:
    req = parse_pod(builders.pod("p", 2))
    assert (req.gpus, req.priority, req.min_tier, req.owner, req.gpu_type, req.reclaim) == (
        2,
        Priority.LOW,
        Tier.LA,
        None,
        None,
        False,
    )
    assert req.pod_priority == 0
    assert req.images == frozenset({"registry.example/train:v1"})


def test_every_annotation_is_read() -> None:
    req = parse_pod(
        builders.pod(
            "p",
            4,
            priority=Priority.HIGH,
            owner="recsys",
            tier=Tier.MA,
            gpu_type="H20",
            reclaim=True,
            checkpoint="ck-1",
            pod_priority=1000,
            priority_class="tidelease-online",
            controller=("StatefulSet", "recsys"),
        )
    )
    assert req.priority is Priority.HIGH
    assert req.owner == "default/recsys"  # the job of the pod's own namespace
    assert req.min_tier is Tier.MA
    assert req.gpu_type == "H20"
    assert req.reclaim is False  # declared, but a reclaim is the view's to derive
    assert req.controller == ("StatefulSet", "recsys")
    assert req.priority_class == "tidelease-online"
    assert req.checkpoint == "ck-1"
    assert req.pod_priority == 1000


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({contract.ANN_PRIORITY: "urgent"}, "invalid value 'urgent' (want high or low)"),
        ({contract.ANN_RELIABILITY: "ha"}, "invalid value 'ha' (want HA or LA or MA)"),
        ({contract.ANN_RECLAIM: "yes"}, "invalid value 'yes' (want false or true)"),
        ({contract.ANN_OWNER: "Job_A"}, "invalid job name 'Job_A'"),
        ({contract.ANN_GPU_TYPE: "H20 SXM"}, "invalid GPU type 'H20 SXM'"),
    ],
    ids=[
        "priority",
        "tier-case",
        "reclaim-bool",
        "owner-name",
        "gpu-type",
    ],
)
def test_invalid_annotations_are_named(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_pod(builders.pod("p", 1, extra_annotations=annotations))
    assert any(message in p for p in err.value.problems), err.value.problems


def test_all_problems_reported_at_once() -> None:
    pod = builders.pod(
        "p", 1, extra_annotations={contract.ANN_PRIORITY: "x", contract.ANN_RELIABILITY: "y"}
    )
    with pytest.raises(InvalidInput) as err:
        parse_pod(pod)
    assert len(err.value.problems) == 2


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("0", 0), ("8", 8), (3, 3)],
    ids=["zero", "string", "int"],
)
def test_gpu_quantities(quantity: Any, expected: int) -> None:
    pod = builders.pod("p", 1)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = quantity
    assert parse_pod(pod).gpus == expected


@pytest.mark.parametrize("quantity", ["1.5", "500m", "-1", True, None, [1]], ids=str)
def test_bad_gpu_quantities(quantity: Any) -> None:
    pod = builders.pod("p", 1)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = quantity
    if quantity is None:  # a limit of null falls back to the request
        pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "x"
    with pytest.raises(InvalidInput, match="whole number of GPUs"):
        parse_pod(pod)


def test_gpus_sum_over_containers_and_init_containers_take_the_max() -> None:
    pod = builders.pod("p", 2)
    pod["spec"]["containers"].append(
        {"name": "side", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    )
    assert parse_pod(pod).gpus == 3
    pod["spec"]["initContainers"] = [
        {"name": "init", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "5"}}}
    ]
    assert parse_pod(pod).gpus == 5


def test_request_without_limit_counts() -> None:
    pod = builders.pod("p", 0)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "2"}}
    assert parse_pod(pod).gpus == 2


def test_other_resource_name() -> None:
    pod = builders.pod("p", 2, resource="example.com/gpu")
    assert parse_pod(pod).gpus == 0
    assert parse_pod(pod, resource="example.com/gpu").gpus == 2


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.__setitem__("metadata", "x"),
        lambda p: p["metadata"].pop("uid"),
        lambda p: p["metadata"].__setitem__("annotations", {"a": 1}),
        lambda p: p["spec"].__setitem__("containers", {}),
        lambda p: p["spec"].__setitem__("priority", "high"),
        lambda p: p["spec"]["containers"][0].__setitem__("resources", []),
    ],
    ids=["metadata", "uid", "annotation-type", "containers", "priority", "resources"],
)
def test_malformed_pods_raise_invalid_input(mutate: Any) -> None:
    pod = builders.pod("p", 1)
    mutate(pod)
    with pytest.raises(InvalidInput):
        parse_pod(pod)


def test_non_object_pod() -> None:
    with pytest.raises(InvalidInput, match="Pod must be an object"):
        parse_pod([])


@pytest.mark.parametrize(
    ("annotations", "needle"),
    [
        pytest.param({contract.ANN_JOB_CLASS: "urgent"}, "job-class", id="job-class"),
        pytest.param({contract.ANN_ELASTIC: "maybe"}, "elastic", id="elastic"),
        pytest.param({contract.ANN_THROUGHPUT: "100,fast"}, "throughput", id="throughput"),
        pytest.param({contract.ANN_THROUGHPUT: "100,-1"}, "throughput", id="negative"),
    ],
)
def test_bad_planner_annotations_are_named(annotations: dict[str, str], needle: str) -> None:
    pod = builders.pod("p", 1, extra_annotations=annotations)
    with pytest.raises(InvalidInput, match=needle):
        parse_pod(pod)


def test_good_planner_annotations_pass() -> None:
    pod = builders.pod(
        "p",
        1,
        extra_annotations={
            contract.ANN_JOB_CLASS: "interactive",
            contract.ANN_ELASTIC: "false",
            contract.ANN_THROUGHPUT: "100,190.5,270",
        },
    )
    assert parse_pod(pod).gpus == 1


def test_a_checkpoint_pinned_by_digest_is_cached_under_its_id() -> None:
    digest = "ab" * 32
    pod = builders.pod("p", 1, checkpoint=f"ck-1@sha256:{digest.upper()}")
    assert parse_pod(pod).checkpoint == "ck-1"
    ref = parse_checkpoint_ref(f"ck-1@sha256:{digest.upper()}")
    assert ref == CheckpointRef("ck-1", digest)
    assert str(ref) == f"ck-1@sha256:{digest}"
    assert parse_checkpoint_ref("ck-1") == CheckpointRef("ck-1", None)


@pytest.mark.parametrize(
    "value", ["ck-1@sha256:abc", "ck-1@md5:" + "ab" * 16, "ck-1@", "@sha256:" + "ab" * 32]
)
def test_a_bad_checkpoint_pin_is_named(value: str) -> None:
    with pytest.raises(InvalidInput, match=contract.ANN_CHECKPOINT):
        parse_pod(builders.pod("p", 1, checkpoint=value))


def test_a_pod_names_only_a_job_of_its_own_namespace() -> None:
    """Owners are namespaced: the same job name in two namespaces is two owners."""
    a = parse_pod(builders.pod("p", 1, namespace="a", owner="tidewater"))
    b = parse_pod(builders.pod("p", 1, namespace="b", owner="tidewater"))
    assert (a.owner, b.owner) == ("a/tidewater", "b/tidewater")
