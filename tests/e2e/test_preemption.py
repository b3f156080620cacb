"""(f) Reclaim through kube-scheduler's preemption and the extender's preempt verb.

The owner of lent devices takes them back: its high-priority reclaim pod preempts the borrowers
on its tagged devices, and no other low-priority pod. Every scenario is built so that
kube-scheduler's own choice of victims (or of node) would be the other pods: only the extender's
answer makes the borrowers the victims.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common import builders, contract
from common.model import Priority
from tests.e2e.harness import BORROWER, ONLINE, Cluster, NodeGroup, devices_of
from tests.e2e.kube import wait_for

pytestmark = pytest.mark.cluster

b = builders
# A class below tidelease-borrower, so kube-scheduler alone would pick these pods as victims.
LOWEST = "e2e-lowest"
# Time for the reclaim pod to be bound once kube-scheduler has evicted the borrowers: it retries
# at once on their deletion. Shorter than the extender's grace for pods missing from its cache
# (missing_grace_s, 30 s after the allocation), so that the test fails while the extender waits
# for that grace instead of freeing a deleted pod's devices when it sees the deletion.
RECLAIM_TIMEOUT_S = 20


@dataclass
class FilledNode:
    node: str
    devices: dict[str, dict[str, Any]]  # by UUID, from the GpuNode
    borrowers: dict[str, str]  # name -> UID, on job-a's tagged devices
    others: dict[str, dict[str, Any]]  # name -> pod, lower priority, on untagged devices


def _fill_node(cluster: Cluster, namespace: str, group: NodeGroup) -> FilledNode:
    """One node: 4 devices tagged for job-a, 4 untagged, all taken by low-priority pods."""
    cluster.ensure_priority_class(LOWEST, 10)
    job_a = f"{namespace}/job-a"  # the job's key: its namespace and name
    x = group.add_node("x", lambda n: b.devices(n, 4, owner=job_a) + b.devices(n, 4, start=4))
    group.wait_ready()
    devices = cluster.gpu_node_uuids(x)
    # The others come first and take the untagged devices (borrowers prefer those) ...
    others = {}
    for name in ("other-0", "other-1"):
        group.create_pod(namespace, name, 2, priority=Priority.LOW, priority_class=LOWEST)
        others[name] = cluster.wait_bound(namespace, name)
        assert {devices[u].get("owner") for u in devices_of(others[name])} == {None}
    # ... so the borrowers borrow job-a's tagged ones.
    borrowers = {}
    for name in ("borrower-0", "borrower-1"):
        group.create_pod(namespace, name, 2, priority=Priority.LOW, priority_class=BORROWER)
        pod = cluster.wait_bound(namespace, name)
        assert {devices[u].get("owner") for u in devices_of(pod)} == {job_a}
        borrowers[name] = pod["metadata"]["uid"]
    return FilledNode(x, devices, borrowers, others)


def _reclaim(group: NodeGroup, namespace: str, gpus: int) -> str:
    """job-a's reclaim pod: a reclaim because job-a's GpuLease reclaims and the pod is its
    workload's (docs/tenancy.md: nothing a pod declares makes it one). The workload is a stand-in
    that makes no pods of its own (a ConfigMap: the pod names it as its controller, and the
    garbage collector sees it exist); the leasing controller cannot scale it and leaves the
    lease as it is, which is all the extender's preempt verb needs, with the borrowers' notice
    (``borrower-*``), which the controller would have given."""
    kube = group.cluster.kube
    holder = kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "job-a", "namespace": namespace},
        }
    )
    lease = builders.gpu_lease("job-a", namespace, gpus_per_replica=gpus, desired_gpus=gpus)
    lease["spec"]["workload"] = {"apiVersion": "v1", "kind": "ConfigMap", "name": "job-a"}
    kube.create(lease)
    kube.patch(
        contract.KIND_GPU_LEASE,
        "job-a",
        {"status": {"phase": "Reclaiming", "targetReplicas": 1}},
        namespace,
        subresource="status",
    )
    # The borrowers' notice, as the leasing controller gives it before it scales up: the
    # preempt verb evicts no borrower of the owner's lent devices without one.
    deadline = (datetime.now(UTC) + timedelta(minutes=10)).isoformat()
    for pod in kube.list("Pod", namespace):
        if pod["metadata"]["name"].startswith("borrower-"):
            kube.patch(
                "Pod",
                pod["metadata"]["name"],
                {"metadata": {"annotations": {contract.ANN_RECLAIM_NOTICE: deadline}}},
                namespace,
            )
    pod = group.pod(
        namespace,
        "a-reclaim",
        gpus,
        priority=Priority.HIGH,
        owner="job-a",
        reclaim=True,  # grants nothing: kept to show it
        priority_class=ONLINE,
    )
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "job-a",
            "uid": holder["metadata"]["uid"],
            "controller": True,
        }
    ]
    kube.create(pod)
    return "a-reclaim"


def _evicted(cluster: Cluster, namespace: str, name: str, uid: str) -> bool:
    """Whether that pod (by UID) is deleted or being deleted."""
    pod = cluster.kube.get("Pod", name, namespace)
    return pod is None or pod["metadata"]["uid"] != uid or "deletionTimestamp" in pod["metadata"]


def _untouched(cluster: Cluster, namespace: str, pods: dict[str, dict[str, Any]]) -> None:
    for name, before in pods.items():
        assert not _evicted(cluster, namespace, name, before["metadata"]["uid"]), (
            f"{name} (on {before['spec']['nodeName']}) was preempted"
        )


def _hold(check: Any, seconds: float) -> None:
    """``check`` (which asserts) keeps passing for ``seconds``: a later round must not evict."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check()
        time.sleep(0.2)


