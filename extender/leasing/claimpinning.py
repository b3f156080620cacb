"""Right of return with Dynamic Resource Allocation: who holds which device through a
ResourceClaim, the allocation that pins a returning replica's claim to its own lent devices, and
which gated pod to pin or let go next (:func:`next_claim_step`). Pure.

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
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Final

from common import contract, deviceattributes
from common.coercion import items, mapping, text
from common.errors import InvalidInput
from common.model import Device, GpuUuid, Holder, NodeName, PodUid
from extender.rightofreturn.lease import GpuLease, LentGroup
from extender.rightofreturn.replicas import names_replicas
from extender.rightofreturn.rules import ordinal

# The scheduling gate an owner's pod template carries in DRA mode; the controller lifts it.
RECLAIM_GATE: Final = contract.RECLAIM_GATE
# kube-scheduler's (and the resource claim controller's) finalizer of an allocated claim: the
# claim controller clears the allocation of an unused claim only when it is set, and a claim
# with it is not deleted while allocated. Added in a normal update, before the allocation.
FINALIZER: Final = "resource.kubernetes.io/delete-protection"
# The annotation the controller writes on a claim it pins: the lent group it takes back (or
# stands in for). A Deployment's pod whose claim names a group has that group, whatever devices
# it was given; no other pod is pinned to it.
RETURNED_GROUP: Final = "tidelease.io/returned-group"
# The node selector of a node-local allocation, as the structured allocator writes it.
NODE_FIELD: Final = "metadata.name"
MAX_RESULTS: Final = 32  # AllocationResultsMaxSize
CONFIG_FROM_CLAIM: Final = "FromClaim"
_DEVICE_NAME: Final = re.compile(rf"^{re.escape(deviceattributes.DEVICE_PREFIX)}(0|[1-9][0-9]*)$")


class PinRefused(InvalidInput):
    """The API server refused a claim's pin (403, 422): retrying cannot help."""


def device_name(index: int) -> str:
    """A device's name in its node's ResourceSlice: ``gpu-<index>``."""
    return f"{deviceattributes.DEVICE_PREFIX}{index}"


def device_index(name: str) -> int | None:
    """The index in a device name ``gpu-<index>``; None for any other name."""
    match = _DEVICE_NAME.match(name)
    return int(match.group(1)) if match else None


def claim_devices(claim: Mapping[str, Any]) -> tuple[tuple[NodeName, str], ...]:
    """The tidelease devices allocated to ``claim``, as (node, device name) in the order of
    its results: those of driver ``gpu.tidelease.io`` (their pool is their node). Other
    drivers' devices, and an unallocated claim, give none."""
    status = mapping(claim.get("status"))
    results = items(mapping(mapping(status.get("allocation")).get("devices")).get("results"))
    out = []
    for result in results:
        r = mapping(result)
        pool, device = text(r.get("pool")), text(r.get("device"))
        if r.get("driver") == deviceattributes.DRIVER and pool and device:
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
    namespace = text(mapping(claim.get("metadata")).get("namespace"))
    out = []
    for entry in items(mapping(claim.get("status")).get("reservedFor")):
        e = mapping(entry)
        name, uid = text(e.get("name")), text(e.get("uid"))
        if e.get("resource") == "pods" and not e.get("apiGroup") and name and uid:
            out.append(ReservedPod(namespace, name, PodUid(uid)))
    return tuple(out)


