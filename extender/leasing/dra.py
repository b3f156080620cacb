"""Right of return with Dynamic Resource Allocation: who holds which device through a
ResourceClaim, and the allocation that pins a returning replica's claim to its own lent devices.
Pure.

In DRA mode kube-scheduler allocates claims, and nothing tells it which replica lent which
device. An owner's pods therefore carry the scheduling gate :data:`RECLAIM_GATE`; for a
returning replica's pod the leasing controller writes the claim's allocation itself (the
devices of the replica's lent group, :func:`pinned_allocation`, after :func:`finalizer_patch`),
then lifts the gate. kube-scheduler (``DynamicResources``) takes an allocated claim as it is:
it allocates nothing, keeps the pod to the nodes of ``allocation.nodeSelector``, and at bind
adds the pod to ``status.reservedFor``.

What the API server checks of an allocation written through ``resourceclaims/status``
(Kubernetes 1.35, ``ValidateResourceClaimStatusUpdate``): each result's request names one of
the claim's requests, the driver is a DNS subdomain, the pool a valid pool name, the device a
DNS label, at most 32 results, a valid node selector; an allocation once written is immutable.
It checks neither that the devices exist, nor the request's count, class or selectors: that is
this module's job (:func:`pinned_allocation` refuses what kube-scheduler would never write).
Neither it nor kube-scheduler checks that no other claim holds the devices (a pod pinned to a
borrower's device is bound beside the borrower): the controller pins only devices that no
claim of :func:`claim_holdings` holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from common import dra
from common.errors import InvalidInput
from common.model import Device, GpuUuid, Holder, NodeName, PodUid

# The scheduling gate an owner's pod template carries in DRA mode; the controller lifts it.
RECLAIM_GATE: Final = "tidelease.io/reclaim"
# kube-scheduler's (and the resource claim controller's) finalizer of an allocated claim: the
# claim controller clears the allocation of an unused claim only when it is set, and a claim
# with it is not deleted while allocated. Added in a normal update, before the allocation.
FINALIZER: Final = "resource.kubernetes.io/delete-protection"
# The node selector of a node-local allocation, as the structured allocator writes it.
NODE_FIELD: Final = "metadata.name"
MAX_RESULTS: Final = 32  # AllocationResultsMaxSize
CONFIG_FROM_CLAIM: Final = "FromClaim"
_DEVICE_NAME: Final = re.compile(rf"^{re.escape(dra.DEVICE_PREFIX)}(0|[1-9][0-9]*)$")


def device_name(index: int) -> str:
    """A device's name in its node's ResourceSlice: ``gpu-<index>``."""
    return f"{dra.DEVICE_PREFIX}{index}"


def device_index(name: str) -> int | None:
    """The index in a device name ``gpu-<index>``; None for any other name."""
    match = _DEVICE_NAME.match(name)
    return int(match.group(1)) if match else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def claim_devices(claim: Mapping[str, Any]) -> tuple[tuple[NodeName, str], ...]:
    """The tidelease devices allocated to ``claim``, as (node, device name) in the order of
    its results: those of driver ``gpu.tidelease.io`` (their pool is their node). Other
    drivers' devices, and an unallocated claim, give none."""
    status = _mapping(claim.get("status"))
    results = _list(_mapping(_mapping(status.get("allocation")).get("devices")).get("results"))
    out = []
    for result in results:
        r = _mapping(result)
        pool, device = _str(r.get("pool")), _str(r.get("device"))
        if r.get("driver") == dra.DRIVER and pool and device:
            out.append((NodeName(pool), device))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ReservedPod:
    """A pod in a claim's ``status.reservedFor`` (in the claim's namespace)."""

    namespace: str
    name: str
    uid: PodUid


@dataclass(frozen=True, slots=True)
class ClaimHolding:
    """What one allocated claim holds of tidelease's devices, and for which pods."""

    namespace: str
    claim: str
    node: NodeName  # "" when the claim holds no device known to a GpuNode
    devices: tuple[GpuUuid, ...]  # in the order of the allocation's results
    pods: tuple[ReservedPod, ...]  # status.reservedFor, pods only, in order
    # Devices the allocation names that no GpuNode knows (gone, or its index on two devices):
    # (node, device name).
    unknown: tuple[tuple[NodeName, str], ...] = ()


