"""manifests/ agree with the code: CRD schemas accept what tidelease writes, the scheduler
configuration names the server's verbs."""

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


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crd_schema(plural: str) -> dict[str, Any]:
    (crd,) = load(MANIFESTS / "crds" / f"{plural}.yaml")
    assert crd["spec"]["group"] == contract.GROUP
    (version,) = crd["spec"]["versions"]
    assert version["name"] == contract.VERSION
    return dict(version["schema"]["openAPIV3Schema"])


def test_every_manifest_parses_and_kustomizations_list_existing_files() -> None:
    for path in MANIFESTS.rglob("*.yaml"):
        docs = load(path)
        assert docs, path
        for doc in docs:
            if doc.get("kind") == "Kustomization":
                for res in doc.get("resources", []):
                    assert (path.parent / res).exists(), f"{path}: {res}"


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


def test_scheduler_configuration_registers_every_verb() -> None:
    (cfg,) = load(MANIFESTS / "scheduler" / "kube-scheduler-config.yaml")
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["preemptVerb"], ext["bindVerb"]) == (
        "filter",
        "prioritize",
        "preempt",
        "bind",
    )
    assert ext["nodeCacheCapable"] is True
    assert ext["managedResources"] == [
        {"name": contract.DEFAULT_GPU_RESOURCE, "ignoredByScheduler": False}
    ]
    assert ext["ignorable"] is False
    assert cfg["percentageOfNodesToScore"] == 100


def test_extender_settings_configmap_is_valid(tmp_path: Path) -> None:
    from extender.leasing.lease import parse_gpu_lease
    from extender.scheduler.settings import load_settings

    (cm,) = load(MANIFESTS / "extender" / "settings.yaml")
    f = tmp_path / "settings.yaml"
    f.write_text(cm["data"]["settings.yaml"])
    settings = load_settings(file=f, env={})
    assert settings.standby_targets()
    (lease,) = load(MANIFESTS / "examples" / "gpulease.yaml")
    lease["metadata"]["namespace"] = "ml"
    jsonschema.validate(lease, crd_schema(contract.PLURAL_GPU_LEASE))
    parsed = parse_gpu_lease(lease)
    assert [e.gpus for e in parsed.spec.schedule] == [32, 8]


def _containers(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in MANIFESTS.rglob("*.yaml"):
        for doc in load(path):
            if doc.get("kind") == kind:
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    found.append((path, c))
    return found


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_deployed_command_lines_are_ones_tidelease_accepts(kind: str) -> None:
    """Every flag in the shipped manifests exists, with a value of the right form (a renamed or
    mistyped flag would crash-loop the pods)."""
    from common.cli import parser

    containers = [
        (p, c) for p, c in _containers(kind) if c.get("image", "").startswith("tidelease")
    ]
    assert containers, f"no tidelease {kind} in manifests/"
    for path, container in containers:
        env = {e["name"]: "10.0.0.7" for e in container.get("env") or []}
        args = [a.replace("$(POD_IP)", env.get("POD_IP", "$(POD_IP)")) for a in container["args"]]
        try:
            parsed = parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{path}: tidelease rejects {args}")
        assert callable(parsed.run), path


@pytest.mark.parametrize("grace", [0, 29, 601])
def test_the_crd_and_the_parser_refuse_the_same_notices(grace: int) -> None:
    """graceSeconds below the minimum (no time to checkpoint) or above the maximum: refused by
    the CRD's schema and by the controller's parser alike; the bounds themselves pass."""
    from common.errors import InvalidInput
    from extender.leasing.lease import MAX_GRACE_S, MIN_GRACE_S, parse_gpu_lease

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