def _by_name(devices: Iterable[Device]) -> dict[tuple[NodeName, str], Device]:
    """Devices by (node, slice name); an index two devices of a node claim names neither (the
    slice publishes neither: common.deviceattributes.published)."""
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
        meta = mapping(claim.get("metadata"))
        found = [known[n] for n in named if n in known]
        out.append(
            ClaimHolding(
                namespace=text(meta.get("namespace")),
                claim=text(meta.get("name")),
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
    meta = mapping(claim.get("metadata"))
    return f"ResourceClaim {text(meta.get('namespace'))}/{text(meta.get('name'))}"


def _request(claim: Mapping[str, Any], wanted: int) -> str:
    """The name of the claim's one request, which must ask for exactly ``wanted`` devices."""
    where = _where(claim)
    requests = items(mapping(mapping(claim.get("spec")).get("devices")).get("requests"))
    if len(requests) != 1:
        raise InvalidInput(
            f"{where} has {len(requests)} device requests: only a claim with one request can "
            "be pinned to a replica's lent devices"
        )
    request = mapping(requests[0])
    name = text(request.get("name"))
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
    for entry in items(mapping(mapping(claim.get("spec")).get("devices")).get("config")):
        config = dict(mapping(entry))
        requests = items(config.get("requests"))
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
    if mapping(claim.get("status")).get("allocation") is not None:
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
        {"request": request, "driver": deviceattributes.DRIVER, "pool": node, "device": name}
        for name in names
    ]
    result_devices: dict[str, Any] = {"results": results}
    configs = _configs(claim, request)
    if configs:
        result_devices["config"] = configs
    return {"allocation": {"devices": result_devices, "nodeSelector": node_selector(node)}}


def finalizer_patch(claim: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch of ``claim``'s metadata that adds :data:`FINALIZER` (with its
    resourceVersion, so that it fails on a claim changed meanwhile), or None when it is set."""
    meta = mapping(claim.get("metadata"))
    finalizers = [f for f in items(meta.get("finalizers")) if isinstance(f, str)]
    if FINALIZER in finalizers:
        return None
    version = text(meta.get("resourceVersion"))
    patch: dict[str, Any] = {"finalizers": [*finalizers, FINALIZER]}
    if version:
        patch["resourceVersion"] = version
    return {"metadata": patch}


def pin_patch(claim: Mapping[str, Any], group: str) -> dict[str, Any] | None:
    """The merge patch of ``claim``'s metadata that adds :data:`FINALIZER` and names the lent
    ``group`` in :data:`RETURNED_GROUP` (with its resourceVersion), or None when both are so."""
    patch = finalizer_patch(claim) or {"metadata": {}}
    meta = mapping(claim.get("metadata"))
    if mapping(meta.get("annotations")).get(RETURNED_GROUP) != group:
        patch["metadata"]["annotations"] = {RETURNED_GROUP: group}
        version = text(meta.get("resourceVersion"))
        if version:
            patch["metadata"]["resourceVersion"] = version
    return patch if patch["metadata"] else None


def returned_group(claim: Mapping[str, Any] | None) -> str:
    """The lent group a pinned claim takes back (:data:`RETURNED_GROUP`), "" for none."""
    annotations = mapping(mapping((claim or {}).get("metadata")).get("annotations"))
    return text(annotations.get(RETURNED_GROUP))


def claim_stays(claim: Mapping[str, Any], live: Set[str]) -> bool:
    """Whether ``claim`` stays with its pod: not being deleted, and the pod that owns it (a
    template's claim) among ``live`` (pods present and not being deleted, by UID). A claim no
    pod owns stays while it exists."""
    meta = mapping(claim.get("metadata"))
    if meta.get("deletionTimestamp"):
        return False
    owners = [mapping(r) for r in items(meta.get("ownerReferences"))]
    pods = [text(r.get("uid")) for r in owners if r.get("kind") == "Pod"]
    return all(uid in live for uid in pods)


def ungated(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch of ``pod``'s spec that lifts :data:`RECLAIM_GATE` (other gates stay), or
    None when the pod does not carry it."""
    gates = items(mapping(pod.get("spec")).get("schedulingGates"))
    kept = [g for g in gates if mapping(g).get("name") != RECLAIM_GATE]
    if len(kept) == len(gates):
        return None
    return {"spec": {"schedulingGates": kept or None}}


# --- which gated pod to pin, or to let go ---


@dataclass(frozen=True, slots=True)
class GatedPod:
    """An owner's pod held back by :data:`RECLAIM_GATE`."""

    namespace: str
    name: str
    uid: PodUid
    # Its ResourceClaims by name, in the order of spec.resourceClaims; "" for one not created
    # yet (a template's claim is named in status.resourceClaimStatuses once it exists).
    claims: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def gated_pod(pod: Mapping[str, Any]) -> GatedPod | None:
    """``pod`` as a :class:`GatedPod` while it carries :data:`RECLAIM_GATE` and is not being
    deleted; None otherwise."""
    meta, spec = mapping(pod.get("metadata")), mapping(pod.get("spec"))
    if meta.get("deletionTimestamp"):
        return None
    gates = items(spec.get("schedulingGates"))
    if not any(mapping(g).get("name") == RECLAIM_GATE for g in gates):
        return None
    created = {
        text(mapping(s).get("name")): text(mapping(s).get("resourceClaimName"))
        for s in items(mapping(pod.get("status")).get("resourceClaimStatuses"))
    }
    claims = []
    for ref in items(spec.get("resourceClaims")):
        r = mapping(ref)
        direct = text(r.get("resourceClaimName"))
        claims.append(direct or created.get(text(r.get("name")), ""))
    return GatedPod(
        text(meta.get("namespace")),
        text(meta.get("name")),
        PodUid(text(meta.get("uid"))),
        tuple(claims),
    )


@dataclass(frozen=True, slots=True)
class Pin:
    """Allocate ``claim`` the devices of lent group ``group`` (``status``, from
    :func:`pinned_allocation`), then lift ``pod``'s gate."""

    pod: GatedPod
    claim: Mapping[str, Any]
    status: dict[str, Any]
    devices: tuple[Device, ...]
    group: str
    standby: bool = False  # the devices are standby devices standing in for the group's


@dataclass(frozen=True, slots=True)
class Ungate:
    """Lift ``pod``'s gate without pinning: kube-scheduler allocates its claims as for any pod
    (or it holds its pinned claim already)."""

    pod: GatedPod
    why: str
    warning: bool = False  # a pod that should have been pinned and cannot be


ClaimStep = Pin | Ungate


def _returning_group(
    lease: GpuLease, pod: GatedPod, owned: Set[GpuUuid], skip: Set[str], own: str
) -> LentGroup | None:
    """The lent group ``pod`` takes back, if its lease reclaims one for it: a StatefulSet's
    replica its own group (by name, :func:`extender.rightofreturn.replicas.names_replicas`); another
    workload's pod the group its claim names already (``own``: a pin cut short), else the
    first reclaimed group that is not back yet (not all its devices ``owned``: held by the
    owner's pods, or pinned for them) and that neither another claim names nor a pod before it
    in this pass took (``skip``)."""
    status = lease.status
    if status.phase != "Reclaiming" or status.finalizing:
        return None
    back = [g for g in status.groups if g.replica in status.reclaiming]
    if names_replicas(lease.spec.workload.kind):
        return next((g for g in back if g.replica == pod.name), None)
    mine = next((g for g in back if own and g.replica == own), None)
    if mine is not None:
        return mine
    return next(
        (g for g in back if g.replica not in skip and not all(u in owned for u in g.devices)),
        None,
    )


def next_claim_step(
    lease: GpuLease,
    gated: Sequence[GatedPod],
    claims: Mapping[tuple[str, str], Mapping[str, Any]],
    devices: Mapping[GpuUuid, Device],
    offering: Mapping[str, bool],
    taken: Set[GpuUuid],
    owned: Set[GpuUuid] = frozenset(),
    live: Set[str] = frozenset(),
) -> ClaimStep | None:
    """The next write for the lease's gated pods (``gated``, in the lease's namespace, the
    owner's), or None while none can go yet.

    A pod that takes back a lent group (:func:`_returning_group`) is pinned to the group's
    devices once its one claim exists and none of the devices is ``taken`` (held by an
    allocated claim: a borrower's, until the claim controller deallocates it; or pinned a
    moment ago, not yet seen by the watch), then let go; ``owned`` (the devices the owner's
    pods hold or were pinned) tells a Deployment's reclaimed groups that are back from those
    still to pin, with the groups named by the claims that stay (:func:`claim_stays`, ``live``
    the UIDs of the pods present and not being deleted). A pod whose claim is allocated
    already (pinned by a step that ended before the gate was lifted) is let go. A group that
    cannot come back whole (a device gone, unhealthy, on a node that does not offer it) is
    stood in for by standby devices (:func:`standby_stand_ins`), as the extender backfills a
    reclaim; without enough of them, or for a claim that cannot be pinned (not one request for
    as many devices as the group has), the pod goes unpinned, with a warning: kube-scheduler
    allocates it from its class.
    Every other gated pod is let go at once: it returns from no loan."""
    named = {}  # the claims that stay and name a group, by (namespace, name)
    for key, held in claims.items():
        name = returned_group(held) if key[0] == lease.namespace else ""
        if name and claim_stays(held, live):
            named[key] = name
    passed: set[str] = set()  # the groups of the pods before this one in the pass
    for pod in sorted(gated, key=lambda p: (ordinal(p.name), p.name)):
        mine = [(pod.namespace, c) for c in pod.claims if c]
        own = next((named[k] for k in mine if k in named), "")
        skip = passed | {g for k, g in named.items() if k not in mine}
        group = _returning_group(lease, pod, owned, skip, own)
        if group is None:
            return Ungate(pod, "it takes back no lent group")
        passed.add(group.replica)
        if len(pod.claims) != 1:
            return Ungate(
                pod,
                f"it has {len(pod.claims)} ResourceClaims: only a pod with one claim is pinned "
                f"to its lent group {group.replica}",
                warning=True,
            )
        claim = claims.get((pod.namespace, pod.claims[0])) if pod.claims[0] else None
        if claim is None:
            continue  # the claim controller has not made it yet, or the watch lags
        if mapping(claim.get("status")).get("allocation") is not None:
            return Ungate(pod, f"its claim {pod.claims[0]} is allocated")
        wanted = [devices.get(u) for u in group.devices]
        lost = [
            u
            for u, d in zip(group.devices, wanted, strict=True)
            if d is None or not d.cls.healthy or not offering.get(d.node, False)
        ]
        if lost:
            stand_ins = standby_stand_ins(
                [d for d in wanted if d is not None], len(group.devices), devices, offering, taken
            )
            if not stand_ins:
                return Ungate(
                    pod,
                    f"its lent group {group.replica} cannot come back whole ({', '.join(lost)} "
                    "gone, unhealthy or on a node that offers none), and no node has as many "
                    "free standby devices of its type and tier: kube-scheduler allocates its "
                    "claim from its class",
                    warning=True,
                )
            found, standby = stand_ins, True
        elif any(u in taken for u in group.devices):
            continue  # a borrower's claim still holds a device: the reclaim evicts it first
        else:
            found, standby = tuple(d for d in wanted if d is not None), False
        try:
            status = pinned_allocation(claim, found)
        except InvalidInput as e:
            return Ungate(pod, f"its claim cannot be pinned: {e}", warning=True)
        return Pin(pod, claim, status, found, group.replica, standby)
    return None


def standby_stand_ins(
    known: Sequence[Device],
    count: int,
    devices: Mapping[GpuUuid, Device],
    offering: Mapping[str, bool],
    taken: Set[GpuUuid],
) -> tuple[Device, ...]:
    """``count`` free standby devices on one node to stand in for a lent group that cannot
    come back whole, as the extender backfills a reclaim: healthy, in the pool (no owner
    holds them on loan), on a node that offers them, held by no claim (``taken``), of the
    type and tier of the group's devices still known (``known``; none known, none found).
    The node with the fewest such devices that has enough (whole standby nodes are kept for
    whole replicas), then by name; its lowest indexes. Empty when no node has enough."""
    kinds = {(d.gpu_type, d.tier) for d in known}
    if len(kinds) != 1 or count < 1:
        return ()
    ((gpu_type, tier),) = kinds
    by_node: dict[NodeName, list[Device]] = {}
    for d in devices.values():
        c = d.cls
        if not (c.standby and c.healthy and c.owner is None and c.gpu_type == gpu_type):
            continue
        if c.tier is tier and offering.get(d.node, False) and d.uuid not in taken:
            by_node.setdefault(d.node, []).append(d)
    fits = sorted((len(v), n) for n, v in by_node.items() if len(v) >= count)
    if not fits:
        return ()
    _, node = fits[0]
    return tuple(sorted(by_node[node], key=lambda d: d.index)[:count])


# --- keeping borrowers off devices being reclaimed ---


@dataclass(frozen=True, slots=True)
class MarkReclaiming:
    """Set (True) or clear (False) ``reclaiming`` on these GpuNode devices' tags, per node:
    the slices then tell ``tidelease-borrow`` claims to keep off them
    (:data:`common.deviceattributes.ATTR_RECLAIMING`)."""

    marks: Mapping[NodeName, Mapping[GpuUuid, bool]]

    @property
    def why(self) -> str:
        on = sum(v for m in self.marks.values() for v in m.values())
        off = sum(not v for m in self.marks.values() for v in m.values())
        return f"mark {on} device(s) being reclaimed, clear {off}"


def reclaimed_devices(lease: GpuLease) -> frozenset[GpuUuid]:
    """The devices of the groups the lease's reclaim takes back, until its pods are placed
    (then the owner holds them): those a borrower's claim must not be allocated. None outside a
    reclaim."""
    status = lease.status
    if status.phase != "Reclaiming" or status.finalizing:
        return frozenset()
    return frozenset(u for g in status.groups if g.replica in status.reclaiming for u in g.devices)


def reclaiming_marks(
    lease: GpuLease,
    devices: Mapping[GpuUuid, Device],
    marked: Mapping[tuple[NodeName, GpuUuid], str | None],
    others: Sequence[GpuLease],
) -> MarkReclaiming | None:
    """The marks to write so that the lease's :func:`reclaimed_devices` are marked, and no
    device tagged with its owner stays marked unless another lease's reclaim takes it back
    (``others``: every other GpuLease; owners' names are not per namespace), nor one tagged
    with an owner no lease names (a lease deleted past its finalizer). ``marked`` is what the
    GpuNodes say now, per (node, device), with the device's owner tag there
    (:attr:`extender.cluster.state.NodeState.reclaiming`), so a restarted or newly leading
    controller starts from what stands. A device without an owner tag cannot be marked (its
    owner is tagged first, then it is). None when nothing is to be written."""
    want = reclaimed_devices(lease)
    kept = {u for other in others for u in reclaimed_devices(other)}
    owner = lease.spec.owner
    owners = {owner} | {other.spec.owner for other in others}
    marks: dict[NodeName, dict[GpuUuid, bool]] = {}
    for u in sorted(want):
        d = devices.get(u)
        if d is not None and d.cls.owner is not None and (d.node, u) not in marked:
            marks.setdefault(d.node, {})[u] = True
    for (node, u), tag in sorted(marked.items()):
        if u not in want and u not in kept and (tag == owner or tag not in owners):
            marks.setdefault(node, {})[u] = False
    return MarkReclaiming(marks) if marks else None
