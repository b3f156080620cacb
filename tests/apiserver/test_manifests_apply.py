"""manifests/ as an admin applies them: `kubectl apply -k manifests/` on a real API server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.apiserver.conftest import ApiServer

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]


def kubectl(apiserver: ApiServer, *args: str) -> str:
    binary = subprocess.run(
        ["bash", "-c", "source hack/lib/common.sh && tl::bin kubectl"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    done = subprocess.run(
        [binary, "--kubeconfig", str(apiserver.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_manifest_applies(apiserver: ApiServer) -> None:
    out = kubectl(apiserver, "apply", "-k", str(ROOT / "manifests"))
    for thing in (
        "customresourcedefinition.apiextensions.k8s.io/gpunodes.tidelease.io",
        "priorityclass.scheduling.k8s.io/tidelease-online",
        "deployment.apps/tidelease-extender",
        "daemonset.apps/tidelease-agent",
        "configmap/tidelease-scheduler-config",
        "clusterrole.rbac.authorization.k8s.io/tidelease-agent",
        "role.rbac.authorization.k8s.io/tidelease-agent-heartbeat",
    ):
        assert thing in out, out
    # The examples are valid pods for this API server.
    kubectl(
        apiserver,
        "apply",
        "--dry-run=server",
        "-n",
        "default",
        "-f",
        str(ROOT / "manifests" / "examples" / "online-job-pod.yaml"),
    )
