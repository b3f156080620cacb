"""Dynamic Resource Allocation with the unmodified kube-scheduler, and no extender.

The node agent's :class:`nodeagent.dradriver.slices.SliceMirror` (run here, in the test process, one
per kwok node, as each node's agent runs it) publishes each node's GpuNode as a ResourceSlice; the
DeviceClasses are common.deviceattributes's; pods ask for devices through ResourceClaimTemplates,
and the cluster's second kube-scheduler, ``tidelease-plain``, whose configuration has no extenders
(TL_CLUSTER_PLAIN_SCHEDULER in tests/e2e/conftest.py), allocates them with its DynamicResources
plugin: every CEL selector is evaluated by kube-scheduler itself. The GpuNodes are written here as
the agent (status) and the leasing controller (spec.devices) would write them.

* a claim of each class, for *all* the devices it may have, is allocated exactly the devices
  the class should select (tiers, lent, standby, withdrawn unhealthy devices);
* (a) a ``tidelease-ha`` claim gets the node's one HA device among MA and LA ones;
* (b) a high-priority pod of job A asking ``tidelease-ha`` stays pending while the node's only
  HA devices are lent by job B (or standby); a borrower gets one of B's; once the leasing
  controller takes B's tag off the other, the mirror republishes it and A's pod gets it;
* (c) an unhealthy device is never allocated, however long its pod waits; healthy again, it is;
* kube-scheduler preempts nobody for devices (Kubernetes 1.35): a high-priority claim waits
  while a low-priority pod holds the only device it could have.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import yaml

from common import builders, contract, deviceattributes
from common.builders import claim_template
from common.kubeclient import KubeClient
from common.model import Device, Priority, Tier
from extender.leasing.claimpinning import RECLAIM_GATE
from nodeagent.dradriver.slices import SliceMirror
from tests.background import read_state
from tests.e2e.harness import BORROWER, GROUP_LABEL, ONLINE, Cluster, NodeGroup
from tests.e2e.kube import ApiError, wait_for

pytestmark = pytest.mark.cluster

b = builders
RESOURCE = f"/apis/{deviceattributes.API_VERSION}"
CLASSES = f"{RESOURCE}/deviceclasses"
SCHEDULE_TIMEOUT_S = 60
# kube-scheduler's reason for a pod none of whose nodes can allocate its claims.
NO_DEVICES = "cannot allocate all claims"


# --- the cluster's plain scheduler, the classes, the mirrors ---


@pytest.fixture(scope="module")
def plain_scheduler(cluster: Cluster) -> str:
    """The name of the kube-scheduler without extenders; fails (never skips) without one."""
    facts = read_state(cluster.dir / "cluster.env")
    name = facts.get("TL_CLUSTER_PLAIN_SCHEDULER_NAME", "")
    if not name:
        pytest.fail("the cluster runs no plain kube-scheduler (TL_CLUSTER_PLAIN_SCHEDULER)")
    config = yaml.safe_load((cluster.dir / f"scheduler-{name}" / "config.yaml").read_text())
    # No extender anywhere in its configuration, and the DynamicResources plugin not turned off.
    assert "extenders" not in config, config
    assert [p["schedulerName"] for p in config["profiles"]] == [name]
    assert "DynamicResources" not in yaml.safe_dump(config)
    return name


@pytest.fixture(scope="module")
def device_classes(cluster: Cluster) -> Iterator[list[str]]:
    """common.deviceattributes's DeviceClasses, applied (replaced when they exist), deleted
    afterwards."""
    names = []
    for obj in deviceattributes.device_classes():
        name = obj["metadata"]["name"]
        try:
            cluster.kube.request("POST", CLASSES, obj)
        except ApiError as e:
            if e.status != 409:
                raise
            current = cluster.kube.request("GET", f"{CLASSES}/{name}")
            obj = {**obj, "metadata": {**obj["metadata"], **_version(current)}}
            cluster.kube.request("PUT", f"{CLASSES}/{name}", obj)
        names.append(name)
    yield names
    for name in names:
        _delete(cluster, f"{CLASSES}/{name}")


def _version(obj: dict[str, Any]) -> dict[str, str]:
    return {"resourceVersion": obj["metadata"]["resourceVersion"]}


def _delete(cluster: Cluster, path: str) -> None:
    try:
        cluster.kube.request("DELETE", path)
    except ApiError as e:
        if e.status != 404:
            raise


@contextlib.contextmanager
def mirrored(cluster: Cluster, nodes: Sequence[str]) -> Iterator[None]:
    """A SliceMirror per node, running in a thread of its own (its own event loop and
    KubeClient) until the block ends; then the slices are deleted (the nodes' deletion would
    have them collected too: they are owned by their Node)."""
    ready = threading.Event()
    failed: list[BaseException] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def main() -> None:
        client = await KubeClient.connect(cluster.kubeconfig)
        try:
            events = [asyncio.Event() for _ in nodes]
            tasks = [
                asyncio.create_task(SliceMirror(client, node).run(ready=event), name=node)
                for node, event in zip(nodes, events, strict=True)
            ]
            all_ready = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in events)))
            stopping = asyncio.ensure_future(stop.wait())
            try:
                # Until every mirror is ready, then until the block ends: or a mirror ends.
                for waited in (all_ready, stopping):
                    done, _ = await asyncio.wait(
                        {waited, *tasks}, return_when=asyncio.FIRST_COMPLETED
                    )
                    if waited not in done:
                        break
                    ready.set()
            finally:
                # A mirror that ended on its own failed: the test must say so.
                failed.extend(
                    t.exception() or RuntimeError(f"the mirror of {t.get_name()} returned")
                    for t in tasks
                    if t.done() and not t.cancelled()
                )
                for task in (all_ready, stopping, *tasks):
                    task.cancel()
                await asyncio.gather(all_ready, stopping, *tasks, return_exceptions=True)
        finally:
            await client.close()

    def thread_main() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as e:  # reported by the test thread
            failed.append(e)
        finally:
            ready.set()
            loop.close()

    thread = threading.Thread(target=thread_main, name="slice-mirrors", daemon=True)
    thread.start()
    try:
        assert ready.wait(30), "the mirrors did not get ready in 30 s"
        assert not failed, failed
        yield
    finally:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the thread ended
            loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        assert not thread.is_alive(), "the mirrors did not stop"
        for node in nodes:
            _delete(cluster, f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(node)}")
        assert not failed, failed


def slice_of(cluster: Cluster, node: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = cluster.kube.request(
            "GET", f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(node)}"
        )
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    return obj


def published(cluster: Cluster, node: str) -> dict[str, dict[str, Any]]:
    """The devices of the node's slice by name, their attributes by short name."""
    out = {}
    for device in (slice_of(cluster, node) or {}).get("spec", {}).get("devices") or []:
        attrs = {}
        for key, value in device["attributes"].items():
            ((_, inner),) = value.items()
            attrs[key.removeprefix(f"{deviceattributes.DOMAIN}/")] = inner
        out[device["name"]] = attrs
    return out


