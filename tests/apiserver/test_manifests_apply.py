"""The chart as an admin installs it, on a real API server: `helm install`, `helm upgrade` to a
new image tag, `helm uninstall`. (No kubelet runs the pods here; tests/e2e/test_helm_install.py
runs them.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

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


def test_install_upgrade_uninstall(apiserver: ApiServer) -> None:
    kubeconfig = ("--kubeconfig", str(apiserver.kubeconfig), "--namespace", NAMESPACE)
    helm("install", RELEASE, str(CHART), "--create-namespace", *kubeconfig, timeout=180)
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

    helm(
        "upgrade", RELEASE, str(CHART), *kubeconfig, "--set", "image.tag=0.1.0-next",
        timeout=180,
    )  # fmt: skip
    for kind, name in (("deployment", "tidelease-extender"), ("daemonset", "tidelease-agent")):
        spec = get(apiserver, kind, name)["spec"]["template"]["spec"]
        images = {c["name"]: c["image"] for c in spec["containers"]}
        assert images[next(iter(images))] == "tidelease:0.1.0-next", images

    helm("uninstall", RELEASE, *kubeconfig, "--wait", timeout=180)
    assert ours(apiserver) == set()
    # The CRDs stay, with the objects they hold (documented in docs/install.md).
    for crd in ("gpunodes", "gpuallocations", "gpuleases"):
        kubectl(apiserver, "get", "crd", f"{crd}.tidelease.io")


def test_cluster_scheduler_certificates_are_kept_across_upgrades_and_renewed_near_their_end(
    apiserver: ApiServer,
) -> None:
    """The chart-made CA and certificates (no cert-manager here) survive an upgrade; an upgrade
    within renewDays of their end makes new leaves (the CA, years away, is kept)."""
    kubeconfig = ("--kubeconfig", str(apiserver.kubeconfig), "--namespace", NAMESPACE)
    mode = ("--set", "scheduling.mode=clusterScheduler")
    names = ("tidelease-extender-ca", "tidelease-extender-tls", "tidelease-scheduler-client")

    def secrets() -> dict[str, dict[str, str]]:
        return {n: get(apiserver, "secret", n)["data"] for n in names}

    helm("install", RELEASE, str(CHART), "--create-namespace", *kubeconfig, *mode, timeout=180)
    try:
        first = secrets()
        assert (
            first["tidelease-extender-tls"]["ca.crt"] == first["tidelease-extender-ca"]["tls.crt"]
        )
        helm("upgrade", RELEASE, str(CHART), *kubeconfig, *mode, timeout=180)
        assert secrets() == first
        # Renewed 400 days ahead of their end: the leaves (365 days) are due, the CA is not.
        early = ("--set", "extender.tls.renewDays=400")
        helm("upgrade", RELEASE, str(CHART), *kubeconfig, *mode, *early, timeout=180)
        renewed = secrets()
        assert renewed["tidelease-extender-ca"] == first["tidelease-extender-ca"]
        for leaf in names[1:]:
            assert renewed[leaf]["tls.crt"] != first[leaf]["tls.crt"], leaf
            assert renewed[leaf]["ca.crt"] == first[leaf]["ca.crt"], leaf
    finally:
        helm("uninstall", RELEASE, *kubeconfig, "--wait", timeout=180)
    assert ours(apiserver) == set()
