"""Proof that the shared queues released a pod: what the extender checks before it places a pod
that declares its job class. Pure.

A class-declaring GPU pod waits at the scheduling gate ``tidelease.io/queue`` until the queues
controller removes it, in the queues' order (docs/planner.md, "Shared queues live"). A tenant
can remove the gate itself, or never set it where the chart's gate policy is off, and can write
``tidelease.io/queue`` too: neither the gate's absence nor an annotation says who released the
pod. So the queues controller writes, in the patch that removes the gate, a *proof*: an
HMAC-SHA256 of the pod's UID under a key only tidelease's pods read (a Secret of the chart),
in the annotation ``tidelease.io/queue-released``. The proof names the pod's UID, so it cannot
be copied to another pod, nor to a pod re-created under the same name.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final

from common import contract

# What the HMAC covers besides the UID: a key used for anything else one day signs nothing here.
DOMAIN: Final = b"tidelease.io/queue-released/v1\x00"


def release_proof(key: bytes, pod_uid: str) -> str:
    """The proof that the queues released the pod of UID ``pod_uid``: base64url, unpadded."""
    if not key:
        raise ValueError("a release proof needs a key")
    digest = hmac.new(key, DOMAIN + pod_uid.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def release_problem(pod: Mapping[str, Any], key: bytes | None) -> str | None:
    """Why ``pod`` may not be placed yet, for its author; None when it may: it does not declare
    ``tidelease.io/job-class`` (not the queues'), the queues are off (``key`` None), or it
    carries a valid proof for its own ``metadata.uid``. An empty ``key`` (configured but
    unreadable) refuses every pod of the queues: never placed past them."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping) or contract.ANN_JOB_CLASS not in annotations:
        return None
    if key is None:
        return None
    waiting = (
        f"waiting for the shared queues to release it ({contract.ANN_JOB_CLASS} pods are "
        "placed in queue order"
    )
    if not key:
        return f"{waiting}; the queues' release key is unreadable here, ask the cluster admin)"
    uid = meta.get("uid")
    presented = annotations.get(contract.ANN_QUEUE_RELEASED)
    if isinstance(uid, str) and uid and isinstance(presented, str):
        expected = release_proof(key, uid)
        if hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode()):
            return None
    if presented is not None:
        return (
            f"{waiting}; its {contract.ANN_QUEUE_RELEASED} annotation is not the queues "
            "controller's: only the queues release a pod)"
        )
    return (
        f"{waiting}; its gate {contract.SCHEDULING_GATE} was removed or never set, not "
        "released by the queues controller)"
    )
