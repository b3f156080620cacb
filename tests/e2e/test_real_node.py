"""The real node: a kubelet on Debian's containerd beside the kwok nodes (hack/realnode.sh).

Pods run for real from the local images of hack/images.py; GPU pods go through kube-scheduler and
the extender, and the tidelease agent's device plugin (fake GPUs) hands the container exactly the
devices the extender wrote on the pod. The real node in DRA mode: test_real_node_dra.py.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from common import builders, contract
from tests.e2e.harness import (
    BORROWER,
    ONLINE,
    REAL_NODE_TAINT,
    Cluster,
    RealNode,
    devices_of,
    unique,
    workload,
)
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
    # kube-scheduler no longer names the taint (1.35: "1 node(s) had untolerated taint(s)"), and
    # it checks taints before the node selector: the nodes it turns away by a taint are the real
    # nodes (this one, and the one in DRA mode when the cluster has it), and the only taint each
    # carries is the real-node one.
    real_nodes = [n.name for n in (real_node, cluster.real_dra_node) if n is not None]
    assert f"{len(real_nodes)} node(s) had untolerated taint" in message
    for name in real_nodes:
        node = cluster.kube.get("Node", name) or {}
        taints = [(t["key"], t.get("effect")) for t in node.get("spec", {}).get("taints") or []]
        assert taints == [(REAL_NODE_TAINT, "NoSchedule")], name


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


def test_a_two_gpu_pod_gets_two_devices_behind_one_pcie_switch(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    """The real node's fake GPUs are laid out as 2 sockets of 2 PCIe switches, 2 GPUs behind
    each (``pcie-2socket-8``: GPUs 0-1, 2-3, 4-5, 6-7 share a switch; tests/e2e/conftest.py),
    published on its GpuNode. With one GPU taken by a one-GPU pod (GPU 0 on an idle node), the
    lowest free pair spans two switches; a two-GPU pod gets the first free pair behind one
    switch instead (docs/reference.md, the topology tie-break), and its container sees exactly
    those two devices."""
    gpu_node = cluster.kube.get(contract.KIND_GPU_NODE, real_node.name)
    assert gpu_node is not None
    links = {
        (link["a"], link["b"]): link["link"] for link in gpu_node["status"]["topology"]["links"]
    }
    assert links[(0, 1)] == "SamePCIeSwitch"
    assert links[(1, 2)] == "SameHostBridge"
    assert links[(3, 4)] == "AcrossSockets"
    node_devices = cluster.gpu_node_uuids(real_node.name)
    index = {u: d["index"] for u, d in node_devices.items()}

    def held() -> set[int]:
        """The GPUs the node's pods hold, terminating ones too (the kubelet counts them)."""
        on_node = f"--field-selector=spec.nodeName={real_node.name}"
        pods = json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json", on_node))["items"]
        return {index[u] for p in pods for u in devices_of(p) if u in index}

    # Earlier tests' pods may still be going: start from an idle node, or nothing is shown.
    wait_for(lambda: not held(), what=f"no GPU pod left on {real_node.name}", timeout=120)
    one, two = unique("one"), unique("two")
    cluster.kube.create(real_node.pod(namespace, one, gpus=1))
    (first,) = devices_of(cluster.wait_bound(namespace, one))
    assert index[first] == 0  # one GPU: the lowest index, as ever
    taken = held()
    assert taken == {0}, f"GPUs {sorted(taken)} held"
    cluster.kube.create(real_node.pod(namespace, two, gpus=2))
    uuids = devices_of(cluster.wait_bound(namespace, two))
    # The lowest free pair, (1, 2), spans two switches: the first pair behind one is (2, 3).
    assert sorted(index[u] for u in uuids) == [2, 3], uuids
    cluster.wait_running(namespace, two)
    env = cluster.exec(namespace, two, "env")
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}" in env.splitlines()
    listed = cluster.exec(namespace, two, "ls", "/dev").split()
    assert sorted(n for n in listed if n.startswith("nvidia")) == sorted(
        f"nvidia{index[u]}" for u in uuids
    )


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


