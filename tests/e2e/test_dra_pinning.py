"""Right of return with Dynamic Resource Allocation: the leasing controller pins a returning
replica's claim to the devices it lent, and kube-scheduler binds the pod where they are.

As in test_dra.py (whose helpers these tests use): kwok nodes whose GpuNodes a SliceMirror per
node publishes as ResourceSlices, common.deviceattributes's DeviceClasses, and the cluster's plain
kube-scheduler ``tidelease-plain`` (no extender). The tests write what the leasing controller
will write (extender.leasing.claimpinning): the claim's finalizer, then its
``status.allocation``, then lift the pod's scheduling gate ``tidelease.io/reclaim``.

* a gated pod's claim, pinned to a device its job lent (which ``tidelease-ha`` excludes) on one
  node while a free HA device waits on another, gets exactly that device, and the pod that node;
* without the gate (lifted before the pin), kube-scheduler allocates the free HA device
  itself, and the allocation can no longer be changed: the race the gate closes;
* neither the API server nor kube-scheduler refuses a pin to a device another claim holds: the
  controller must see that claim gone first.
"""

from __future__ import annotations

from typing import Any

import pytest

from common import builders, deviceattributes
from common.errors import InvalidInput
from common.model import Device, Priority, Tier
from extender.leasing import claimpinning as pinning
from tests.e2e.harness import Cluster, NodeGroup
from tests.e2e.kube import ApiError, wait_for
from tests.e2e.test_dra import (  # noqa: F401  (fixtures)
    RESOURCE,
    allocated,
    claim_of,
    claim_template,
    create_claim_pod,
    describe,
    device_classes,
    devices_on,
    mirrored,
    plain_scheduler,
    wait_nodes_ready,
    wait_published,
)

pytestmark = pytest.mark.cluster

b = builders
OWNER = "job-a"
REPLICA = "job-a-1"  # the returning replica
CLAIM_TIMEOUT_S = 30


def free_layout(node: str) -> list[Device]:
    """One free HA device: what kube-scheduler would give a tidelease-ha claim."""
    return b.devices(node, 1, tier=Tier.HA)


def lent_layout(node: str) -> list[Device]:
    """Two HA devices job-a lent: gpu-0 by replica job-a-0, gpu-1 by job-a-1."""
    return b.devices(node, 1, tier=Tier.HA, owner=OWNER, replica="job-a-0") + b.devices(
        node, 1, tier=Tier.HA, owner=OWNER, replica=REPLICA, start=1
    )


def create_gated_pod(
    cluster: Cluster, group: NodeGroup, scheduler: str, namespace: str, name: str, *, gated: bool
) -> dict[str, Any]:
    """Job A's returning replica: a high-priority pod of ``scheduler`` on any node of the group,
    whose container uses a ``tidelease-ha`` claim from a template of its own; carrying the
    reclaim gate when ``gated``."""
    create_claim_pod(
        cluster, group, scheduler, namespace, name, None, deviceattributes.CLASS_HA,
        priority=Priority.HIGH, owner=OWNER, gated=gated,
    )  # fmt: skip
    return cluster.pod(namespace, name)