def wait_published(cluster: Cluster, node: str, names: set[str]) -> dict[str, dict[str, Any]]:
    """The node's slice once it exists and offers exactly the devices ``names``."""

    def offered() -> dict[str, dict[str, Any]] | None:
        if slice_of(cluster, node) is None:
            return None
        devices = published(cluster, node)
        return devices if set(devices) == names else None

    found: list[dict[str, dict[str, Any]]] = []

    def probe() -> bool:
        devices = offered()
        if devices is not None:
            found[:] = [devices]  # an empty dict is an answer too
        return devices is not None

    wait_for(
        probe,
        what=f"the slice of {node} to offer {sorted(names)}",
        timeout=30,
        describe=lambda: f"offers {sorted(published(cluster, node))}",
    )
    return found[0]


def wait_nodes_ready(cluster: Cluster, group: NodeGroup) -> None:
    """Until kwok has made the group's nodes Ready and the not-ready taint is gone."""

    def ready() -> bool:
        for name in group.nodes:
            node = cluster.kube.get("Node", name) or {}
            conditions = node.get("status", {}).get("conditions") or []
            if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return False
            if any(t["key"] != GROUP_LABEL for t in node.get("spec", {}).get("taints") or []):
                return False
        return True

    wait_for(ready, what=f"nodes {group.nodes} to be Ready, untainted", timeout=60)


