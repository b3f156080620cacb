"""The chart's CRDs and the examples agree with the code: the schemas accept what tidelease
writes and refuse what its parsers refuse. What the chart renders is checked in
tests/integration/test_chart.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from common import builders, contract
from common.model import Allocation, GpuUuid, NodeName, Tier
from common.objects import gpu_allocation_object
from extender.demo import demo_objects
from tests.unit.cluster import holder

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
CRDS = MANIFESTS / "charts" / "tidelease" / "crds"


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crd_schema(plural: str) -> dict[str, Any]:
    (crd,) = load(CRDS / f"{plural}.yaml")
    assert crd["spec"]["group"] == contract.GROUP
    (version,) = crd["spec"]["versions"]
    assert version["name"] == contract.VERSION
    return dict(version["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize(
    "obj",
    [o for o in demo_objects() if o["kind"] == contract.KIND_GPU_NODE]
    + [builders.gpu_node("x", builders.devices("x", 2, tier=Tier.LA, healthy=False))],
)
def test_gpu_node_schema_accepts_what_we_write(obj: dict[str, Any]) -> None:
    jsonschema.validate(obj, crd_schema(contract.PLURAL_GPU_NODE))


def test_gpu_allocation_schema_accepts_what_we_write() -> None:
    obj = gpu_allocation_object(
        NodeName("n"), [Allocation(holder("p", owner="a"), (GpuUuid("GPU-1"),), "t")], "3"
    )
    jsonschema.validate(obj, crd_schema(contract.PLURAL_GPU_ALLOCATION))


def test_the_example_lease_is_valid() -> None:
    from extender.rightofreturn.lease import parse_gpu_lease

    (lease,) = load(MANIFESTS / "examples" / "gpulease.yaml")
    lease["metadata"]["namespace"] = "ml"
    jsonschema.validate(lease, crd_schema(contract.PLURAL_GPU_LEASE))
    parsed = parse_gpu_lease(lease)
    assert [e.gpus for e in parsed.spec.schedule] == [32, 8]


@pytest.mark.parametrize("grace", [0, 29, 601])
def test_the_crd_and_the_parser_refuse_the_same_notices(grace: int) -> None:
    """graceSeconds below the minimum (no time to checkpoint) or above the maximum: refused by
    the CRD's schema and by the controller's parser alike; the bounds themselves pass."""
    from common.errors import InvalidInput
    from extender.rightofreturn.lease import MAX_GRACE_S, MIN_GRACE_S, parse_gpu_lease

    (lease,) = load(MANIFESTS / "examples" / "gpulease.yaml")
    lease["metadata"]["namespace"] = "ml"
    schema = crd_schema(contract.PLURAL_GPU_LEASE)
    for ok in (MIN_GRACE_S, MAX_GRACE_S):
        lease["spec"]["graceSeconds"] = ok
        jsonschema.validate(lease, schema)
        assert parse_gpu_lease(lease).spec.grace_s == ok
    lease["spec"]["graceSeconds"] = grace
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(lease, schema)
    with pytest.raises(InvalidInput, match="graceSeconds"):
        parse_gpu_lease(lease)
