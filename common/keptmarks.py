"""Lent GPUs kept for a Kueue workload until its pods are placed: the mark on a GpuNode. Pure.

tidelease's Kueue admission check (extender/kueue) lets a workload through only once lent GPUs
can hold all its pods, and keeps those GPUs for it from then until its pods are placed: the
check's controller writes, on each GpuNode concerned, the annotation
:data:`common.contract.ANN_KEPT_FOR_KUEUE`, which names each kept device and the workload's
owner (:func:`kept_key`: its namespace and controlling object, e.g. ``team-a/Job/finetune``),
with a time the mark lapses unless renewed. The extender reads it: a borrower that is not one of
that owner's pods does not get a kept device (placement, binding); the owner's own pods, online
pods and replicas taking their devices back do (the right of return comes first: a reclaim
takes kept GPUs as it takes lent ones, and the check then sends the workload back).

The value is JSON: ``{"until": "<RFC 3339>", "devices": {"<UUID>": "<owner key>", ...}}``.
A mark that cannot be read keeps nothing (said in the log by its reader): a broken mark must
not take devices away from everyone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.model import GpuUuid, PodRequest, Priority
from common.timefmt import epoch, rfc3339

MAX_DEVICES = 4096  # a node has far fewer; past this the mark is refused whole


def kept_key(namespace: str, kind: str, name: str) -> str:
    """The owner a kept device is kept for: ``namespace/Kind/name`` of its pods' controller
    (an owner reference names no namespace: the namespace is the pod's own)."""
    return f"{namespace}/{kind}/{name}"


def key_of(req: PodRequest) -> str | None:
    """The owner key of a pod (None for a pod no controller owns)."""
    if req.controller is None:
        return None
    return kept_key(req.namespace, *req.controller)


@dataclass(frozen=True, slots=True)
class KeptMark:
    """The devices of one node kept for Kueue workloads, until ``until`` (epoch seconds)."""

    devices: Mapping[GpuUuid, str] = field(default_factory=dict)  # UUID -> owner key
    until: float = 0.0

    def live(self, now: float) -> bool:
        return bool(self.devices) and now < self.until

    def barred(self, req: PodRequest, now: float) -> frozenset[GpuUuid]:
        """The kept devices ``req`` may not take: none once the mark lapsed, none for an online
        pod or a replica taking devices back, else those kept for another owner."""
        if not self.live(now) or req.reclaim or req.priority is Priority.HIGH:
            return frozenset()
        mine = key_of(req)
        return frozenset(u for u, owner in self.devices.items() if owner != mine)


NO_MARK = KeptMark()


def encode(devices: Mapping[GpuUuid, str], until: float) -> str:
    return json.dumps(
        {"until": rfc3339(until), "devices": dict(sorted(devices.items()))},
        separators=(",", ":"),
    )


def decode(value: str | None) -> KeptMark:
    """The mark of an annotation's value; :class:`ValueError` naming what is wrong."""
    if not value:
        return NO_MARK
    try:
        raw = json.loads(value)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError("want an object with until and devices")
    until = epoch(raw.get("until"))
    if until is None:
        raise ValueError(f"until must be an RFC 3339 time, got {raw.get('until')!r}")
    devices = raw.get("devices")
    if not isinstance(devices, dict) or len(devices) > MAX_DEVICES:
        raise ValueError(f"devices must be an object of at most {MAX_DEVICES} UUIDs")
    out: dict[GpuUuid, str] = {}
    for uuid, owner in devices.items():
        if not isinstance(owner, str) or owner.count("/") != 2 or not uuid:
            raise ValueError(f"device {uuid!r}: want an owner namespace/Kind/name, got {owner!r}")
        out[GpuUuid(uuid)] = owner
    return KeptMark(out, until)