def wait_claim(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    """The pod's claim, once kube-controller-manager made it from the template."""
    return wait_for(
        lambda: claim_of(cluster, namespace, pod),
        what=f"the ResourceClaim of {namespace}/{pod}",
        timeout=CLAIM_TIMEOUT_S,
    )


def claim_path(claim: dict[str, Any]) -> str:
    meta = claim["metadata"]
    return f"{RESOURCE}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"


def pin(cluster: Cluster, claim: dict[str, Any], devices: list[Device]) -> dict[str, Any]:
    """What the leasing controller writes: the finalizer (a normal update), then the allocation
    (status, at the claim's resourceVersion)."""
    patch = pinning.finalizer_patch(claim)
    assert patch is not None
    claim = cluster.kube.request(
        "PATCH", claim_path(claim), patch, content_type="application/merge-patch+json"
    )
    assert pinning.finalizer_patch(claim) is None
    status = pinning.pinned_allocation(claim, devices)
    body = {"metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]}, "status": status}
    written: dict[str, Any] = cluster.kube.request(
        "PATCH", f"{claim_path(claim)}/status", body, content_type="application/merge-patch+json"
    )
    return written


def lift_gate(cluster: Cluster, namespace: str, pod: str) -> None:
    patch = pinning.ungated(cluster.pod(namespace, pod))
    assert patch is not None, "the pod carries no reclaim gate"
    cluster.kube.patch("Pod", pod, patch, namespace)
    assert not cluster.pod(namespace, pod)["spec"].get("schedulingGates")


def scheduled_condition(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    conditions = cluster.pod(namespace, pod).get("status", {}).get("conditions") or []
    found: list[dict[str, Any]] = [c for c in conditions if c["type"] == "PodScheduled"]
    (condition,) = found
    return condition


def test_a_pinned_claim_gets_exactly_its_lent_device_and_the_pod_that_node(
    cluster: Cluster,
    namespace: str,
    group: NodeGroup,
    plain_scheduler: str,  # noqa: F811
    device_classes: list[str],  # noqa: F811
) -> None:
    free = group.add_node("free", free_layout)
    lent = group.add_node("lent", lent_layout)
    target = lent_layout(lent)[1]  # gpu-1, lent by job-a-1
    assert (target.index, target.cls.replica) == (1, REPLICA)
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        assert wait_published(cluster, free, {"gpu-0"})["gpu-0"]["lentBy"] == ""
        offered = wait_published(cluster, lent, {"gpu-0", "gpu-1"})
        assert offered["gpu-1"]["replica"] == REPLICA
        assert offered["gpu-1"]["uuid"] == target.uuid

        pod = create_gated_pod(cluster, group, plain_scheduler, namespace, REPLICA, gated=True)
        claim = wait_claim(cluster, namespace, REPLICA)
        # The gate holds the pod back: not scheduled, its claim untouched.
        condition = scheduled_condition(cluster, namespace, REPLICA)
        assert condition["reason"] == "SchedulingGated", condition
        assert not (claim.get("status") or {}).get("allocation")

        written = pin(cluster, claim, [target])
        assert written["status"]["allocation"] == {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": deviceattributes.DRIVER,
                        "pool": lent,
                        "device": "gpu-1",
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [lent]}]}
                ]
            },
        }
        # Still gated: kube-scheduler has not seen the pod.
        assert not cluster.pod(namespace, REPLICA)["spec"].get("nodeName")

        lift_gate(cluster, namespace, REPLICA)
        results = allocated(cluster, namespace, REPLICA)
        assert devices_on(results, lent) == {"gpu-1"}, describe(cluster, namespace, REPLICA)
        bound = cluster.pod(namespace, REPLICA)
        assert bound["spec"]["nodeName"] == lent
        final = claim_of(cluster, namespace, REPLICA)
        assert final is not None
        # The allocation is the one written, untouched; the pod reserved it at bind.
        assert final["status"]["allocation"] == written["status"]["allocation"]
        assert final["status"]["reservedFor"] == [
            {"resource": "pods", "name": REPLICA, "uid": pod["metadata"]["uid"]}
        ]
        assert pinning.FINALIZER in final["metadata"]["finalizers"]

        # What observe() reads back of it in DRA mode: the pod holds job-a-1's device.
        devices = free_layout(free) + lent_layout(lent)
        (holding,) = pinning.claim_holdings([final], devices)
        assert holding.node == lent
        assert holding.devices == (target.uuid,)
        assert [p.name for p in holding.pods] == [REPLICA]
        assert pinning.pod_devices([holding]) == {pod["metadata"]["uid"]: (lent, (target.uuid,))}


