"""The recipe beside NVIDIA's GPU Operator (docs/gpu-operator.md, manifests/examples/gpu-operator):
the operator's own chart (its source pinned as a Go module, GPU_OPERATOR_VERSION in
hack/lib/common.sh) rendered with the recipe's values keeps the driver, the toolkit, GPU Feature
Discovery and the DCGM exporter and turns its device plugin off, with the RuntimeClass name the
agent runs with; tidelease's chart with its half of the recipe puts the agent on the nodes GFD
labels, with that RuntimeClass and NVML. (The operator's components need GPUs: they are
rendered here, not run; tests/apiserver/test_manifests_apply.py checks the RuntimeClass the
chart asks for at install.)"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.chart import CHART, ROOT, find, helm, kube_version, render

RECIPE = ROOT / "manifests" / "examples" / "gpu-operator"


def operator_chart() -> Path:
    """The GPU Operator's chart in its pinned module's source (downloaded when missing)."""
    done = subprocess.run(
        ["bash", "-c", "source hack/lib/common.sh && tl::module_dir github.com/NVIDIA/gpu-operator "
         '"${GPU_OPERATOR_VERSION}" deployments/gpu-operator'],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return Path(done.stdout.strip()) / "deployments" / "gpu-operator"


def rendered(chart: Path, values: Path, *more: str) -> list[dict[str, Any]]:
    out = helm(
        "template", "release", str(chart), "--kube-version", kube_version(), "-f", str(values),
        *more, timeout=180,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def test_the_operator_keeps_its_parts_but_the_device_plugin() -> None:
    objs = rendered(operator_chart(), RECIPE / "operator-values.yaml", "-n", "gpu-operator")
    (policy,) = [o for o in objs if o["kind"] == "ClusterPolicy"]
    spec = policy["spec"]
    enabled = {k: v.get("enabled") for k, v in spec.items() if isinstance(v, dict)}
    assert enabled["devicePlugin"] is False  # tidelease's agent is the device plugin
    for part in ("driver", "toolkit", "gfd", "dcgmExporter"):
        assert enabled[part] is True, part
    assert enabled["migManager"] is False
    assert spec["operator"]["runtimeClass"] == "nvidia"


def test_tidelease_runs_its_agent_where_gfd_labels_with_the_operators_runtime_class() -> None:
    operator = yaml.safe_load((RECIPE / "operator-values.yaml").read_text())
    objs = rendered(CHART, RECIPE / "tidelease-values.yaml")
    agent = find(objs, "DaemonSet", "tidelease-agent")["spec"]["template"]["spec"]
    assert agent["runtimeClassName"] == operator["operator"]["runtimeClass"]
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}  # what GFD sets
    args = agent["containers"][0]["args"]
    assert "--backend=nvml" in args, args
    # An admin's own node label works the same way.
    gfd_label = "agent.nodeSelector.nvidia\\.com/gpu\\.present"
    pool = rendered(
        CHART, RECIPE / "tidelease-values.yaml",
        "--set", f"{gfd_label}=null", "--set", "agent.nodeSelector.pool=gpu",
    )  # fmt: skip
    spec = find(pool, "DaemonSet", "tidelease-agent")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu"}


def test_the_recipe_ships_the_dcgm_dashboard_with_the_series_it_joins() -> None:
    objs = rendered(CHART, RECIPE / "tidelease-values.yaml")
    settings = yaml.safe_load(
        find(objs, "ConfigMap", "tidelease-extender-settings")["data"]["settings.yaml"]
    )
    assert settings["gpu_info_metric"] is True
    dashboard = find(objs, "ConfigMap", "tidelease-dashboard-dcgm")
    assert '"uid": "tidelease-dcgm"' in next(iter(dashboard["data"].values()))
    # The operator's DCGM exporter is on: the dashboard has something to join.
    operator = yaml.safe_load((RECIPE / "operator-values.yaml").read_text())
    assert operator["dcgmExporter"]["enabled"] is True
    # Without the recipe's values the chart exports no per-GPU series.
    plain = find(render(), "ConfigMap", "tidelease-extender-settings")
    assert "gpu_info_metric" not in yaml.safe_load(plain["data"]["settings.yaml"])
