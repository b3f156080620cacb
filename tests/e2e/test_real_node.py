"""The real node: a kubelet on Debian's containerd beside the kwok nodes (hack/realnode.sh).

Pods run for real from the local images of hack/images.py; GPU pods go through kube-scheduler and
the extender, and the tidelease agent's device plugin (fake GPUs) hands the container exactly the
devices the extender wrote on the pod.
"""

from __future__ import annotations

import ipaddress

import pytest

from common import contract
from tests.e2e.harness import REAL_NODE_TAINT, Cluster, RealNode, devices_of, unique
from tests.e2e.kube import get_text, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]


def test_a_pod_runs_on_the_real_node(cluster: Cluster, real_node: RealNode, namespace: str) -> None:
    name = unique("app")
    cluster.kube.create(real_node.pod(namespace, name))
    pod = cluster.wait_running(namespace, name)

    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["hostIP"] == real_node.ip
    # Served by the container itself, on the node's pod bridge (reachable from this host).
    assert get_text(f"http://{pod['status']['podIP']}:8080/version").strip() == "v1"
    # Logs and exec go through the API server to the kubelet (client-certificate auth).
    assert "app v1 started" in cluster.kubectl("logs", "-n", namespace, name)
    assert cluster.exec(namespace, name, "cat", "/www/version").strip() == "v1"


def test_pods_not_tolerating_the_real_node_stay_off_it(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    pod = real_node.pod(namespace, unique("intruder"))
    del pod["spec"]["tolerations"]
    cluster.kube.create(pod)
    message = cluster.wait_unschedulable(namespace, pod["metadata"]["name"], "untolerated taint")
    # kube-scheduler no longer names the taint (1.35: "1 node(s) had untolerated taint(s)"): the
    # pod selects the real node alone, so the one node turned away by a taint is the real node,
    # and the only taint it carries is the real-node one.
    assert "1 node(s) had untolerated taint" in message
    node = cluster.kube.get("Node", real_node.name) or {}
    taints = [(t["key"], t.get("effect")) for t in node.get("spec", {}).get("taints") or []]
    assert taints == [(REAL_NODE_TAINT, "NoSchedule")]


def test_gpu_containers_get_the_devices_the_extender_chose(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    sizes = {unique("one"): 1, unique("two"): 2, unique("three"): 3}
    assert sum(sizes.values()) <= real_node.gpus
    node_devices = cluster.gpu_node_uuids(real_node.name)
    chosen: dict[str, list[str]] = {}
    for name, gpus in sizes.items():
        cluster.kube.create(real_node.pod(namespace, name, gpus=gpus))
        chosen[name] = devices_of(cluster.wait_bound(namespace, name))
    for name, gpus in sizes.items():
        pod = cluster.wait_running(namespace, name)
        uuids = chosen[name]
        assert len(uuids) == gpus
        assert pod["metadata"]["annotations"][contract.ANN_DEVICE_NODE] == real_node.name
        # The container sees the extender's devices: by UUID for the NVIDIA runtime, and as
        # exactly those device nodes (the fake GPU with index i is /dev/nvidia<i>).
        env = cluster.exec(namespace, name, "env")
        assert f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}" in env.splitlines()
        listed = cluster.exec(namespace, name, "ls", "/dev").split()
        nodes = sorted(n for n in listed if n.startswith("nvidia"))
        assert nodes == sorted(f"nvidia{node_devices[u]['index']}" for u in uuids)
    every = [u for uuids in chosen.values() for u in uuids]
    assert len(set(every)) == len(every), f"a device was given twice: {chosen}"


def test_the_real_node_gives_every_pod_its_own_address(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    names = [unique("ip") for _ in range(2)]
    for name in names:
        cluster.kube.create(real_node.pod(namespace, name))
    ips = [
        ipaddress.ip_address(cluster.wait_running(namespace, n)["status"]["podIP"]) for n in names
    ]
    assert ips[0] != ips[1]
    # Both on the node's own pod network (a /24 of its containerd's CNI bridge).
    assert ipaddress.ip_network(f"{ips[0]}/24", strict=False) == ipaddress.ip_network(
        f"{ips[1]}/24", strict=False
    )

    cluster.kube.delete("Pod", names[0], namespace)
    wait_for(
        lambda: cluster.kube.get("Pod", names[0], namespace) is None,
        what=f"pod {names[0]} to be gone",
        timeout=30,
    )