# --- pods and claims ---


def create_claim_template(cluster: Cluster, template: dict[str, Any]) -> None:
    namespace = template["metadata"]["namespace"]
    cluster.kube.request(
        "POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", template
    )


def claim_pod(
    group: NodeGroup,
    scheduler: str,
    template: str,
    *,
    node: str | None = None,
    priority: Priority = Priority.LOW,
    owner: str | None = None,
    gated: bool = False,
) -> dict[str, Any]:
    """A pod (metadata and spec, no name) of ``scheduler`` on ``node`` (else any node of the
    group) whose one container uses a claim from ``template``; tidelease's PriorityClass for
    ``priority``; carrying the reclaim gate when ``gated``."""
    annotations = {contract.ANN_PRIORITY: priority.value}
    if owner is not None:
        annotations[contract.ANN_OWNER] = owner
    selector = {GROUP_LABEL: group.id}
    if node is not None:
        selector["kubernetes.io/hostname"] = node
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "priorityClassName": ONLINE if priority is Priority.HIGH else BORROWER,
        "nodeSelector": selector,
        "tolerations": [{"key": GROUP_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.example/train:v1",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
    }
    if gated:
        spec["schedulingGates"] = [{"name": RECLAIM_GATE}]
    return {"metadata": {"annotations": annotations}, "spec": spec}


def create_claim_pod(
    cluster: Cluster,
    group: NodeGroup,
    scheduler: str,
    namespace: str,
    name: str,
    node: str | None,
    device_class: str,
    *,
    all_devices: bool = False,
    selectors: Sequence[str] = (),
    priority: Priority = Priority.LOW,
    owner: str | None = None,
    count: int = 1,
    gated: bool = False,
) -> str:
    """A :func:`claim_pod` named ``name`` with a template of its own for ``count`` devices of
    ``device_class`` (or all it selects), created; its name."""
    create_claim_template(
        cluster,
        claim_template(
            namespace, name, device_class, all_devices=all_devices, selectors=selectors, count=count
        ),
    )
    pod = claim_pod(group, scheduler, name, node=node, priority=priority, owner=owner, gated=gated)
    pod["metadata"].update(name=name, namespace=namespace)
    cluster.kube.create({"apiVersion": "v1", "kind": "Pod", **pod})
    return name


def claim_of(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any] | None:
    """The pod's ResourceClaim (made by kube-controller-manager from its template), or None."""
    obj = cluster.pod(namespace, pod)
    for status in (obj.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == "gpu" and status.get("resourceClaimName"):
            path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}"
            claim: dict[str, Any] = cluster.kube.request("GET", path)
            return claim
    return None


def allocated(cluster: Cluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The device results of the pod's allocated claim, once the pod is bound (waits)."""

    def results() -> list[dict[str, Any]] | None:
        claim = claim_of(cluster, namespace, pod)
        allocation = ((claim or {}).get("status") or {}).get("allocation")
        if allocation is None or not cluster.pod(namespace, pod)["spec"].get("nodeName"):
            return None
        found: list[dict[str, Any]] = allocation["devices"]["results"]
        return found

    return wait_for(
        results,
        what=f"the claim of {namespace}/{pod} to be allocated and the pod bound",
        timeout=SCHEDULE_TIMEOUT_S,
        describe=lambda: describe(cluster, namespace, pod),
    )


def describe(cluster: Cluster, namespace: str, pod: str) -> str:
    obj = cluster.kube.get("Pod", pod, namespace) or {}
    claim = claim_of(cluster, namespace, pod) if obj else None
    return (
        f"pod {namespace}/{pod}: node={obj.get('spec', {}).get('nodeName')!r} "
        f"conditions={obj.get('status', {}).get('conditions')}\n"
        f"claim status: {(claim or {}).get('status')}\n"
        f"--- plain kube-scheduler log ---\n"
        f"{cluster.log_tail('kube-scheduler-tidelease-plain.log', 15)}"
    )


def devices_on(results: list[dict[str, Any]], node: str) -> set[str]:
    """The allocated device names; every one of ``node``'s pool, of tidelease's driver."""
    assert {(r["driver"], r["pool"]) for r in results} == {(deviceattributes.DRIVER, node)}, results
    return {r["device"] for r in results}


def wait_pending(cluster: Cluster, namespace: str, pod: str, contains: str = NO_DEVICES) -> str:
    """The pod's PodScheduled=False message once kube-scheduler has found no devices for it;
    its claim exists and stays unallocated."""
    message = cluster.wait_unschedulable(namespace, pod, contains, timeout=SCHEDULE_TIMEOUT_S)
    (condition,) = [
        c
        for c in cluster.pod(namespace, pod)["status"]["conditions"]
        if c["type"] == "PodScheduled"
    ]
    assert condition["reason"] == "Unschedulable", condition
    claim = claim_of(cluster, namespace, pod)
    assert claim is not None, f"{pod} has no claim"
    assert not (claim.get("status") or {}).get("allocation"), claim["status"]
    assert not cluster.pod(namespace, pod)["status"].get("nominatedNodeName")
    return message


# --- the tests ---


# Every kind of device once: (healthy, tier, lent by job-b, standby), by index.
MATRIX: list[tuple[bool, Tier, bool, bool]] = [
    (True, Tier.HA, False, False),  # gpu-0
    (True, Tier.MA, False, False),  # gpu-1
    (True, Tier.LA, False, False),  # gpu-2
    (True, Tier.HA, True, False),  # gpu-3: lent
    (True, Tier.MA, True, False),  # gpu-4: lent
    (True, Tier.HA, False, True),  # gpu-5: standby
    (False, Tier.HA, False, False),  # gpu-6: unhealthy, withdrawn
    (True, Tier.LA, True, False),  # gpu-7: lent
]
SELECTS = {
    deviceattributes.CLASS_HA: {"gpu-0"},
    deviceattributes.CLASS_MA: {"gpu-0", "gpu-1"},
    deviceattributes.CLASS_LA: {"gpu-0", "gpu-1", "gpu-2"},
    deviceattributes.CLASS_BORROW: {"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-7"},
}


def matrix(node: str) -> list[Device]:
    out: list[Device] = []
    for i, (healthy, tier, lent, standby) in enumerate(MATRIX):
        out += b.devices(
            node,
            1,
            start=i,
            tier=tier,
            healthy=healthy,
            owner="job-b" if lent else None,
            replica="job-b-0" if lent else None,
            standby=standby,
        )
    return out


def test_each_class_is_allocated_exactly_the_devices_it_selects(
    cluster: Cluster,
    namespace: str,
    group: NodeGroup,
    plain_scheduler: str,
    device_classes: list[str],
) -> None:
    """A claim for *all* the devices of a class, one class per node of the same layout: the
    allocation is the set kube-scheduler's CEL evaluation selected."""
    nodes = {cls: group.add_node(cls.removeprefix("tidelease-"), matrix) for cls in SELECTS}
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        for node in nodes.values():
            offered = wait_published(cluster, node, {f"gpu-{i}" for i in range(8)} - {"gpu-6"})
            assert offered["gpu-3"]["lentBy"] == b.owner_key("job-b")  # the job of its namespace
            assert offered["gpu-4"]["replica"] == "job-b-0"
            assert offered["gpu-5"]["standby"] is True
            assert offered["gpu-1"]["tierRank"] == 2
        for cls, node in nodes.items():
            create_claim_pod(
                cluster, group, plain_scheduler, namespace, cls, node, cls, all_devices=True
            )
        for cls, node in nodes.items():
            assert devices_on(allocated(cluster, namespace, cls), node) == SELECTS[cls], cls


def test_an_ha_claim_gets_the_nodes_ha_device(
    cluster: Cluster,
    namespace: str,
    group: NodeGroup,
    plain_scheduler: str,
    device_classes: list[str],
) -> None:
    """(a) Among LA and MA devices, the one HA device, by the slice's own attributes."""

    def layout(n: str) -> list[Device]:
        return (
            b.devices(n, 1, tier=Tier.LA)
            + b.devices(n, 1, tier=Tier.MA, start=1)
            + b.devices(n, 1, tier=Tier.HA, start=2)
            + b.devices(n, 1, tier=Tier.MA, start=3)
        )

    node = group.add_node("a", layout)
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        offered = wait_published(cluster, node, {"gpu-0", "gpu-1", "gpu-2", "gpu-3"})
        create_claim_pod(
            cluster,
            group,
            plain_scheduler,
            namespace,
            "online",
            node,
            deviceattributes.CLASS_HA,
            owner="job-a",
        )
        (device,) = devices_on(allocated(cluster, namespace, "online"), node)
        assert device == "gpu-2"
        assert offered[device]["tier"] == "HA"
        assert offered[device]["uuid"] == b.device_uuid(node, 2)
        pod = cluster.pod(namespace, "online")
        assert pod["spec"]["nodeName"] == node
        assert pod["spec"]["schedulerName"] == plain_scheduler
        claim = claim_of(cluster, namespace, "online")
        assert claim is not None
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["online"]
        # The slice as stored is what the mirror wants (so it writes no more), owned by the
        # Node; the allocation did not touch it.
        stored = slice_of(cluster, node)
        gpu_node = cluster.kube.get(contract.KIND_GPU_NODE, node)
        assert stored is not None
        assert gpu_node is not None
        assert stored["spec"] == deviceattributes.slice_spec(
            node, deviceattributes.slice_devices(gpu_node), 1
        )
        node_uid = (cluster.kube.get("Node", node) or {})["metadata"]["uid"]
        assert stored["metadata"]["ownerReferences"] == [
            deviceattributes.owner_reference(node, node_uid)
        ]


def test_another_jobs_lent_devices_go_to_borrowers_not_to_a_jobs_own_pods(
    cluster: Cluster,
    namespace: str,
    group: NodeGroup,
    plain_scheduler: str,
    device_classes: list[str],
) -> None:
    """(b) Job B lent the node's HA devices (one more is standby): job A's high-priority pod
    asking tidelease-ha waits, a borrower gets one of B's, and A's pod gets the other once the
    leasing controller takes B's tag off it."""

    def layout(n: str) -> list[Device]:
        return (
            b.devices(n, 2, tier=Tier.HA, owner="job-b")
            + b.devices(n, 1, tier=Tier.HA, start=2, standby=True)
            + b.devices(n, 1, tier=Tier.MA, start=3)
        )

    node = group.add_node("b", layout)
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        offered = wait_published(cluster, node, {"gpu-0", "gpu-1", "gpu-2", "gpu-3"})
        lent = {name for name, a in offered.items() if a["lentBy"] == b.owner_key("job-b")}
        assert lent == {"gpu-0", "gpu-1"}
        a_pod = create_claim_pod(
            cluster,
            group,
            plain_scheduler,
            namespace,
            "job-a-0",
            node,
            deviceattributes.CLASS_HA,
            priority=Priority.HIGH,
            owner="job-a",
        )
        message = wait_pending(cluster, namespace, a_pod)
        # kube-scheduler does not even try to preempt for devices.
        assert "Preemption is not helpful" in message, message

        borrower = create_claim_pod(
            cluster,
            group,
            plain_scheduler,
            namespace,
            "borrower",
            node,
            deviceattributes.CLASS_BORROW,
            selectors=[f'device.attributes["{deviceattributes.DOMAIN}"].tierRank >= 3'],
        )
        (taken,) = devices_on(allocated(cluster, namespace, borrower), node)
        assert taken in lent  # never gpu-2, the standby HA device
        wait_pending(cluster, namespace, a_pod)

        # The leasing controller gives the other device back to the pool: untagged, mirrored.
        (other,) = lent - {taken}
        uuid = offered[other]["uuid"]
        gpu_node = cluster.kube.get(contract.KIND_GPU_NODE, node)
        assert gpu_node is not None
        tags = [d for d in gpu_node["spec"]["devices"] if d["uuid"] != uuid]
        cluster.kube.patch(contract.KIND_GPU_NODE, node, {"spec": {"devices": tags}})
        wait_for(
            lambda: published(cluster, node).get(other, {}).get("lentBy") == "",
            what=f"{other} to be published as not lent",
            timeout=30,
        )
        assert devices_on(allocated(cluster, namespace, a_pod), node) == {other}


def test_an_unhealthy_device_is_never_allocated_until_healthy_again(
    cluster: Cluster,
    namespace: str,
    group: NodeGroup,
    plain_scheduler: str,
    device_classes: list[str],
) -> None:
    """(c) The node's only device is unhealthy: withdrawn from the slice, so the pod waits;
    the agent reports it healthy, the mirror publishes it, the pod gets it."""
    node = group.add_node("c", lambda n: b.devices(n, 1, tier=Tier.HA, healthy=False))
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        wait_published(cluster, node, set())
        pod = create_claim_pod(
            cluster, group, plain_scheduler, namespace, "waits", node, deviceattributes.CLASS_LA
        )
        wait_pending(cluster, namespace, pod)
        # (Read before the change: the mirror may republish before this thread reads again.)
        assert (slice_of(cluster, node) or {})["spec"]["pool"]["generation"] == 1
        status = (cluster.kube.get(contract.KIND_GPU_NODE, node) or {})["status"]
        for device in status["devices"]:
            device["health"] = "Healthy"
        cluster.kube.patch(
            contract.KIND_GPU_NODE,
            node,
            {"status": {"devices": status["devices"]}},
            subresource="status",
        )
        assert wait_published(cluster, node, {"gpu-0"})["gpu-0"]["tier"] == "HA"
        assert (slice_of(cluster, node) or {})["spec"]["pool"]["generation"] == 2
        assert devices_on(allocated(cluster, namespace, pod), node) == {"gpu-0"}


def test_kube_scheduler_preempts_nobody_for_devices(
    cluster: Cluster,
    namespace: str,
    group: NodeGroup,
    plain_scheduler: str,
    device_classes: list[str],
) -> None:
    """A low-priority pod holds the node's only device; a high-priority pod whose class would
    take that device waits: the DynamicResources plugin reports the node unresolvable, so
    preemption finds no victim (right of return by preemption stays the extender's)."""
    node = group.add_node("p", lambda n: b.devices(n, 1, tier=Tier.HA))
    wait_nodes_ready(cluster, group)
    with mirrored(cluster, group.nodes):
        wait_published(cluster, node, {"gpu-0"})
        low = create_claim_pod(
            cluster, group, plain_scheduler, namespace, "low", node, deviceattributes.CLASS_BORROW
        )
        assert devices_on(allocated(cluster, namespace, low), node) == {"gpu-0"}
        high = create_claim_pod(
            cluster,
            group,
            plain_scheduler,
            namespace,
            "high",
            node,
            deviceattributes.CLASS_HA,
            priority=Priority.HIGH,
            owner="job-a",
        )
        message = wait_pending(cluster, namespace, high, "Preemption is not helpful")
        assert NO_DEVICES in message, message
        victim = cluster.pod(namespace, low)
        assert not victim["metadata"].get("deletionTimestamp")
        assert victim["spec"]["nodeName"] == node
