"""Which devices a prepared ResourceClaim gives its containers, and how: pure decisions.

The kubelet names a claim (namespace, name, UID); the plugin reads the ResourceClaim and hands it
here with the node's GPUs. :func:`decide` takes the claim's allocation results of this driver in
this node's pool (results of other drivers, or of other pools, are someone else's), maps each
device name (``gpu-<index>``, as the node's ResourceSlice publishes them) to its GPU and returns
what the kubelet and the container runtime get, or why the claim is refused: the UID is not the
claim's any more, the claim is not allocated, a device is not a GPU of this node or is unhealthy.

What a container gets (the CDI devices of the claim's spec file):

* one CDI device per allocated GPU, ``<kind>=<claim uid>_<device>``, with its device nodes
  (``/dev/nvidiaN``; on the host under ``host_root``);
* one CDI device per request, ``<kind>=<claim uid>_request_<request>``, whose only edit is
  ``NVIDIA_VISIBLE_DEVICES=<UUIDs of that request's GPUs>``, the contract the device plugin
  gives (:mod:`nodeagent.deviceplugin.granting`);
* the control devices (``/dev/nvidiactl``...), when configured, as the spec's own edits, which
  the runtime applies once with any device of the spec.

Each device result answers both its GPU's CDI device and its request's, so a container that
names a request (``resources.claims[].request``) gets the nodes of exactly that request's GPUs
and one environment edit listing exactly their UUIDs, however many GPUs the request has (the
runtime skips the repeated request device). The environment variable is one value, so CDI edits
cannot add to it: a container that takes a claim of several requests *as a whole* gets every
request's nodes but the ``NVIDIA_VISIBLE_DEVICES`` of only one of them (the last the runtime
applies). Pod authors who give one container several requests' GPUs name the claim with a single
request. GPU CDI device names are unique per claim and device; request CDI device names per claim
and request (``_`` cannot occur in a device or request name), so specs of several claims never
define the same CDI device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.errors import InvalidInput

if TYPE_CHECKING:
    from nodeagent.deviceplugin.devices import PluginDevice

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
# Claim UIDs name files and CDI devices: the API server makes them UUIDs, this keeps them safe.
_UID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,126}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def device_name(index: int) -> str:
    """The name of GPU ``index`` in the node's ResourceSlice (and in allocation results)."""
    return f"gpu-{index}"


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources and NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


def check_ref(ref: ClaimRef) -> str | None:
    """Why the kubelet's name for a claim is unusable (its UID names files), or None."""
    if not _DNS_LABEL.match(ref.namespace):
        return f"namespace {ref.namespace!r} is not a DNS label"
    if len(ref.name) > 253 or not _DNS_SUBDOMAIN.match(ref.name):
        return f"claim name {ref.name!r} is not a DNS subdomain"
    if not _UID.match(ref.uid):
        return f"claim UID {ref.uid!r} is not a UID"
    return None


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """One entry of ``status.allocation.devices.results``."""

    request: str  # "request" or "request/subrequest"
    driver: str
    pool: str
    device: str

    @property
    def base_request(self) -> str:
        """The claim's request the device was allocated for (a subrequest's parent)."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class ClaimObject:
    """What the plugin reads of a ResourceClaim."""

    namespace: str
    name: str
    uid: str
    results: tuple[AllocationResult, ...] | None  # None: no status.allocation


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str, *, required: bool) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return kind()
    if not isinstance(value, kind):
        raise InvalidInput(f"{where}.{key} is not a {kind.__name__}: {value!r:.80}")
    return value


def parse_claim(obj: object) -> ClaimObject:
    """The ResourceClaim (resource.k8s.io/v1) as the API returns it. Raises InvalidInput."""
    if not isinstance(obj, Mapping):
        raise InvalidInput(f"the ResourceClaim is not an object: {obj!r:.80}")
    meta = _field(obj, "metadata", dict, "claim", required=True)
    uid = _field(meta, "uid", str, "metadata", required=True)
    namespace = _field(meta, "namespace", str, "metadata", required=False)
    name = _field(meta, "name", str, "metadata", required=False)
    status = _field(obj, "status", dict, "claim", required=False)
    allocation = status.get("allocation")
    if allocation is None:
        return ClaimObject(namespace, name, uid, None)
    if not isinstance(allocation, dict):
        raise InvalidInput(f"status.allocation is not an object: {allocation!r:.80}")
    devices = _field(allocation, "devices", dict, "status.allocation", required=False)
    raw = _field(devices, "results", list, "status.allocation.devices", required=False)
    results = []
    for i, entry in enumerate(raw):
        where = f"status.allocation.devices.results[{i}]"
        if not isinstance(entry, dict):
            raise InvalidInput(f"{where} is not an object: {entry!r:.80}")
        results.append(
            AllocationResult(
                request=_field(entry, "request", str, where, required=True),
                driver=_field(entry, "driver", str, where, required=True),
                pool=_field(entry, "pool", str, where, required=True),
                device=_field(entry, "device", str, where, required=True),
            )
        )
    return ClaimObject(namespace, name, uid, tuple(results))


@dataclass(frozen=True, slots=True)
class Target:
    """Whose results a claim's allocation holds for this plugin, and how devices are given."""

    driver: str
    pool: str  # the node name
    cdi_kind: str  # "vendor/class"
    host_root: str = ""  # where the host's "/" is for device nodes; "" on a real node
    permissions: str = "rw"
    control_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceNode:
    path: str  # in the container
    host_path: str
    permissions: str


