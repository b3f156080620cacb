"""docs/install.md's DRA mode, installed by its command block as written, on a real DRA node.

A real kubelet node of its own in DRA mode with no agent beside it (hack/realnode.sh -d -a:
containerd 2.x reading CDI specs, the kubelet's plugin dirs and the CDI dir bound at the paths
the chart's DaemonSet mounts from the host, 4 stand-in GPU device nodes) joins the local
cluster; the tidelease image built here is imported into its containerd. The doc's block then
installs the chart with `dra.enabled=true` and `extender.enabled=false`: the controllers, the
orchestrator and the agent DaemonSet, whose pod publishes the node's ResourceSlice and serves
the kubelet's DRA plugin; no extender and no kube-scheduler of tidelease's. The cluster's own
kube-scheduler places manifests/examples/dra-online-pod.yaml by the chart's DeviceClass.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import builders, contract, deviceattributes
from tests.e2e.harness import Cluster, RealNode
from tests.e2e.kube import ApiError, wait_for
from tests.e2e.test_dra import RESOURCE, published
from tests.e2e.test_helm_install import (
    RELEASE,
    ROOT,
    Image,
    build_image,
    chart_node,
    run_block,
    uninstall,
)

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]

NAMESPACE = "tidelease-helm-dra"
NODE = "helm-dra-0"
GPUS = 4
POD_TIMEOUT_S = 240
EXAMPLE = ROOT / "manifests" / "examples" / "dra-online-pod.yaml"
ONLINE = "ml"  # the namespace the doc's block names


@dataclass(frozen=True)
class DraNode:
    cluster: Cluster
    node: RealNode
    tidelease: Image
    environment: list[str]  # what this machine needs, added to the doc's helm install


@pytest.fixture(scope="module")
def dra_node(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraNode]:
    tidelease = build_image()
    # A short directory: the kubelet's DRA sockets are under it.
    with chart_node(cluster, tmp_path_factory.mktemp("dra"), NODE, GPUS, "-d") as on:
        assert on.facts["TL_REALNODE_MODE"] == "dra"
        assert on.facts["TL_REALNODE_CONTAINERD_VERSION"].startswith("v2.")
        done = subprocess.run(
            [on.facts["TL_REALNODE_CTR"], "--address", str(on.node.containerd_socket), "-n",
             "k8s.io", "images", "import", "--snapshotter", "overlayfs", str(tidelease.archive)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        try:
            yield DraNode(cluster, on.node, tidelease, on.values)
        finally:
            uninstall(cluster, NAMESPACE)


def wait_ready(cluster: Cluster, component: str, count: int) -> None:
    """Until ``count`` pods of the release's component run, all ready."""

    def ready() -> bool:
        pods = [
            p
            for p in cluster.kube.list(
                "Pod", NAMESPACE, f"app.kubernetes.io/name=tidelease-{component}"
            )
            if not p["metadata"].get("deletionTimestamp")
        ]
        statuses = [c for p in pods for c in (p["status"].get("containerStatuses") or [{}])]
        return len(pods) == count and all(c.get("ready") for c in statuses)

    wait_for(ready, what=f"{count} ready {component} pods", timeout=POD_TIMEOUT_S, interval=1)


def test_the_dra_mode_as_install_md_writes_it_places_the_example_pod(
    dra_node: DraNode, tmp_path: Path
) -> None:
    """The block under install.md's DRA mode, run by bash as written but for the image's
    registry and the release's namespace; then the example's claim template and pod, in the
    namespace the block names, with what this machine needs added (the local image, the real
    node's toleration and node selector). The pod runs on the node with two HA devices of the
    agent pod's slice, chosen by the cluster's kube-scheduler alone (no extender wrote on it),
    and its container sees exactly those GPUs (their UUIDs, through the CDI spec)."""
    cluster, kube = dra_node.cluster, dra_node.cluster.kube
    if kube.get("Namespace", ONLINE) is None:
        kube.create(builders.namespace(ONLINE, online=True))
    run_block(
        cluster, tmp_path, "A third choice is not an extender at all", dra_node.environment,
        **{"REGISTRY/tidelease": dra_node.tidelease.ref.rpartition(":")[0],
           "-n tidelease-system": f"-n {NAMESPACE}"},
    )  # fmt: skip
    for component, count in (("controllers", 2), ("orchestrator", 2), ("agent", 1)):
        wait_ready(cluster, component, count)
    assert not kube.list("Pod", NAMESPACE, "app.kubernetes.io/name=tidelease-extender")
    # The release's own DeviceClasses, and the node's slice from the agent's pod.
    ha = kube.request("GET", f"{RESOURCE}/deviceclasses/{deviceattributes.CLASS_HA}")
    assert ha["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    wait_for(
        lambda: len(published(cluster, NODE)) == GPUS,
        what=f"the slice of {NODE} with {GPUS} devices",
        timeout=POD_TIMEOUT_S,
    )

    template, pod = yaml.safe_load_all(EXAMPLE.read_text())
    name = pod["metadata"]["name"]
    onto = dra_node.node.pod(ONLINE, name)["spec"]
    for key in ("nodeSelector", "tolerations", "terminationGracePeriodSeconds"):
        pod["spec"][key] = onto[key]
    for container in pod["spec"]["containers"]:
        container["image"] = onto["containers"][0]["image"]
        container["imagePullPolicy"] = "Never"
    assert "schedulerName" not in pod["spec"]  # the cluster's own kube-scheduler
    path = f"{RESOURCE}/namespaces/{ONLINE}/resourceclaimtemplates"
    try:
        kube.request("POST", path, template)
        kube.create({**pod, "metadata": {**pod["metadata"], "namespace": ONLINE}})
        running = cluster.wait_running(ONLINE, name, timeout=POD_TIMEOUT_S)
        assert running["spec"]["nodeName"] == NODE
        assert contract.ANN_DEVICES not in (running["metadata"].get("annotations") or {})
        statuses = running["status"].get("resourceClaimStatuses") or []
        assert [s["name"] for s in statuses] == ["gpu"], statuses
        claim: dict[str, Any] = kube.request(
            "GET",
            f"{RESOURCE}/namespaces/{ONLINE}/resourceclaims/{statuses[0]['resourceClaimName']}",
        )
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [(deviceattributes.DRIVER, NODE)] * 2
        devices = published(cluster, NODE)
        chosen = [devices[r["device"]] for r in results]
        assert [d[deviceattributes.ATTR_TIER] for d in chosen] == ["HA", "HA"]
        env = cluster.exec(ONLINE, name, "env").splitlines()
        visible = [line for line in env if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
        assert len(visible) == 1, visible
        uuids = visible[0].split("=", 1)[1].split(",")
        assert sorted(uuids) == sorted(str(d[deviceattributes.ATTR_UUID]) for d in chosen)
    finally:
        kube.delete("Pod", name, ONLINE)
        try:
            kube.request("DELETE", f"{path}/{template['metadata']['name']}")
        except ApiError as e:
            if e.status != 404:
                raise
