"""Hot restart on the real node: a wished image change of an opted-in pod becomes a restart of
that container inside the existing sandbox (the operator in the extender writes the request, the
node agent pre-pulls through containerd's CRI and has the kubelet restart the container in place).
The pod keeps its UID and IP; a wish for an image that cannot be had leaves the old container
running and says why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common import contract
from tests.e2e.harness import Cluster, RealNode, unique
from tests.e2e.kube import get_text, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]

V1 = "docker.io/local/app:v1"
V2 = "docker.io/local/app:v2"


def status_of(pod: dict[str, Any]) -> dict[str, Any]:
    raw = (pod["metadata"].get("annotations") or {}).get(contract.ANN_HOT_RESTART_STATUS)
    return json.loads(raw) if raw else {}


def container_id(pod: dict[str, Any]) -> str:
    statuses = pod["status"].get("containerStatuses") or []
    return str(statuses[0].get("containerID", "")) if statuses else ""


def wish(cluster: Cluster, namespace: str, name: str, image: str) -> None:
    cluster.kube.patch(
        "Pod",
        name,
        {"metadata": {"annotations": {contract.ANN_HOT_RESTART_IMAGE: f"app={image}"}}},
        namespace,
    )


def wait_outcome(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        pod = cluster.pod(namespace, name)
        return pod if status_of(pod).get("phase") in ("Succeeded", "Failed") else None

    return wait_for(
        ended,
        what=f"the hot restart of {namespace}/{name} to end",
        timeout=90,
        describe=lambda: (
            f"status: {status_of(cluster.pod(namespace, name))}\n"
            f"agent log:\n{cluster.log_tail('realnode/agent.log', 20)}"
        ),
    )


@pytest.fixture
def opted_in(cluster: Cluster, real_node: RealNode, namespace: str) -> tuple[str, dict[str, Any]]:
    name = unique("train")
    cluster.kube.create(
        real_node.pod(namespace, name, annotations={contract.ANN_HOT_RESTART: "true"})
    )
    return name, cluster.wait_running(namespace, name)


def test_a_wished_image_change_restarts_the_container_in_place(
    cluster: Cluster, namespace: str, opted_in: tuple[str, dict[str, Any]]
) -> None:
    name, before = opted_in
    ip = before["status"]["podIP"]
    assert get_text(f"http://{ip}:8080/version").strip() == "v1"

    wish(cluster, namespace, name, V2)
    after = wait_outcome(cluster, namespace, name)
    outcome = status_of(after)
    assert outcome["phase"] == "Succeeded", outcome

    after = cluster.wait_running(namespace, name)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # the same pod, not a new one
    assert after["status"]["podIP"] == ip
    assert after["spec"]["containers"][0]["image"] == V2
    assert container_id(after) != container_id(before)
    assert outcome["newContainerId"] in container_id(after)
    assert outcome["oldContainerId"] in container_id(before)
    # The new image answers on the same address.
    assert get_text(f"http://{ip}:8080/version").strip() == "v2"
    reasons = {
        e.get("reason")
        for e in cluster.kube.list("Event", namespace)
        if e["involvedObject"]["name"] == name
    }
    assert {"HotRestartRequested", "HotRestarted"} <= reasons, reasons


def test_an_image_that_cannot_be_pulled_leaves_the_old_container_running(
    cluster: Cluster, namespace: str, opted_in: tuple[str, dict[str, Any]]
) -> None:
    name, before = opted_in
    wish(cluster, namespace, name, "docker.io/local/absent:v1")
    after = wait_outcome(cluster, namespace, name)
    outcome = status_of(after)
    assert outcome["phase"] == "Failed"
    assert "absent" in outcome["reason"] or "pull" in outcome["reason"].lower(), outcome

    after = cluster.wait_running(namespace, name)
    assert after["spec"]["containers"][0]["image"] == V1
    assert container_id(after) == container_id(before)  # never touched
    assert get_text(f"http://{after['status']['podIP']}:8080/version").strip() == "v1"


def test_a_statefulset_template_change_hot_restarts_its_pods(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    """With updateStrategy OnDelete and an opted-in template, changing the template's image
    restarts each pod's container in place: no pod is re-created."""
    template = real_node.pod(namespace, "template", annotations={contract.ANN_HOT_RESTART: "true"})
    cluster.kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "trainer", "namespace": namespace},
            "spec": {
                "replicas": 2,
                "serviceName": "trainer",
                "podManagementPolicy": "Parallel",
                "updateStrategy": {"type": "OnDelete"},
                "selector": {"matchLabels": {"app": "trainer"}},
                "template": {
                    "metadata": {
                        "labels": {"app": "trainer"},
                        "annotations": template["metadata"]["annotations"],
                    },
                    "spec": template["spec"],
                },
            },
        }
    )
    names = ["trainer-0", "trainer-1"]
    before = {n: cluster.wait_running(namespace, n) for n in names}

    containers = template["spec"]["containers"]
    containers[0]["image"] = V2
    cluster.kube.patch(
        "StatefulSet",
        "trainer",
        {"spec": {"template": {"spec": {"containers": containers}}}},
        namespace,
    )
    for name in names:
        outcome = status_of(wait_outcome(cluster, namespace, name))
        assert outcome["phase"] == "Succeeded", outcome
        after = cluster.wait_running(namespace, name)
        assert after["metadata"]["uid"] == before[name]["metadata"]["uid"]
        assert after["status"]["podIP"] == before[name]["status"]["podIP"]
        assert get_text(f"http://{after['status']['podIP']}:8080/version").strip() == "v2"