def test_reclaim_preempts_the_borrowers_of_its_devices_not_other_pods(
    cluster: Cluster, namespace: str, group: NodeGroup
) -> None:
    """kube-scheduler alone would evict the lower-priority others; the extender says borrowers."""
    filled = _fill_node(cluster, namespace, group)
    _reclaim(group, namespace, 4)

    def settled() -> bool:
        others_hit = any(
            _evicted(cluster, namespace, n, p["metadata"]["uid"]) for n, p in filled.others.items()
        )
        return others_hit or all(
            _evicted(cluster, namespace, n, uid) for n, uid in filled.borrowers.items()
        )

    wait_for(
        settled, what="a preemption", describe=lambda: cluster.describe_pod(namespace, "a-reclaim")
    )
    _hold(lambda: _untouched(cluster, namespace, filled.others), 3)
    for name, uid in filled.borrowers.items():
        assert _evicted(cluster, namespace, name, uid), f"{name} was not preempted"


def test_reclaim_pod_is_bound_to_the_devices_its_borrowers_held(
    cluster: Cluster, namespace: str, group: NodeGroup
) -> None:
    filled = _fill_node(cluster, namespace, group)
    _reclaim(group, namespace, 4)
    pod = cluster.wait_bound(namespace, "a-reclaim", timeout=RECLAIM_TIMEOUT_S)
    assert pod["spec"]["nodeName"] == filled.node
    assert {filled.devices[u].get("owner") for u in devices_of(pod)} == {f"{namespace}/job-a"}
    _untouched(cluster, namespace, filled.others)


def test_reclaim_preempts_its_borrowers_not_pods_on_other_nodes(
    cluster: Cluster, namespace: str, group: NodeGroup
) -> None:
    """Two nodes: borrowers fill job-a's tagged node x, other low-priority pods untagged y."""
    x = group.add_node("x", lambda n: b.devices(n, 8, owner=f"{namespace}/job-a"))
    y = group.add_node("y", lambda n: b.devices(n, 8))
    group.wait_ready()
    low = {"priority": Priority.LOW, "priority_class": BORROWER}

    borrowers, started = {}, []
    for name in ("borrower-0", "borrower-1"):
        group.create_pod(namespace, name, 4, node=x, **low)
        borrowers[name] = cluster.wait_bound(namespace, name)["metadata"]["uid"]
        start = wait_for(
            lambda name=name: (cluster.pod(namespace, name).get("status") or {}).get("startTime"),
            what=f"{name} to start",
        )
        started.append(datetime.fromisoformat(start))
    # Start times have whole seconds. The others start later, so kube-scheduler's own tie-break
    # (the node whose victims started last) is y: only the extender can make it x.
    later = max(started) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) >= later, what="the next second")
    others = {}
    for name in ("other-0", "other-1"):
        group.create_pod(namespace, name, 4, node=y, **low)
        others[name] = cluster.wait_bound(namespace, name)

    _reclaim(group, namespace, 8)

    def settled() -> bool:
        others_hit = any(
            _evicted(cluster, namespace, n, p["metadata"]["uid"]) for n, p in others.items()
        )
        return others_hit or all(
            _evicted(cluster, namespace, n, uid) for n, uid in borrowers.items()
        )

    wait_for(
        settled, what="a preemption", describe=lambda: cluster.describe_pod(namespace, "a-reclaim")
    )
    _hold(lambda: _untouched(cluster, namespace, others), 3)
    for name, uid in borrowers.items():
        assert _evicted(cluster, namespace, name, uid), f"{name} was not preempted"
