"""GPU pods through the real kube-scheduler and the tidelease extender (filter, prioritize, bind).

Each test builds the device layout it needs on nodes of its own (see harness.NodeGroup), creates
pods the way a pod author would (annotations of common.contract, tidelease's PriorityClasses),
and checks what the extender wrote on them at bind time against the GpuNode objects.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from common import builders, contract
from common.model import Priority
from tests.e2e.harness import BORROWER, ONLINE, Cluster, NodeGroup, devices_of

pytestmark = pytest.mark.cluster

b = builders


def test_gpu_pods_are_bound_with_devices_of_their_gpunode(cluster: Cluster, namespace: str) -> None:
    """(a) On the cluster's shared nodes: every pod bound, its devices from its node's GpuNode."""
    sizes = [1, 2, 4, 8, 3, 1]  # 19 of the 4 x 8 GPUs
    for i, gpus in enumerate(sizes):
        pod = b.pod(f"p{i}", gpus, namespace=namespace, priority=Priority.LOW)
        del pod["metadata"]["uid"], pod["status"]
        pod["spec"]["terminationGracePeriodSeconds"] = 0
        cluster.kube.create(pod)

    taken: dict[str, list[str]] = defaultdict(list)
    for i, gpus in enumerate(sizes):
        pod = cluster.wait_bound(namespace, f"p{i}")
        node = pod["spec"]["nodeName"]
        devices = devices_of(pod)
        assert node in cluster.nodes
        assert pod["metadata"]["annotations"][contract.ANN_DEVICE_NODE] == node
        assert len(devices) == gpus
        assert set(devices) <= set(cluster.gpu_node_uuids(node)), f"p{i}: not {node}'s devices"
        taken[node].extend(devices)

    for node, devices in taken.items():
        assert len(devices) == len(set(devices)), f"a device of {node} was given twice"
        # The node's allocation ledger holds the same choice.
        ledger = cluster.kube.get(contract.KIND_GPU_ALLOCATION, node)
        assert ledger is not None
        ours = [
            u
            for a in ledger["spec"]["allocations"]
            if a["namespace"] == namespace
            for u in a["devices"]
        ]
        assert sorted(ours) == sorted(devices)


def test_owner_gets_its_own_tagged_devices_never_another_jobs(
    cluster: Cluster, namespace: str, group: NodeGroup
) -> None:
    """(b) A high-priority pod of job A lands on A's tagged devices, never on B's."""
    job_a, job_b = f"{namespace}/job-a", f"{namespace}/job-b"  # tags name the namespace's job
    x = group.add_node(
        "x", lambda n: b.devices(n, 4, owner=job_a) + b.devices(n, 4, owner=job_b, start=4)
    )
    group.add_node("y", lambda n: b.devices(n, 8, owner=job_b))
    group.wait_ready()

    owner = {"priority": Priority.HIGH, "owner": "job-a", "priority_class": ONLINE}
    group.create_pod(namespace, "a-1", 4, **owner)
    pod = cluster.wait_bound(namespace, "a-1")
    assert pod["spec"]["nodeName"] == x
    devices = cluster.gpu_node_uuids(x)
    assert {devices[u].get("owner") for u in devices_of(pod)} == {job_a}

    # All of A's devices are taken now; B's twelve free ones must not be used.
    group.create_pod(namespace, "a-2", 1, **owner)
    cluster.wait_unschedulable(namespace, "a-2", "tagged for another job's right of return")


def test_borrowers_take_untagged_devices_first_then_tagged_ones(
    cluster: Cluster, namespace: str, group: NodeGroup
) -> None:
    """(c) Low-priority pods borrow devices tagged for a job once the untagged ones are gone."""
    job_a = f"{namespace}/job-a"
    z = group.add_node("z", lambda n: b.devices(n, 4) + b.devices(n, 4, owner=job_a, start=4))
    group.wait_ready()
    devices = cluster.gpu_node_uuids(z)
    borrower = {"priority": Priority.LOW, "owner": "job-c", "priority_class": BORROWER}

    group.create_pod(namespace, "c-1", 4, **borrower)
    first = devices_of(cluster.wait_bound(namespace, "c-1"))
    assert {devices[u].get("owner") for u in first} == {None}

    group.create_pod(namespace, "c-2", 4, **borrower)
    second = cluster.wait_bound(namespace, "c-2")
    assert second["spec"]["nodeName"] == z
    assert {devices[u].get("owner") for u in devices_of(second)} == {job_a}


def test_unhealthy_devices_are_avoided(cluster: Cluster, namespace: str, group: NodeGroup) -> None:
    """(d) Devices marked Unhealthy in the GpuNode's status are never handed out."""
    w = group.add_node("w", lambda n: b.devices(n, 6, healthy=False) + b.devices(n, 2, start=6))
    group.wait_ready()
    devices = cluster.gpu_node_uuids(w)
    healthy = {u for u, d in devices.items() if d["health"] == "Healthy"}
    assert len(healthy) == 2

    group.create_pod(namespace, "d-1", 2, priority=Priority.LOW)
    assert set(devices_of(cluster.wait_bound(namespace, "d-1"))) == healthy

    # kube-scheduler still counts 6 free nvidia.com/gpu on the node; only the extender knows.
    group.create_pod(namespace, "d-2", 1, priority=Priority.LOW)
    cluster.wait_unschedulable(
        namespace, "d-2", "tidelease: not enough usable GPUs, free ones are unhealthy"
    )


def test_unschedulable_pod_shows_the_extenders_reason(
    cluster: Cluster, namespace: str, group: NodeGroup
) -> None:
    """(e) The PodScheduled condition carries the extender's reason: a rejection, an error."""
    group.add_node("v", lambda n: b.devices(n, 8))
    group.wait_ready()

    group.create_pod(namespace, "e-type", 1, gpu_type="A100")
    message = cluster.wait_unschedulable(
        namespace, "e-type", "tidelease: not enough usable GPUs, free ones are of another GPU type"
    )
    assert message.startswith("0/"), message  # kube-scheduler's summary of every node's reason

    group.create_pod(namespace, "e-bad", 1, extra_annotations={contract.ANN_PRIORITY: "urgent"})
    cluster.wait_unschedulable(
        namespace, "e-bad", f"tidelease: annotation {contract.ANN_PRIORITY}: invalid value 'urgent'"
    )