def test_without_the_gate_kube_scheduler_takes_a_free_device_first(
    cluster: Cluster,
    namespace: str,
    group: NodeGroup,
    plain_scheduler: str,  # noqa: F811
    device_classes: list[str],  # noqa: F811
) -> None:
    """The gate lifted before the pin: kube-scheduler allocates the free HA device on the other
    node, and the claim can no longer be pinned (an allocation is immutable)."""
    free = group.add_node("free", free_layout)
    lent = group.add_node("lent", lent_layout)
    target = lent_layout(lent)[1]
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        wait_published(cluster, free, {"gpu-0"})
        wait_published(cluster, lent, {"gpu-0", "gpu-1"})
        create_gated_pod(cluster, group, plain_scheduler, namespace, REPLICA, gated=True)
        claim = wait_claim(cluster, namespace, REPLICA)

        lift_gate(cluster, namespace, REPLICA)  # too early
        results = allocated(cluster, namespace, REPLICA)
        assert devices_on(results, free) == {"gpu-0"}
        assert (free, "gpu-0") != (lent, pinning.device_name(target.index))
        assert cluster.pod(namespace, REPLICA)["spec"]["nodeName"] == free

        taken = claim_of(cluster, namespace, REPLICA)
        assert taken is not None
        with pytest.raises(InvalidInput, match="allocated already"):
            pinning.pinned_allocation(taken, [target])
        # Nor does the API server let anyone move it: the allocation is immutable.
        status = pinning.pinned_allocation(claim, [target])
        body = {"metadata": {"resourceVersion": taken["metadata"]["resourceVersion"]}}
        with pytest.raises(ApiError) as refused:
            cluster.kube.request(
                "PATCH",
                f"{claim_path(taken)}/status",
                {**body, "status": status},
                content_type="application/merge-patch+json",
            )
        assert refused.value.status == 422, refused.value
        # ("status.allocation: Invalid value: ...: field is immutable", cut short here)
        assert "is invalid: status.allocation: Invalid value" in str(refused.value), refused.value
        after = claim_of(cluster, namespace, REPLICA)
        assert after is not None
        assert devices_on(after["status"]["allocation"]["devices"]["results"], free) == {"gpu-0"}


def test_nothing_upstream_stops_a_pin_to_a_device_another_claim_holds(
    cluster: Cluster,
    namespace: str,
    group: NodeGroup,
    plain_scheduler: str,  # noqa: F811
    device_classes: list[str],  # noqa: F811
) -> None:
    """A borrower holds one of job-a's lent devices; a pin to that very device is accepted by
    the API server, and kube-scheduler binds the pod: both claims hold one device. The leasing
    controller must see the borrower's claim gone (claim_holdings) before it pins."""
    lent = group.add_node("lent", lent_layout)
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        wait_published(cluster, lent, {"gpu-0", "gpu-1"})
        create_claim_pod(
            cluster,
            group,
            plain_scheduler,
            namespace,
            "borrower",
            lent,
            deviceattributes.CLASS_BORROW,
        )
        (taken,) = devices_on(allocated(cluster, namespace, "borrower"), lent)
        index = pinning.device_index(taken)
        assert index is not None
        create_gated_pod(cluster, group, plain_scheduler, namespace, REPLICA, gated=True)
        pin(cluster, wait_claim(cluster, namespace, REPLICA), [lent_layout(lent)[index]])
        lift_gate(cluster, namespace, REPLICA)
        assert devices_on(allocated(cluster, namespace, REPLICA), lent) == {taken}
        claims = [claim_of(cluster, namespace, pod) for pod in ("borrower", REPLICA)]
        holdings = pinning.claim_holdings([c for c in claims if c], lent_layout(lent))
        assert [(h.devices, [p.name for p in h.pods]) for h in holdings] == [
            ((b.device_uuid(lent, index),), ["borrower"]),
            ((b.device_uuid(lent, index),), [REPLICA]),
        ]
        assert cluster.pod(namespace, "borrower")["spec"]["nodeName"] == lent
