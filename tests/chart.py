"""The Helm chart as tests see it: the helm and kubectl that hack/build-binaries.sh builds, and
the chart rendered with given values into parsed objects."""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "manifests" / "charts" / "tidelease"
NAMESPACE = "tidelease-system"


@functools.cache
def binary(name: str) -> str:
    """Path of a binary hack/build-binaries.sh built (kubectl, helm, ...)."""
    return subprocess.run(
        ["bash", "-c", f"source hack/lib/common.sh && tl::bin {name}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@functools.cache
def kube_version() -> str:
    return subprocess.run(
        ["bash", "-c", "source hack/lib/common.sh && echo ${KUBE_VERSION}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def helm(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [binary("helm"), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if check:
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done


def render(*values: str) -> list[dict[str, Any]]:
    """The chart's objects for ``--set``-style values (``key=value``), CRDs included."""
    sets = [a for v in values for a in ("--set", v)]
    out = helm(
        "template",
        "tidelease",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        kube_version(),
        "--include-crds",
        *sets,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def containers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


@dataclass(frozen=True)
class Probe:
    """A container's probe as the chart renders it, Kubernetes' defaults where unset: the
    kubelet acts (restarts, or marks unready) after ``failure_threshold`` failures in a row, a
    probe unanswered within ``timeout_s`` being one."""

    timeout_s: float
    failure_threshold: int


def probe_of(container: dict[str, Any], kind: str) -> Probe:
    """``container``'s ``kind`` probe ("liveness" or "readiness")."""
    spec = container.get(f"{kind}Probe") or {}
    return Probe(float(spec.get("timeoutSeconds", 1)), int(spec.get("failureThreshold", 3)))


def agent_pod(*values: str) -> dict[str, Any]:
    """The agent DaemonSet's pod spec for ``--set``-style values."""
    spec: dict[str, Any] = find(render(*values), "DaemonSet", "tidelease-agent")["spec"]
    return dict(spec["template"]["spec"])
