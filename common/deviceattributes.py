"""The attributes of tidelease's devices in Dynamic Resource Allocation (``resource.k8s.io/v1``),
shared by both sides: a node's GpuNode as a ResourceSlice that publishes them, and the
DeviceClasses pods ask for, which select by them. Pure.

The node agent mirrors its node's ``GpuNode`` into one ResourceSlice (driver
``gpu.tidelease.io``, pool = the node, one slice in the pool) with :func:`resource_slice`; the
unmodified kube-scheduler's DynamicResources plugin then allocates devices to ResourceClaims by
the CEL selectors of the DeviceClasses of :func:`device_classes`. Device taints are alpha (off)
in Kubernetes 1.35, so right of return is carried by attributes and CEL instead:

* every device publishes, under the domain ``tidelease.io``: ``type``, ``tier`` (HA, MA, LA),
  ``tierRank`` (3, 2, 1: CEL compares numbers), ``uuid``, ``index``, ``lentBy`` (the job that
  lent it, "" when none), ``replica`` (the replica that lent it, "" when none), ``standby`` and
  ``reclaiming`` (its owner is taking it back: ``spec.devices[].reclaiming`` of the GpuNode,
  which the leasing controller sets in DRA mode);
* where the node's topology (``status.topology``, :mod:`common.topology`) knows them, Kubernetes'
  standard attributes (domain ``resource.kubernetes.io``, the upstream names, so that a claim's
  ``matchAttribute`` lines tidelease's GPUs up with other drivers' devices, a NIC's say):
  ``numaNode`` (an int) and ``pcieRoot`` (``pci<domain>:<bus>``; a root tidelease derived from
  NVML alone, in no upstream form, is not published);
* a device whose health is not ``Healthy`` is withdrawn from the slice: no claim can be
  allocated one (the extender likewise offers only healthy devices);
* ``tidelease-ha``, ``-ma``, ``-la`` select devices of at least that tier that no job lent and
  that are not standby (an online job's pods); ``tidelease-borrow`` selects any tier, lent or
  not, not standby, not being reclaimed (borrowers: a borrower that replaces one the reclaim
  evicted must not take the device back from under it). Standby devices are the leasing
  controller's, for reclaims; no class selects them.

Devices are allocated whole: the slice publishes no capacity.

The chart's DeviceClasses are generated from here, never written by hand:

    python -m common.deviceattributes > manifests/charts/tidelease/templates/dra-deviceclasses.yaml

and a test fails while the chart's copy differs from what this module writes.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from common import contract
from common.coercion import whole
from common.model import Device, Tier
from common.objects import parse_gpu_node
from common.topology import Placement, is_upstream_pcie_root

DRIVER: Final = "gpu.tidelease.io"
DOMAIN: Final = contract.PREFIX  # the attributes' domain: "tidelease.io/<name>"
API_VERSION: Final = "resource.k8s.io/v1"
KIND_SLICE: Final = "ResourceSlice"
KIND_CLASS: Final = "DeviceClass"
PLURAL_SLICES: Final = "resourceslices"
SLICES_PATH: Final = f"/apis/{API_VERSION}/{PLURAL_SLICES}"
SLICE_PREFIX: Final = "tidelease-"
DEVICE_PREFIX: Final = "gpu-"
# On every slice: who manages it.
SLICE_LABELS: Final = {"app.kubernetes.io/managed-by": "tidelease-agent"}

# Attribute identifiers (C identifiers of at most 32 characters), qualified in the slice.
ATTR_TYPE: Final = "type"
ATTR_TIER: Final = "tier"
ATTR_TIER_RANK: Final = "tierRank"
ATTR_UUID: Final = "uuid"
ATTR_INDEX: Final = "index"
ATTR_LENT_BY: Final = "lentBy"
ATTR_REPLICA: Final = "replica"
ATTR_STANDBY: Final = "standby"
ATTR_RECLAIMING: Final = "reclaiming"
ATTRIBUTES: Final = (
    ATTR_TYPE,
    ATTR_TIER,
    ATTR_TIER_RANK,
    ATTR_UUID,
    ATTR_INDEX,
    ATTR_LENT_BY,
    ATTR_REPLICA,
    ATTR_STANDBY,
    ATTR_RECLAIMING,
)

# Kubernetes' standard device attributes (upstream names: the page "Standard Device Attributes
# for Dynamic Resource Allocation" and k8s.io/dynamic-resource-allocation/deviceattribute), fully
# qualified: their domain is resource.kubernetes.io, not tidelease's.
STANDARD_DOMAIN: Final = "resource.kubernetes.io"
ATTR_NUMA_NODE: Final = f"{STANDARD_DOMAIN}/numaNode"
ATTR_PCIE_ROOT: Final = f"{STANDARD_DOMAIN}/pcieRoot"

# The API server's limits (k8s.io/api resource/v1).
MAX_NAME: Final = 253  # a slice's name: a DNS subdomain
MAX_DEVICES: Final = 128  # devices in one slice (ResourceSliceMaxDevices)
MAX_STRING: Final = 64  # a string attribute's value (DeviceAttributeMaxValueLength)
_DIGEST_HEX: Final = 8

CLASS_HA: Final = "tidelease-ha"
CLASS_MA: Final = "tidelease-ma"
CLASS_LA: Final = "tidelease-la"
CLASS_BORROW: Final = "tidelease-borrow"


def qualified(attribute: str) -> str:
    """An attribute's name in a slice: ``tidelease.io/<attribute>``."""
    return f"{DOMAIN}/{attribute}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_HEX]


