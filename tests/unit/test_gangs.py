"""A pod's gang and the work its eviction loses (common.gangs), and the gang carried into the
ledger (the holder of its devices)."""

from __future__ import annotations

from typing import Any

import pytest

from common import builders, contract
from common.errors import InvalidInput
from common.gangs import gang_of, saved_at, work_lost_s
from common.model import Allocation, GpuUuid, NodeName
from common.objects import allocation_spec, gpu_allocation_object, parse_gpu_allocation
from common.podrequest import parse_pod


def pod(namespace: str = "team-a", ref: dict[str, Any] | None = None, **ann: str) -> dict[str, Any]:
    extra = {getattr(contract, k): v for k, v in ann.items()}
    obj = builders.pod("w-0", 4, namespace=namespace, extra_annotations=extra)
    if ref is not None:
        obj["spec"]["workloadRef"] = ref
    return obj


@pytest.mark.parametrize(
    ("obj", "gang"),
    [
        (pod(), None),
        (pod(ref={"name": "train", "podGroup": "workers"}), "team-a/workload/train/workers"),
        (
            pod(ref={"name": "train", "podGroup": "workers", "podGroupReplicaKey": "r1"}),
            "team-a/workload/train/workers/r1",
        ),
        (pod(ANN_POD_GROUP="sweep-7"), "team-a/pod-group/sweep-7"),
        # the Workload API's reference wins over the annotation
        (pod(ref={"name": "t", "podGroup": "g"}, ANN_POD_GROUP="x"), "team-a/workload/t/g"),
        # a reference without its group names no gang; the annotation still may
        (pod(ref={"name": "t"}, ANN_POD_GROUP="x"), "team-a/pod-group/x"),
        (pod(ref={"name": "t"}), None),
        (pod(ref="t"), None),  # type: ignore[arg-type]
    ],
)
def test_gang_of(obj: dict[str, Any], gang: str | None) -> None:
    assert gang_of(obj) == gang
    assert parse_pod(obj).gang == gang
    assert parse_pod(obj).holder().gang == gang


def test_a_gang_is_one_namespaces() -> None:
    """The same group's name in two namespaces: two gangs."""
    a = gang_of(pod("team-a", ANN_POD_GROUP="sweep"))
    b = gang_of(pod("team-b", ANN_POD_GROUP="sweep"))
    assert a is not None
    assert a != b


def test_work_lost_is_since_the_last_checkpoint_else_since_the_start() -> None:
    started = pod()
    started["status"] = {"startTime": "2026-11-29T00:00:00Z"}
    start = saved_at(started)
    assert start is not None
    assert work_lost_s(started, start + 3600) == 3600
    saved = pod(ANN_CHECKPOINTED_AT="2026-11-29T00:50:00+00:00")
    saved["status"] = {"startTime": "2026-11-29T00:00:00Z"}
    assert work_lost_s(saved, start + 3600) == 600
    assert work_lost_s(saved, start) == 0  # a checkpoint in our future: clocks differ
    assert work_lost_s(pod(), start) == 0  # not started: nothing to lose
    # A tenant's claim of an old checkpoint buys no protection: no more lost than run.
    old = pod(ANN_CHECKPOINTED_AT="1970-01-01T00:00:00Z")
    old["status"] = {"startTime": "2026-11-29T00:00:00Z"}
    assert work_lost_s(old, start + 3600) == 3600
    naive = pod(ANN_CHECKPOINTED_AT="2026-11-29T00:50:00")  # no offset: not a time
    naive["status"] = {"startTime": "2026-11-29T00:00:00Z"}
    assert work_lost_s(naive, start + 3600) == 3600


def test_the_ledger_keeps_the_holders_gang() -> None:
    holder = parse_pod(pod(ANN_POD_GROUP="sweep")).holder()
    alone = parse_pod(pod("team-b")).holder()
    allocations = (
        Allocation(holder, (GpuUuid("GPU-1"),), "t"),
        Allocation(alone, (GpuUuid("GPU-2"),), "t"),
    )
    spec = allocation_spec(allocations)
    assert spec["allocations"][0]["gang"] == "team-a/pod-group/sweep"
    assert "gang" not in spec["allocations"][1]
    _, back = parse_gpu_allocation(gpu_allocation_object(NodeName("n"), allocations))
    assert back == allocations


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("ANN_POD_GROUP", "sweep-7", True),
        ("ANN_POD_GROUP", "Sweep", False),
        ("ANN_CHECKPOINTED_AT", "2026-11-29T04:00:00Z", True),
        ("ANN_CHECKPOINTED_AT", "2026-11-29T04:00:00", False),
    ],
)
def test_the_annotations_are_checked(key: str, value: str, ok: bool) -> None:
    obj = pod(**{key: value})  # type: ignore[arg-type]
    if ok:
        parse_pod(obj)
    else:
        with pytest.raises(InvalidInput, match=getattr(contract, key)):
            parse_pod(obj)
