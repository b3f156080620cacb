"""GpuNode and GpuAllocation objects: parse, build, and name what is wrong."""

from __future__ import annotations

import pytest

from common import builders
from common.errors import InvalidInput
from common.model import Allocation, GpuUuid, NodeName, Tier
from common.objects import (
    gpu_allocation_object,
    parse_gpu_allocation,
    parse_gpu_node,
)
from tests.unit.cluster import holder


def test_gpu_node_round_trip() -> None:
    devs = (
        builders.devices("n", 2, owner="a")
        + builders.devices("n", 1, standby=True, start=2)
        + builders.devices("n", 1, tier=Tier.LA, healthy=False, start=3)
    )
    obj = builders.gpu_node("n", devs, images=["i"], checkpoints=["c"])
    inv = parse_gpu_node(obj)
    assert inv.devices == tuple(devs)
    assert inv.cache.images == frozenset({"i"})
    assert inv.cache.checkpoints == frozenset({"c"})


def test_gpu_node_problems_are_named() -> None:
    obj = builders.gpu_node("n", builders.devices("n", 3))
    obj["status"]["devices"][0]["tier"] = "XA"
    obj["status"]["devices"][1]["health"] = "Sick"
    obj["status"]["devices"][2]["uuid"] = obj["status"]["devices"][1]["uuid"]
    with pytest.raises(InvalidInput) as err:
        parse_gpu_node(obj)
    text = str(err.value)
    assert "status.devices[0].tier" in text
    assert "status.devices[1].health" in text
    assert "appears twice" in text


def test_unknown_health_defaults_to_unknown_and_is_not_offered() -> None:
    obj = builders.gpu_node("n", builders.devices("n", 1))
    del obj["status"]["devices"][0]["health"]
    assert parse_gpu_node(obj).devices[0].cls.healthy is False


def test_allocation_round_trip() -> None:
    allocs = (Allocation(holder("p", owner="a"), (GpuUuid("GPU-1"),), "2026-01-01T00:00:00Z"),)
    obj = gpu_allocation_object(NodeName("n"), allocs, "7")
    node, parsed = parse_gpu_allocation(obj)
    assert node == "n"
    assert parsed == allocs
    assert obj["metadata"]["resourceVersion"] == "7"


def test_allocation_problems_are_named() -> None:
    obj = gpu_allocation_object(NodeName("n"), ())
    obj["spec"]["allocations"] = [{"podUID": "u"}, "x"]
    with pytest.raises(InvalidInput) as err:
        parse_gpu_allocation(obj)
    assert len(err.value.problems) == 2


def test_a_ledger_written_before_owners_were_namespaced_reads_as_the_pods_namespace() -> None:
    """An entry whose owner names the job alone (an older tidelease wrote it) is the job of the
    pod's own namespace: right of return stays with that namespace after an upgrade."""
    obj = gpu_allocation_object(NodeName("n"), ())
    entry = {"podUID": "u", "namespace": "ml", "name": "p", "devices": ["GPU-1"], "owner": "a"}
    obj["spec"]["allocations"] = [entry, {**entry, "podUID": "v", "owner": "other/a"}]
    _, parsed = parse_gpu_allocation(obj)
    assert [a.holder.owner for a in parsed] == ["ml/a", "other/a"]