def slice_name(node: str) -> str:
    """``tidelease-<node>``; for a node name too long for that, its first characters, ``-`` and
    8 hex digits of the node name's SHA-256 (still a DNS subdomain, still one per node)."""
    name = SLICE_PREFIX + node
    if len(name) <= MAX_NAME:
        return name
    keep = MAX_NAME - len(SLICE_PREFIX) - 1 - _DIGEST_HEX
    # A label may not end with "-" or "."; what follows the cut is "-<hex>".
    head = node[:keep].rstrip("-.")
    return f"{SLICE_PREFIX}{head}-{_digest(node)}"


def attribute_string(value: str) -> str:
    """A string attribute's published value: ``value``, or for one over 64 characters (job and
    replica names may have 253) its first 55 characters, ``-`` and 8 hex digits of its SHA-256.
    A selector comparing ``lentBy`` or ``replica`` with a name must compare with this form."""
    if len(value) <= MAX_STRING:
        return value
    return f"{value[: MAX_STRING - 1 - _DIGEST_HEX]}-{_digest(value)}"


def _string(value: str) -> dict[str, Any]:
    return {"string": attribute_string(value)}


def standard_attributes(placement: Placement | None) -> dict[str, Any]:
    """Kubernetes' standard attributes of a device placed so (none when unknown)."""
    found: dict[str, Any] = {}
    if placement is not None and placement.numa_node is not None:
        found[ATTR_NUMA_NODE] = {"int": placement.numa_node}
    root = placement.pcie_root if placement is not None else None
    if root is not None and is_upstream_pcie_root(root):
        found[ATTR_PCIE_ROOT] = {"string": root}
    return found


def device_entry(
    device: Device, reclaiming: bool = False, placement: Placement | None = None
) -> dict[str, Any]:
    """One device of the slice, as the API server stores it (no capacity: allocated whole)."""
    cls = device.cls
    attributes = {
        ATTR_TYPE: _string(cls.gpu_type),
        ATTR_TIER: _string(cls.tier.name),
        ATTR_TIER_RANK: {"int": int(cls.tier)},
        ATTR_UUID: _string(device.uuid),
        ATTR_INDEX: {"int": device.index},
        ATTR_LENT_BY: _string(cls.owner or ""),
        ATTR_REPLICA: _string(cls.replica or ""),
        ATTR_STANDBY: {"bool": cls.standby},
        ATTR_RECLAIMING: {"bool": reclaiming and cls.owner is not None},
    }
    return {
        "name": f"{DEVICE_PREFIX}{device.index}",
        "attributes": {
            **{qualified(k): v for k, v in attributes.items()},
            **standard_attributes(placement),
        },
    }


