"""The readiness of a job's pods, by role: what the evaluation reads. Pure.

A pod belongs to a job by the label ``tidelease.io/job`` and plays the role named by the label
``tidelease.io/role``. It counts as ready when it runs, is not being deleted and its ``Ready``
condition is true (readiness probes and readiness gates included, as for a Service).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from common import contract

LABEL_JOB: Final = contract.LABEL_JOB
LABEL_ROLE: Final = contract.LABEL_ROLE


def natural_key(name: str) -> tuple[str, int, str]:
    """worker-2 before worker-10: the trailing number compared as a number."""
    m = re.match(r"^(.*?)(\d+)$", name)
    if m is None:
        return (name, -1, name)
    return (m.group(1), int(m.group(2)), name)


@dataclass(frozen=True)
class PodState:
    name: str
    uid: str
    role: str
    ready: bool
    address: str  # hostname.subdomain when the pod has both, else its IP
    slots: int  # its GPUs (at least 1): the slots discover_hosts announces


def _gpus(spec: Mapping[str, Any]) -> int:
    total = 0
    for c in spec.get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        try:
            total += int(str(limits.get(contract.DEFAULT_GPU_RESOURCE, 0)))
        except ValueError:
            continue
    return total


def pod_state(raw: Mapping[str, Any]) -> PodState | None:
    """The pod's state, or None when it carries no role (it takes no part in orchestration)."""
    meta = raw.get("metadata") or {}
    role = str((meta.get("labels") or {}).get(LABEL_ROLE) or "")
    if not role:
        return None
    spec, status = raw.get("spec") or {}, raw.get("status") or {}
    ready_condition = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    ip = str(status.get("podIP") or "")
    ready = (
        ready_condition
        and status.get("phase") == "Running"
        and not meta.get("deletionTimestamp")
        and bool(ip)
    )
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    address = f"{hostname}.{subdomain}" if hostname and subdomain else ip
    return PodState(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        role=role,
        ready=ready,
        address=address,
        slots=max(1, _gpus(spec)),
    )


def job_of(raw: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, job) the pod belongs to, from its labels."""
    meta = raw.get("metadata") or {}
    job = (meta.get("labels") or {}).get(LABEL_JOB)
    if not job:
        return None
    return (str(meta.get("namespace", "")), str(job))


class Snapshot:
    """The pods of one job, by role, kept current one pod at a time (O(1) per change, the
    sorted lists of ready pods rebuilt only when read after a change of their role)."""

    def __init__(self, pods: Iterable[PodState] = ()) -> None:
        self._pods: dict[str, PodState] = {}
        self._roles: dict[str, dict[str, PodState]] = {}
        self._ready: dict[str, int] = {}
        self._sorted: dict[str, tuple[PodState, ...]] = {}
        for p in pods:
            self.apply(p)

    def apply(self, pod: PodState) -> bool:
        """Record the pod's new state; whether anything the evaluation reads changed."""
        old = self._pods.get(pod.name)
        if old == pod:
            return False
        if old is not None:
            self._drop(old)
        self._pods[pod.name] = pod
        self._roles.setdefault(pod.role, {})[pod.name] = pod
        if pod.ready:
            self._ready[pod.role] = self._ready.get(pod.role, 0) + 1
        self._sorted.pop(pod.role, None)
        return True

    def remove(self, name: str) -> bool:
        old = self._pods.pop(name, None)
        if old is None:
            return False
        self._drop(old)
        return True

    def _drop(self, old: PodState) -> None:
        self._roles.get(old.role, {}).pop(old.name, None)
        if old.ready:
            self._ready[old.role] -= 1
        self._sorted.pop(old.role, None)

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, name: str) -> PodState | None:
        return self._pods.get(name)

    def ready_count(self, role: str) -> int:
        return self._ready.get(role, 0)

    def pod_count(self, role: str) -> int:
        return len(self._roles.get(role, {}))

    def ready(self, role: str) -> tuple[PodState, ...]:
        """The ready pods of ``role``, by name (ordinals in numeric order)."""
        cached = self._sorted.get(role)
        if cached is None:
            pods = [p for p in self._roles.get(role, {}).values() if p.ready]
            cached = tuple(sorted(pods, key=lambda p: natural_key(p.name)))
            self._sorted[role] = cached
        return cached

    def pods(self) -> tuple[PodState, ...]:
        return tuple(self._pods.values())