def test_a_job_whose_borrower_a_reclaim_evicts_does_not_count_a_failure(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    """A borrower Job with ``podFailurePolicy: Ignore on DisruptionTarget`` and no retries
    (backoffLimit 0) on devices an online job lent. The reclaim takes them back past the
    borrower's PodDisruptionBudget (deleted, not evicted: Kubernetes adds no condition of its
    own then): the pod carries DisruptionTarget (reason TideleaseReclaim), the Job does not fail,
    and its replacement pod waits. Right of return on the real kubelet, per replica: the
    returning replica's container sees exactly the devices it lent (NVIDIA_VISIBLE_DEVICES and
    its /dev nodes), and the replica that stayed kept its own."""
    ns, kube = namespace, cluster.kube
    cluster.ensure_priority_class(BORROWER, 10)
    gpus = real_node.gpus // 2
    owner_pod = real_node.pod(
        ns,
        "template",
        gpus=gpus,
        annotations={contract.ANN_PRIORITY: "high", contract.ANN_OWNER: "recsys"},
    )
    owner_pod["spec"]["priorityClassName"] = ONLINE
    kube.create(workload("StatefulSet", "recsys", ns, owner_pod, replicas=2))
    lease = builders.gpu_lease("recsys", ns, gpus_per_replica=gpus, desired_gpus=2 * gpus)
    kube.create(lease)
    held = {
        f"recsys-{i}": devices_of(cluster.wait_running(ns, f"recsys-{i}", timeout=90))
        for i in range(2)
    }
    kube.patch(contract.KIND_GPU_LEASE, "recsys", {"spec": {"desiredGPUs": gpus}}, ns)

    def lent() -> list[str] | None:
        got = kube.get(contract.KIND_GPU_LEASE, "recsys", ns) or {}
        status = got.get("status") or {}
        devices = [u for g in status.get("lent") or [] for u in g.get("devices") or []]
        return devices if status.get("phase") == "Steady" and len(devices) == gpus else None

    lent_devices = wait_for(lent, what=f"{gpus} devices lent", timeout=60)
    groups = (kube.get(contract.KIND_GPU_LEASE, "recsys", ns) or {})["status"]["lent"]
    assert [(g["replica"], sorted(g["devices"])) for g in groups] == [
        ("recsys-1", sorted(held["recsys-1"]))
    ]

    borrower = real_node.pod(ns, "template", gpus=gpus, annotations={contract.ANN_PRIORITY: "low"})
    spec = borrower["spec"]
    spec["priorityClassName"] = BORROWER
    spec["restartPolicy"] = "Never"
    # A training process stopped mid-run exits non-zero: without the policy, a failure.
    spec["containers"][0]["command"] = [
        "/bin/sh",
        "-c",
        "trap 'exit 143' TERM; sleep 2147483647 & wait",
    ]
    kube.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "finetune", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "finetune"}}},
        }
    )
    ignore_reclaims = {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
    }
    kube.create(
        workload("Job", "finetune", ns, borrower, backoffLimit=0, podFailurePolicy=ignore_reclaims)
    )

    def running_borrower() -> dict[str, Any] | None:
        for p in kube.list("Pod", ns):
            if (
                p["metadata"]["name"].startswith("finetune-")
                and (p.get("status") or {}).get("phase") == "Running"
            ):
                return p
        return None

    first = wait_for(running_borrower, what="the borrower running", timeout=90)
    assert sorted(devices_of(first)) == sorted(lent_devices)
    name = first["metadata"]["name"]

    kube.patch(contract.KIND_GPU_LEASE, "recsys", {"spec": {"desiredGPUs": 2 * gpus}}, ns)
    seen: dict[str, Any] = {}

    def disrupted() -> dict[str, Any] | None:
        pod = kube.get("Pod", name, ns)
        if pod is None:
            return seen or None
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c["type"] == "DisruptionTarget":
                seen.update(c)
        return seen if seen and pod["metadata"].get("deletionTimestamp") else None

    condition = wait_for(disrupted, what=f"{name} marked DisruptionTarget", timeout=60)
    assert (condition["status"], condition["reason"]) == ("True", "TideleaseReclaim"), condition

    def reclaimed() -> dict[str, Any] | None:
        got = kube.get(contract.KIND_GPU_LEASE, "recsys", ns) or {}
        status = got.get("status") or {}
        return status if status.get("phase") == "Steady" and status.get("reclaims") else None

    def lease_and_pods() -> str:
        lease = kube.get(contract.KIND_GPU_LEASE, "recsys", ns) or {}
        pods = {
            p["metadata"]["name"]: (
                (p.get("status") or {}).get("phase"),
                p["spec"].get("nodeName"),
                (p["metadata"].get("annotations") or {}).get(contract.ANN_DEVICES),
                bool(p["metadata"].get("deletionTimestamp")),
            )
            for p in kube.list("Pod", ns)
        }
        return f"lease status: {lease.get('status')}\npods (phase, node, devices, deleting): {pods}"

    wait_for(reclaimed, what="the reclaim to finish", timeout=90, describe=lease_and_pods)
    node_devices = cluster.gpu_node_uuids(real_node.name)
    for replica, before in held.items():
        pod = cluster.wait_running(ns, replica, timeout=90)
        assert sorted(devices_of(pod)) == sorted(before), replica
        env = cluster.exec(ns, replica, "env").splitlines()
        visible = [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        assert len(visible) == 1, env
        assert sorted(visible[0].partition("=")[2].split(",")) == sorted(before), replica
        listed = cluster.exec(ns, replica, "ls", "/dev").split()
        assert sorted(n for n in listed if n.startswith("nvidia")) == sorted(
            f"nvidia{node_devices[u]['index']}" for u in before
        ), replica

    def replaced() -> dict[str, Any] | None:
        job = kube.get("Job", "finetune", ns) or {}
        pods = [p for p in kube.list("Pod", ns) if p["metadata"]["name"].startswith("finetune-")]
        others = [p for p in pods if p["metadata"]["name"] != name]
        return job if others else None

    def describe() -> str:
        job = kube.get("Job", "finetune", ns) or {}
        pods = {
            p["metadata"]["name"]: (p.get("status") or {}).get("phase")
            for p in kube.list("Pod", ns)
        }
        return f"job status: {job.get('status')}\npods: {pods}"

    job = wait_for(replaced, what="the Job's replacement pod", timeout=60, describe=describe)
    status = job.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    assert conditions.get("Failed") != "True", status
    assert not status.get("failed"), status