def published(devices: Sequence[Device]) -> list[Device]:
    """The devices a slice offers, by index: the healthy ones, without any whose index another
    device claims too (their names would clash: neither is trusted), at most 128."""
    count: dict[int, int] = {}
    for d in devices:
        count[d.index] = count.get(d.index, 0) + 1
    kept = sorted((d for d in devices if d.cls.healthy and count[d.index] == 1), key=_by_index)
    return kept[:MAX_DEVICES]


def _by_index(device: Device) -> int:
    return device.index


def slice_devices(gpunode: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The slice's devices for a ``GpuNode`` object (status.devices with the tags of
    spec.devices); raises :class:`common.errors.InvalidInput` for one that does not parse."""
    back = reclaiming(gpunode)
    inventory = parse_gpu_node(gpunode)
    topology = inventory.topology
    return [
        device_entry(d, d.uuid in back, topology.placement(d.index) if topology else None)
        for d in published(inventory.devices)
    ]


def reclaiming(gpunode: Mapping[str, Any]) -> frozenset[str]:
    """The UUIDs ``spec.devices`` marks ``reclaiming: true`` (set by the leasing controller in
    DRA mode while the owner takes them back)."""
    spec = gpunode.get("spec")
    entries = spec.get("devices") if isinstance(spec, Mapping) else None
    return frozenset(
        str(e["uuid"])
        for e in entries or []
        if isinstance(e, Mapping) and e.get(ATTR_RECLAIMING) is True and e.get("uuid")
    )


def slice_spec(node: str, devices: Sequence[Mapping[str, Any]], generation: int) -> dict[str, Any]:
    """A slice's spec, as the API server returns it (an empty device list is left out)."""
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "nodeName": node,
    }
    if devices:
        spec["devices"] = [dict(d) for d in devices]
    return spec


def owner_reference(node: str, node_uid: str) -> dict[str, Any]:
    """The slice belongs to its Node: deleting the Node deletes it (garbage collection)."""
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}


