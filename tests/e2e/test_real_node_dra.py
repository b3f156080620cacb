"""The real node in DRA mode: a kubelet on containerd 2.x with CDI (hack/realnode.sh -d).

``real-dra-0``'s agent runs with ``--dra --no-device-plugin``: it publishes the node's
ResourceSlice from its GpuNode and serves the kubelet's DRA plugin, which prepares a claim by
writing a CDI spec that containerd applies. Its fake GPUs have the tiers cluster-up asked for
(TL_CLUSTER_REAL_DRA_NODE_TIERS, assessed by the agent from a seeded availability history). Pods
are scheduled by the cluster's second kube-scheduler, which has no extenders: no tidelease code
takes part in placing them, only the slice and common.deviceattributes's DeviceClasses.
"""

from __future__ import annotations

from typing import Any

import pytest

from common import contract, deviceattributes
from common.builders import claim_template
from tests.e2e.harness import Cluster, RealNode, unique
from tests.e2e.kube import wait_for
from tests.e2e.test_dra import (  # noqa: F401  (fixtures)
    RESOURCE,
    create_claim_template,
    device_classes,
    plain_scheduler,
)
from tests.e2e.test_dra import slice_of as _slice

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]


def _attribute(device: dict[str, Any], name: str) -> object:
    value = device["attributes"][deviceattributes.qualified(name)]
    return next(iter(value.values()))  # {"string": ...}, {"int": ...} or {"bool": ...}


def _published(cluster: Cluster, node: str) -> dict[str, tuple[object, object, object]]:
    """The node's slice, per device name: (uuid, tier, index)."""
    got = _slice(cluster, node) or {}
    return {
        d["name"]: (
            _attribute(d, deviceattributes.ATTR_UUID),
            _attribute(d, deviceattributes.ATTR_TIER),
            _attribute(d, "index"),
        )
        for d in (got.get("spec") or {}).get("devices") or []
    }


def _gpu_node(cluster: Cluster, node: str) -> dict[str, tuple[object, object, object]]:
    """The node's GpuNode, per device name the slice should give it: (uuid, tier, index)."""
    return {
        f"{deviceattributes.DEVICE_PREFIX}{d['index']}": (d["uuid"], d.get("tier"), d["index"])
        for d in cluster.gpu_node_uuids(node).values()
    }


def test_the_agent_publishes_the_real_nodes_gpus(cluster: Cluster, real_dra_node: RealNode) -> None:
    node = real_dra_node.name
    want = {f"{deviceattributes.DEVICE_PREFIX}{i}" for i in range(real_dra_node.gpus)}

    def mirrored() -> dict[str, tuple[object, object, object]] | None:
        published, gpu_node = _published(cluster, node), _gpu_node(cluster, node)
        return published if set(published) == want and published == gpu_node else None

    published = wait_for(
        mirrored,
        what=f"the ResourceSlice of {node} to mirror its GpuNode",
        timeout=30,
        describe=lambda: f"slice: {_published(cluster, node)}\nGpuNode: {_gpu_node(cluster, node)}",
    )
    # Per device: gpu-<index>, the GpuNode's UUID and tier (equal above), and the tier the
    # cluster asked for that index; the node's own UUIDs, not another fake node's.
    for name, (uuid, tier, index) in published.items():
        assert name == f"{deviceattributes.DEVICE_PREFIX}{index}"
        assert tier == real_dra_node.tiers[int(str(index))], (name, tier)
        assert str(uuid).startswith(f"GPU-{node}-"), uuid
    tiers = {tier for _, tier, _ in published.values()}
    assert "HA" in tiers, f"want an HA device: {published}"
    assert tiers - {"HA"}, f"want non-HA devices too: {published}"

    got = _slice(cluster, node) or {}
    spec = got["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (
        deviceattributes.DRIVER,
        node,
        node,
    )
    assert [o["name"] for o in got["metadata"].get("ownerReferences") or []] == [node]
    # DRA only: the node offers no GPUs as an extended resource.
    status = (cluster.kube.get("Node", node) or {}).get("status") or {}
    assert contract.DEFAULT_GPU_RESOURCE not in (status.get("allocatable") or {}), status


def test_a_claim_for_one_ha_gpu_gets_an_ha_device_into_the_container(
    cluster: Cluster,
    real_dra_node: RealNode,
    namespace: str,
    plain_scheduler: str,  # noqa: F811
    device_classes: list[str],  # noqa: F811
) -> None:
    node, kube = real_dra_node.name, cluster.kube
    assert deviceattributes.CLASS_HA in device_classes
    template = "one-ha-gpu"
    create_claim_template(cluster, claim_template(namespace, template, deviceattributes.CLASS_HA))
    name = unique("dra")
    pod_spec = real_dra_node.pod(
        namespace, name, claim_templates={"gpu": template}, scheduler_name=plain_scheduler
    )
    kube.create(pod_spec)
    pod = cluster.wait_running(namespace, name, timeout=90)
    assert pod["spec"]["nodeName"] == node
    assert pod["spec"]["schedulerName"] == plain_scheduler
    # No extender played a part: it writes its devices on every pod it binds.
    assert contract.ANN_DEVICES not in (pod["metadata"].get("annotations") or {})

    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    assert [s["name"] for s in statuses] == ["gpu"], statuses
    claim_path = (
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{statuses[0]['resourceClaimName']}"
    )
    claim = kube.request("GET", claim_path)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"], r["request"]) for r in results] == [
        (deviceattributes.DRIVER, node, "gpu")
    ]
    device = results[0]["device"]
    devices = _gpu_node(cluster, node)
    uuid, tier, index = devices[device]
    assert tier == "HA", f"{device} of {node} is {tier}: {devices}"
    assert _published(cluster, node)[device] == (uuid, tier, index)

    # The container sees that device and no other: the CDI spec's environment names its UUID,
    # and /dev/nvidia<index> of that device is its only GPU device node.
    env = cluster.exec(namespace, name, "env").splitlines()
    visible = [line for line in env if line.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert visible == [f"NVIDIA_VISIBLE_DEVICES={uuid}"], visible
    listed = cluster.exec(namespace, name, "ls", "/dev").split()
    assert sorted(n for n in listed if n.startswith("nvidia")) == [f"nvidia{index}"], listed

    # Deleted, the pod's claim is unprepared: its CDI spec is gone from the node.
    uid = claim["metadata"]["uid"]
    cdi_dir = real_dra_node.cdi_dir
    assert cdi_dir is not None
    assert [p.name for p in cdi_dir.glob(f"*{uid}*")], f"no CDI spec of claim {uid} in {cdi_dir}"
    kube.delete("Pod", name, namespace)
    wait_for(
        lambda: not list(cdi_dir.glob(f"*{uid}*")),
        what=f"the CDI spec of claim {uid} to be removed",
        timeout=60,
    )