def reserved_pods(claim: Mapping[str, Any]) -> tuple[ReservedPod, ...]:
    """The pods of ``claim``'s ``status.reservedFor`` (entries of resource "pods", core group,
    with a name and a UID)."""
    namespace = _str(_mapping(claim.get("metadata")).get("namespace"))
    out = []
    for entry in _list(_mapping(claim.get("status")).get("reservedFor")):
        e = _mapping(entry)
        name, uid = _str(e.get("name")), _str(e.get("uid"))
        if e.get("resource") == "pods" and not e.get("apiGroup") and name and uid:
            out.append(ReservedPod(namespace, name, PodUid(uid)))
    return tuple(out)


def _by_name(devices: Iterable[Device]) -> dict[tuple[NodeName, str], Device]:
    """Devices by (node, slice name); an index two devices of a node claim names neither (the
    slice publishes neither: common.dra.published)."""
    found: dict[tuple[NodeName, str], Device] = {}
    twice: set[tuple[NodeName, str]] = set()
    for d in devices:
        key = (d.node, device_name(d.index))
        if key in found:
            twice.add(key)
        found[key] = d
    return {k: v for k, v in found.items() if k not in twice}


def claim_holdings(
    claims: Iterable[Mapping[str, Any]], devices: Iterable[Device]
) -> tuple[ClaimHolding, ...]:
    """Each allocated claim that holds tidelease devices, its devices by UUID (through the
    GpuNodes' devices, ``devices``) and the pods it is reserved for; claims without a tidelease
    device are left out."""
    known = _by_name(devices)
    out = []
    for claim in claims:
        named = claim_devices(claim)
        if not named:
            continue
        meta = _mapping(claim.get("metadata"))
        found = [known[n] for n in named if n in known]
        out.append(
            ClaimHolding(
                namespace=_str(meta.get("namespace")),
                claim=_str(meta.get("name")),
                node=found[0].node if found else NodeName(""),
                devices=tuple(d.uuid for d in found),
                pods=reserved_pods(claim),
                unknown=tuple(n for n in named if n not in known),
            )
        )
    return tuple(out)


def pod_devices(
    holdings: Iterable[ClaimHolding],
) -> dict[PodUid, tuple[NodeName, tuple[GpuUuid, ...]]]:
    """Per reserved pod, its node and the devices of all its claims (the extender's ledger's
    ``where``, for ``OwnerPod``)."""
    out: dict[PodUid, tuple[NodeName, tuple[GpuUuid, ...]]] = {}
    for h in holdings:
        if not h.devices:
            continue
        for pod in h.pods:
            node, held = out.get(pod.uid, (h.node, ()))
            out[pod.uid] = (node, held + h.devices)
    return out


def device_holders(
    holdings: Iterable[ClaimHolding], pods: Mapping[PodUid, Holder]
) -> dict[GpuUuid, Holder]:
    """Who holds each device (the View's ``holders``): the first pod of the claim's
    ``reservedFor`` that ``pods`` (the watched pods, as holders) knows. A device whose claim is
    reserved for no known pod has no holder (allocated but not in use: kube-scheduler does not
    count it free either, but no pod is there to evict)."""
    out: dict[GpuUuid, Holder] = {}
    for h in holdings:
        holder = next((pods[p.uid] for p in h.pods if p.uid in pods), None)
        if holder is None:
            continue
        for uuid in h.devices:
            out[uuid] = holder
    return out


# --- pinning a claim ---


def _where(claim: Mapping[str, Any]) -> str:
    meta = _mapping(claim.get("metadata"))
    return f"ResourceClaim {_str(meta.get('namespace'))}/{_str(meta.get('name'))}"


def _request(claim: Mapping[str, Any], wanted: int) -> str:
    """The name of the claim's one request, which must ask for exactly ``wanted`` devices."""
    where = _where(claim)
    requests = _list(_mapping(_mapping(claim.get("spec")).get("devices")).get("requests"))
    if len(requests) != 1:
        raise InvalidInput(
            f"{where} has {len(requests)} device requests: only a claim with one request can "
            "be pinned to a replica's lent devices"
        )
    request = _mapping(requests[0])
    name = _str(request.get("name"))
    exactly = request.get("exactly")
    if not name or not isinstance(exactly, Mapping):
        raise InvalidInput(
            f"{where}: its request {name!r} must name exactly one device class (`exactly`); "
            "a request with alternatives (firstAvailable) cannot be pinned"
        )
    problems = []
    mode = exactly.get("allocationMode", "ExactCount")
    count = exactly.get("count", 1)
    if mode != "ExactCount":
        problems.append(f"its request {name!r} has allocationMode {mode}, not ExactCount")
    elif count != wanted:
        problems.append(f"its request {name!r} asks for {count} devices, not the {wanted} given")
    if exactly.get("adminAccess"):
        problems.append(f"its request {name!r} asks for admin access")
    if problems:
        raise InvalidInput([f"{where}: {p}" for p in problems])
    return name