@dataclass(frozen=True, slots=True)
class CdiDevice:
    name: str  # unqualified: the part after "<kind>="
    env: tuple[str, ...] = ()  # "KEY=value"
    device_nodes: tuple[DeviceNode, ...] = ()


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of the answer to the kubelet (the DRA API's Device)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    uuid: str  # the GPU's, for the logs


@dataclass(frozen=True, slots=True)
class Prepared:
    claim: ClaimRef
    devices: tuple[PreparedDevice, ...]
    cdi_devices: tuple[CdiDevice, ...]  # the spec file's devices; none: no file
    common_nodes: tuple[DeviceNode, ...] = ()  # the spec's own edits (control devices)

    def summary(self) -> str:
        """What the claim got, for the logs: ``gpu-0=GPU-... (request gpus), ...``."""
        if not self.devices:
            return "no device of this node"
        return ", ".join(
            f"{d.device_name}={d.uuid} (request {','.join(d.request_names)})" for d in self.devices
        )


@dataclass(frozen=True, slots=True)
class Refused:
    claim: ClaimRef
    reason: str


def _node(path: str, target: Target) -> DeviceNode:
    return DeviceNode(path, target.host_root.rstrip("/") + path, target.permissions)


def decide(
    ref: ClaimRef, claim: ClaimObject, gpus: Sequence[PluginDevice], target: Target
) -> Prepared | Refused:
    """What preparing ``claim`` (read for ``ref``) gives, with the node's ``gpus`` now."""
    problem = check_ref(ref)
    if problem is not None:
        return Refused(ref, problem)
    if claim.uid != ref.uid:
        return Refused(ref, f"the claim's UID is {claim.uid} now: it was deleted and made again")
    if claim.results is None:
        return Refused(ref, "the claim is not allocated (no status.allocation)")
    ours = [r for r in claim.results if r.driver == target.driver and r.pool == target.pool]
    by_name = {device_name(g.index): g for g in gpus}
    requests: dict[str, list[PluginDevice]] = {}
    seen: set[str] = set()
    for result in ours:
        gpu = by_name.get(result.device)
        if gpu is None:
            return Refused(ref, f"device {result.device} is not a GPU of node {target.pool}")
        if not gpu.healthy:
            return Refused(ref, f"device {result.device} ({gpu.uuid}) is unhealthy")
        if result.device in seen:
            return Refused(ref, f"device {result.device} is allocated twice in the claim")
        if not _DNS_LABEL.match(result.base_request):
            return Refused(ref, f"request name {result.request!r} is not a DNS label")
        seen.add(result.device)
        requests.setdefault(result.base_request, []).append(gpu)
    if not ours:
        return Prepared(ref, (), ())

    def cdi_id(name: str) -> str:
        return f"{target.cdi_kind}={name}"

    # A CDI device must edit something: a GPU without device nodes has only its request's.
    cdi_devices = [
        CdiDevice(
            f"{ref.uid}_{device_name(g.index)}",
            device_nodes=tuple(_node(p, target) for p in dict.fromkeys(g.paths)),
        )
        for gpus_of in requests.values()
        for g in gpus_of
        if g.paths
    ]
    cdi_devices += [
        CdiDevice(
            f"{ref.uid}_request_{request}",
            env=(f"{VISIBLE_DEVICES_ENV}={','.join(g.uuid for g in gpus_of)}",),
        )
        for request, gpus_of in requests.items()
    ]
    devices = tuple(
        PreparedDevice(
            request_names=(result.base_request,),
            pool_name=result.pool,
            device_name=result.device,
            cdi_device_ids=(
                *((cdi_id(f"{ref.uid}_{result.device}"),) if by_name[result.device].paths else ()),
                cdi_id(f"{ref.uid}_request_{result.base_request}"),
            ),
            uuid=by_name[result.device].uuid,
        )
        for result in ours
    )
    own = {p for g in by_name.values() if device_name(g.index) in seen for p in g.paths}
    common = tuple(_node(p, target) for p in dict.fromkeys(target.control_devices) if p not in own)
    return Prepared(ref, devices, tuple(cdi_devices), common)
