"""The chart as an admin installs it, on a real API server: `helm install`, `helm upgrade` to a
new image tag, `helm uninstall`. (No kubelet runs the pods here; tests/e2e/test_helm_install.py
runs them.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.apiserver.conftest import ApiServer
from tests.apiserver.kubectl import Kubectl
from tests.chart import CHART, NAMESPACE, ROOT, helm

pytestmark = pytest.mark.apiserver

RELEASE = "tidelease"


def kubectl(apiserver: ApiServer, *args: str) -> str:
    return Kubectl(apiserver).kubectl(*args)


def ours(apiserver: ApiServer) -> set[tuple[str, str]]:
    """Every object labelled as part of tidelease, namespaced or not: (kind, name)."""
    kinds = (
        "deployments,daemonsets,services,configmaps,secrets,serviceaccounts,roles,rolebindings,"
        "clusterroles,clusterrolebindings,priorityclasses"
    )
    out = kubectl(
        apiserver, "get", kinds, "-A", "-l", "app.kubernetes.io/part-of=tidelease", "-o", "json"
    )
    return {(o["kind"], o["metadata"]["name"]) for o in json.loads(out)["items"]}


def get(apiserver: ApiServer, kind: str, name: str) -> dict[str, Any]:
    out = kubectl(apiserver, "-n", NAMESPACE, "get", kind, name, "-o", "json")
    obj: dict[str, Any] = json.loads(out)
    return obj


def nvidia_runtime_class(apiserver: ApiServer) -> None:
    """The RuntimeClass the NVIDIA container toolkit (or the GPU Operator) makes, stood in."""
    Kubectl(apiserver).apply({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"}, "handler": "nvidia",
    })  # fmt: skip


def test_install_upgrade_uninstall(apiserver: ApiServer) -> None:
    kubeconfig = ("--kubeconfig", str(apiserver.kubeconfig), "--namespace", NAMESPACE)
    # Without the agent's RuntimeClass the install stops with why, not with refused agent pods.
    kubectl(apiserver, "delete", "runtimeclass", "nvidia", "--ignore-not-found")
    done = helm(
        "install", RELEASE, str(CHART), "--create-namespace", *kubeconfig, "--dry-run=server",
        check=False, timeout=180,
    )  # fmt: skip
    assert done.returncode != 0
    assert "agent.runtimeClassName nvidia: the cluster has no such RuntimeClass" in done.stderr
    nvidia_runtime_class(apiserver)
    notes = helm("install", RELEASE, str(CHART), "--create-namespace", *kubeconfig, timeout=180)
    # The install's notes: the defaults grant no namespace, and say so.
    assert "WARNING: extender.leaseNamespaces is empty" in notes.stdout
    assert "WARNING: orchestrator.namespaces is empty" in notes.stdout
    assert "schedulerName: tidelease-scheduler" in notes.stdout
    installed = ours(apiserver)
    for thing in (
        ("Deployment", "tidelease-extender"),
        ("Deployment", "tidelease-orchestrator"),
        ("Deployment", "tidelease-controllers"),
        ("DaemonSet", "tidelease-agent"),
        ("ConfigMap", "tidelease-scheduler-config"),
        ("ClusterRoleBinding", "tidelease-scheduler"),
        ("RoleBinding", "tidelease-scheduler-authentication-reader"),
        ("PriorityClass", "tidelease-online"),
    ):
        assert thing in installed, thing
    for crd in ("gpunodes", "gpuallocations", "gpuleases"):
        kubectl(apiserver, "get", "crd", f"{crd}.tidelease.io")
    # The peer cache has no shared Secret: each agent presents its own projected token.
    assert not [t for t in installed if t[0] == "Secret" and "cache" in t[1]], installed

    # The examples are valid objects for this API server, now that the CRDs are there, in a
    # namespace the admin granted online jobs (the chart's policy refuses them elsewhere).
    examples = "tl-examples"
    kubectl(apiserver, "create", "namespace", examples)
    kubectl(apiserver, "label", "namespace", examples, "tidelease.io/online=true")
    for example in ("online-job-pod.yaml", "gpulease.yaml"):
        kubectl(
            apiserver, "apply", "--dry-run=server", "-n", examples, "-f",
            str(ROOT / "manifests" / "examples" / example),
        )  # fmt: skip
    kubectl(apiserver, "delete", "namespace", examples, "--wait=false")

    kubectl(apiserver, "create", "namespace", "tl-leases")  # where the upgrade grants leases
    notes = helm(
        "upgrade", RELEASE, str(CHART), *kubeconfig, "--set", "image.tag=0.1.0-next",
        "--set", "extender.leaseNamespaces={tl-leases}",
        "--set", "orchestrator.namespaces={tl-leases}",
        timeout=180,
    )  # fmt: skip
    assert "WARNING" not in notes.stdout, notes.stdout  # the namespaces named: nothing to warn
    for kind, name in (("deployment", "tidelease-extender"), ("daemonset", "tidelease-agent")):
        spec = get(apiserver, kind, name)["spec"]["template"]["spec"]
        images = {c["name"]: c["image"] for c in spec["containers"]}
        assert images[next(iter(images))] == "tidelease:0.1.0-next", images

    helm("uninstall", RELEASE, *kubeconfig, "--wait", timeout=180)
    assert ours(apiserver) == set()
    # The CRDs stay, with the objects they hold (documented in docs/install.md).
    for crd in ("gpunodes", "gpuallocations", "gpuleases"):
        kubectl(apiserver, "get", "crd", f"{crd}.tidelease.io")


def test_cluster_scheduler_certificates_are_made_in_the_cluster_not_by_helm(
    apiserver: ApiServer,
) -> None:
    """No certificate or key is in what helm applies (`helm template` stays the same from render
    to render; renewal needs no upgrade): the chart applies the controllers' instructions, the
    ConfigMap tidelease-certificates, and the controllers make the Secrets in the cluster
    (extender/certrotation: tests/apiserver/test_certificate_swap.py, tests/unit)."""
    kubeconfig = ("--kubeconfig", str(apiserver.kubeconfig), "--namespace", NAMESPACE)
    mode = ("--set", "scheduling.mode=clusterScheduler")
    nvidia_runtime_class(apiserver)
    helm("install", RELEASE, str(CHART), "--create-namespace", *kubeconfig, *mode, timeout=180)
    try:
        manifest = helm("get", "manifest", RELEASE, *kubeconfig).stdout
        kinds = {d.get("kind") for d in yaml.safe_load_all(manifest) if isinstance(d, dict)}
        assert "Secret" not in kinds, kinds
        plan = get(apiserver, "configmap", "tidelease-certificates")["data"]["certificates.yaml"]
        assert "tidelease-extender.tidelease-system.svc" in plan  # the serving certificate's name
        helm("upgrade", RELEASE, str(CHART), *kubeconfig, *mode, timeout=180)
        again = get(apiserver, "configmap", "tidelease-certificates")["data"]["certificates.yaml"]
        assert again == plan
    finally:
        helm("uninstall", RELEASE, *kubeconfig, "--wait", timeout=180)
    assert ours(apiserver) == set()