def _configs(claim: Mapping[str, Any], request: str) -> list[dict[str, Any]]:
    """The claim's configurations for ``request``, as kube-scheduler copies them into an
    allocation (``source: FromClaim``; tidelease's DeviceClasses carry none)."""
    out = []
    for entry in _list(_mapping(_mapping(claim.get("spec")).get("devices")).get("config")):
        config = dict(_mapping(entry))
        requests = _list(config.get("requests"))
        if requests and request not in requests:
            continue
        out.append({"source": CONFIG_FROM_CLAIM, **config})
    return out


def node_selector(node: str) -> dict[str, Any]:
    """The allocation's node selector for devices local to ``node``, as kube-scheduler's
    allocator writes it (a field selector: a node's ``kubernetes.io/hostname`` label need not
    be its name)."""
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": NODE_FIELD, "operator": "In", "values": [node]}]}
        ]
    }


def pinned_allocation(claim: Mapping[str, Any], devices: Sequence[Device]) -> dict[str, Any]:
    """The ``status`` of ``claim`` that allocates it exactly ``devices`` (of one node, in this
    order), as kube-scheduler would have: one result per device for the claim's request,
    driver ``gpu.tidelease.io``, pool = the node, the node selector of :func:`node_selector`,
    the claim's configurations. Write it to ``resourceclaims/status`` (with the claim's
    resourceVersion) after :func:`finalizer_patch`, while the pod's gate keeps kube-scheduler
    away.

    Raises :class:`InvalidInput` for a claim that cannot be pinned so: already allocated, not
    one ``ExactCount`` request for as many devices as given, admin access; and for devices
    that are none, repeated, on several nodes, or more than an allocation may hold."""
    where = _where(claim)
    if _mapping(claim.get("status")).get("allocation") is not None:
        raise InvalidInput(f"{where} is allocated already (an allocation is immutable)")
    if not devices:
        raise InvalidInput(f"{where}: no devices to pin")
    nodes = sorted({d.node for d in devices})
    if len(nodes) != 1:
        raise InvalidInput(f"{where}: the devices are on several nodes {nodes}, not on one")
    names = [device_name(d.index) for d in devices]
    if len(set(names)) != len(names):
        raise InvalidInput(f"{where}: a device is given twice: {names}")
    if len(names) > MAX_RESULTS:
        raise InvalidInput(f"{where}: {len(names)} devices, more than {MAX_RESULTS} results")
    request = _request(claim, len(names))
    (node,) = nodes
    results = [
        {"request": request, "driver": dra.DRIVER, "pool": node, "device": name} for name in names
    ]
    result_devices: dict[str, Any] = {"results": results}
    configs = _configs(claim, request)
    if configs:
        result_devices["config"] = configs
    return {"allocation": {"devices": result_devices, "nodeSelector": node_selector(node)}}


def finalizer_patch(claim: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch of ``claim``'s metadata that adds :data:`FINALIZER` (with its
    resourceVersion, so that it fails on a claim changed meanwhile), or None when it is set."""
    meta = _mapping(claim.get("metadata"))
    finalizers = [f for f in _list(meta.get("finalizers")) if isinstance(f, str)]
    if FINALIZER in finalizers:
        return None
    version = _str(meta.get("resourceVersion"))
    patch: dict[str, Any] = {"finalizers": [*finalizers, FINALIZER]}
    if version:
        patch["resourceVersion"] = version
    return {"metadata": patch}


def ungated(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch of ``pod``'s spec that lifts :data:`RECLAIM_GATE` (other gates stay), or
    None when the pod does not carry it."""
    gates = _list(_mapping(pod.get("spec")).get("schedulingGates"))
    kept = [g for g in gates if _mapping(g).get("name") != RECLAIM_GATE]
    if len(kept) == len(gates):
        return None
    return {"spec": {"schedulingGates": kept or None}}