def slice_object(node: str, node_uid: str | None, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The ResourceSlice of ``node`` with ``spec``; owned by the Node when its UID is known."""
    metadata: dict[str, Any] = {"name": slice_name(node), "labels": dict(SLICE_LABELS)}
    if node_uid:
        metadata["ownerReferences"] = [owner_reference(node, node_uid)]
    return {"apiVersion": API_VERSION, "kind": KIND_SLICE, "metadata": metadata, "spec": dict(spec)}


def resource_slice(
    node: str, node_uid: str | None, gpunode: Mapping[str, Any], generation: int
) -> dict[str, Any]:
    """The ResourceSlice of ``node`` mirroring its ``GpuNode`` at pool ``generation`` (see
    :func:`next_generation`); owned by the Node when its UID is known."""
    return slice_object(node, node_uid, slice_spec(node, slice_devices(gpunode), generation))


def stored_devices(stored: Mapping[str, Any] | None) -> list[Any]:
    """The device list of a stored slice (none when it is absent)."""
    spec = (stored or {}).get("spec")
    devices = spec.get("devices") if isinstance(spec, dict) else None
    return list(devices) if isinstance(devices, list) else []


def stored_generation(stored: Mapping[str, Any] | None) -> int:
    spec = (stored or {}).get("spec")
    pool = spec.get("pool") if isinstance(spec, dict) else None
    generation = pool.get("generation") if isinstance(pool, dict) else None
    return generation if whole(generation) else 0


def next_generation(
    stored: Mapping[str, Any] | None, devices: Sequence[Mapping[str, Any]], floor: int = 0
) -> int:
    """The pool generation for publishing ``devices`` over the ``stored`` slice: the stored one
    while the devices are the same, one more when they change (consumers use only the highest
    generation of a pool). Without a stored slice: one more than ``floor`` (the last generation
    this publisher wrote, so a re-created slice does not go back)."""
    if stored is None:
        return floor + 1
    current = stored_generation(stored)
    if stored_devices(stored) == list(devices):
        return current
    return max(current, floor) + 1


# --- DeviceClasses ---


@dataclass(frozen=True, slots=True)
class ClassRule:
    """What one DeviceClass selects among tidelease's devices (never a standby one)."""

    name: str
    min_tier: Tier  # tierRank at least this
    lent_too: bool  # also devices some job lent (borrowers); otherwise only unlent ones
    meaning: str


CLASSES: Final = (
    ClassRule(CLASS_HA, Tier.HA, False, "an online job's pods: HA devices no job lent"),
    ClassRule(CLASS_MA, Tier.MA, False, "an online job's pods: MA or HA devices no job lent"),
    ClassRule(CLASS_LA, Tier.LA, False, "an online job's pods: any tier, devices no job lent"),
    ClassRule(CLASS_BORROW, Tier.LA, True, "borrowers: any tier, lent or not, not reclaimed"),
)


def _cel_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def selector(rule: ClassRule) -> str:
    """The class's CEL: the driver, then its attributes under one binding. A device lacking an
    attribute is not selected (rather than aborting the allocation: an agent of another version
    may publish fewer)."""

    def has(attribute: str) -> str:
        return f"has(t.{attribute})"

    terms = [has(ATTR_TIER_RANK), f"t.{ATTR_TIER_RANK} >= {int(rule.min_tier)}"]
    if not rule.lent_too:
        terms += [has(ATTR_LENT_BY), f't.{ATTR_LENT_BY} == ""']
    else:  # a slice without the attribute (an older agent) keeps its lent devices borrowable
        terms += [f"(!{has(ATTR_RECLAIMING)} || !t.{ATTR_RECLAIMING})"]
    terms += [has(ATTR_STANDBY), f"!t.{ATTR_STANDBY}"]
    return (
        f"device.driver == {_cel_string(DRIVER)} && "
        f"cel.bind(t, device.attributes[{_cel_string(DOMAIN)}], {' && '.join(terms)})"
    )


def class_spec(rule: ClassRule) -> dict[str, Any]:
    return {"selectors": [{"cel": {"expression": selector(rule)}}]}


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses, as applied to a cluster (cluster-scoped)."""
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND_CLASS,
            "metadata": {"name": rule.name},
            "spec": class_spec(rule),
        }
        for rule in CLASSES
    ]


def _block(obj: dict[str, Any], indent: int) -> str:
    text = yaml.safe_dump(obj, sort_keys=False, width=1_000_000, allow_unicode=False)
    pad = " " * indent
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def chart_template() -> str:
    """The chart's template of the DeviceClasses (``dra.enabled``, off by default)."""
    labels = '{{- include "tidelease.labels" (dict "ctx" $ "component" "dra") | nindent 4 }}'
    parts = []
    for rule in CLASSES:
        if "{{" in selector(rule):
            raise AssertionError("the generated CEL would be read as a Helm template")
        parts.append(
            f"# {rule.meaning}\n"
            f"apiVersion: {API_VERSION}\n"
            f"kind: {KIND_CLASS}\n"
            "metadata:\n"
            f"  name: {rule.name}\n"
            f"  labels: {labels}\n"
            "spec:\n" + _block(class_spec(rule), 2)
        )
    return (
        "{{- /* Generated by `python -m common.deviceattributes` from "
        "common/deviceattributes.py: do not edit. */}}\n"
        # Off unless set: also for `helm upgrade --reuse-values` from a release before this value.
        '{{- if dig "enabled" false (.Values.dra | default dict) }}\n'
        "# DeviceClasses of the devices the node agents publish as ResourceSlices (driver "
        f"{DRIVER}).\n" + "---\n".join(parts) + "{{- end }}\n"
    )


if __name__ == "__main__":
    sys.stdout.write(chart_template())
