"""GpuLease objects: the lease and reclaim directives of online jobs, parsed once.

``spec`` is the admin's or the job's: owner, workload to scale, GPUs per replica, desired GPUs
or a daily schedule, the borrowers' grace period. ``status`` is the leasing controller's record
of where it is, so that a restarted controller resumes: phase (Steady, Lending, Reclaiming), the
replicas it is steering to, the devices lent, and an ongoing reclaim's deadline and notices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal

from common.coercion import items, whole
from common.conditions import set_condition
from common.errors import InvalidInput
from common.model import GpuUuid, JobKey
from common.objects import resource_version
from common.tenancy import job_key
from common.timefmt import epoch, microtime
from extender.rightofreturn.rules import ScheduleEntry, parse_schedule_time

Phase = Literal["Steady", "Lending", "Reclaiming"]
PHASES: tuple[Phase, ...] = ("Steady", "Lending", "Reclaiming")
# True while something keeps the lease from its promise (a reclaim past its deadline).
CONDITION_DEGRADED = "Degraded"
# The Degraded reason of a reclaim past its bound (the extender's reclaim_overdue_s after the
# borrowers' notice): from then on the owner's pods take what kube-scheduler offers.
RECLAIM_OVERDUE = "ReclaimOverdue"
DEFAULT_GRACE_S = 45
# The shortest notice a lease may give its borrowers: time to checkpoint (weflex 3.5 gives
# 30-60 s). The chart's crds/gpuleases.yaml holds the same minimum; a test cluster shortens every
# notice with the extender's leasing_test_grace_s setting instead (docs/leasing.md).
MIN_GRACE_S = 30
MAX_GRACE_S = 600
# A resource's plural name: a DNS label (the API server's own rule for a CRD's plural).
_RESOURCE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class Workload:
    """What a lease scales, through its ``scale`` subresource: ``resource`` is the kind's plural
    where it is not the kind in lower case with an "s" (``spec.workload.resource``)."""

    api_version: str
    kind: str
    name: str
    resource: str = ""

    @property
    def plural(self) -> str:
        return self.resource or self.kind.lower() + "s"

    def path(self, namespace: str) -> str:
        """The workload's API path in ``namespace`` (core group for ``v1``)."""
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{base}/namespaces/{namespace}/{self.plural}/{self.name}"


@dataclass(frozen=True, slots=True)
class LeaseSpec:
    owner: JobKey  # the job key (namespace/job) of spec.owner, in the lease's namespace
    workload: Workload
    gpus_per_replica: int
    desired_gpus: int
    schedule: tuple[ScheduleEntry, ...] = ()
    grace_s: int = DEFAULT_GRACE_S


@dataclass(frozen=True, slots=True)
class Notice:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class LentGroup:
    """The devices one released replica lent, named by that replica (its pod's name).

    Where the workload names its replicas (a StatefulSet), they come back when that replica
    does, to it and no other; where the group cannot come back whole, the replica takes another
    group that stays lent, swapping names with it, or standby devices
    (:func:`extender.leasing.decisions.scale_up_groups`). A Deployment's groups come back as a
    set."""

    replica: str
    devices: tuple[GpuUuid, ...]


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    phase: Phase = "Steady"
    target_replicas: int | None = None
    groups: tuple[LentGroup, ...] = ()
    reclaim_started: float | None = None
    reclaim_deadline: float | None = None
    noticed: tuple[Notice, ...] = ()
    reclaiming: tuple[str, ...] = ()  # the lent groups (by replica) this reclaim takes back
    finalizing: bool = False  # the owner's pods are placed; tags are being cleared
    reclaims: int = 0  # completed reclaims
    returned: int = 0  # lent devices that came back, over all reclaims
    backfilled: int = 0  # standby devices given instead, over all reclaims
    last_reclaim_s: float | None = None

    @property
    def lent(self) -> tuple[GpuUuid, ...]:
        """Every lent device."""
        return tuple(chain.from_iterable(g.devices for g in self.groups))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase,
            "lent": [{"replica": g.replica, "devices": list(g.devices)} for g in self.groups],
            "reclaims": self.reclaims,
            "returned": self.returned,
            "backfilled": self.backfilled,
        }
        if self.target_replicas is not None:
            out["targetReplicas"] = self.target_replicas
        if self.last_reclaim_s is not None:
            out["lastReclaimSeconds"] = round(self.last_reclaim_s, 3)
        if self.reclaim_started is not None:
            out["reclaim"] = {
                "startedAt": microtime(self.reclaim_started),
                "deadline": microtime(self.reclaim_deadline or self.reclaim_started),
                "noticed": [
                    {"namespace": n.namespace, "name": n.name, "uid": n.uid} for n in self.noticed
                ],
                "groups": list(self.reclaiming),
                "finalizing": self.finalizing,
            }
        return out


@dataclass(frozen=True, slots=True)
class Trouble:
    """Why a lease is Degraded: a condition's reason (CamelCase) and message."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class GpuLease:
    namespace: str
    name: str
    resource_version: str
    spec: LeaseSpec
    status: LeaseStatus = field(default_factory=LeaseStatus)
    # The reason of the stored Degraded condition while it is True; None otherwise.
    degraded: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _int(
    value: object,
    where: str,
    problems: list[str],
    *,
    default: int | None = None,
    low: int = 0,
    high: int = 1 << 30,
) -> int:
    if value is None and default is not None:
        return default
    if not whole(value) or not low <= value <= high:
        problems.append(f"{where} must be an integer in {low}..{high}")
        return default or 0
    return value


def parse_gpu_lease(obj: Mapping[str, Any]) -> GpuLease:
    """Parse a GpuLease; InvalidInput names every bad field."""
    meta = obj.get("metadata") or {}
    ns, name = meta.get("namespace"), meta.get("name")
    where = f"GpuLease {ns}/{name}"
    if not isinstance(ns, str) or not isinstance(name, str):
        raise InvalidInput("GpuLease without metadata.namespace and name")
    problems: list[str] = []
    spec = obj.get("spec") or {}
    owner = spec.get("owner")
    if not isinstance(owner, str) or not owner:
        problems.append(f"{where}: spec.owner must be a job name")
    wl = spec.get("workload") or {}
    if not all(isinstance(wl.get(k), str) and wl.get(k) for k in ("apiVersion", "kind", "name")):
        problems.append(f"{where}: spec.workload needs apiVersion, kind and name")
    resource = wl.get("resource") or ""
    if not isinstance(resource, str) or (resource and not _RESOURCE.fullmatch(resource)):
        problems.append(f"{where}: spec.workload.resource must be a resource's plural name")
        resource = ""
    per = _int(
        spec.get("gpusPerReplica"), f"{where}: spec.gpusPerReplica", problems, low=1, high=64
    )
    desired = _int(spec.get("desiredGPUs"), f"{where}: spec.desiredGPUs", problems, default=0)
    grace = _int(
        spec.get("graceSeconds"),
        f"{where}: spec.graceSeconds",
        problems,
        default=DEFAULT_GRACE_S,
        low=MIN_GRACE_S,
        high=MAX_GRACE_S,
    )
    schedule: list[ScheduleEntry] = []
    for i, entry in enumerate(spec.get("schedule") or []):
        at = entry.get("at") if isinstance(entry, dict) else None
        try:
            minute = parse_schedule_time(at if isinstance(at, str) else "")
        except ValueError as e:
            problems.append(f"{where}: spec.schedule[{i}].at: {e}")
            continue
        gpus = _int(entry.get("gpus"), f"{where}: spec.schedule[{i}].gpus", problems)
        schedule.append(ScheduleEntry(minute, gpus))
    if problems:
        raise InvalidInput(problems)
    status = obj.get("status") or {}
    reclaim = status.get("reclaim") or {}
    phase = _phase(status)
    target = status.get("targetReplicas")
    noticed = tuple(
        Notice(str(n.get("namespace", "")), str(n.get("name", "")), str(n.get("uid", "")))
        for n in reclaim.get("noticed") or []
        if isinstance(n, dict)
    )
    return GpuLease(
        namespace=ns,
        name=name,
        resource_version=resource_version(obj),
        spec=LeaseSpec(
            owner=job_key(ns, str(owner)),
            workload=Workload(str(wl["apiVersion"]), str(wl["kind"]), str(wl["name"]), resource),
            gpus_per_replica=per,
            desired_gpus=desired,
            schedule=tuple(schedule),
            grace_s=grace,
        ),
        status=LeaseStatus(
            phase=phase,
            target_replicas=target if isinstance(target, int) else None,
            groups=tuple(
                LentGroup(
                    str(g.get("replica", "")),
                    tuple(GpuUuid(str(u)) for u in g.get("devices") or []),
                )
                for g in status.get("lent") or []
                if isinstance(g, dict)
            ),
            reclaim_started=epoch(reclaim.get("startedAt")),
            reclaim_deadline=epoch(reclaim.get("deadline")),
            noticed=noticed,
            reclaiming=tuple(str(g) for g in reclaim.get("groups") or []),
            finalizing=bool(reclaim.get("finalizing", False)),
            reclaims=int(status.get("reclaims") or 0),
            returned=int(status.get("returned") or 0),
            backfilled=int(status.get("backfilled") or 0),
            last_reclaim_s=status.get("lastReclaimSeconds"),
        ),
        degraded=_true_reason(status.get("conditions"), CONDITION_DEGRADED),
    )


def _phase(status: Mapping[str, Any]) -> Phase:
    """The phase a stored status says; Steady where it says none (or no known one)."""
    return next((p for p in PHASES if p == status.get("phase")), "Steady")


@dataclass(frozen=True, slots=True)
class Reclaim:
    """A GpuLease that is reclaiming, as the cluster view needs it: the owner (a job of the
    lease's namespace) taking its lent devices back, and the workload whose pods take them."""

    owner: JobKey
    kind: str
    name: str
    groups: tuple[str, ...] = ()  # the lent groups (by replica) it takes back
    overdue: bool = False  # its stored Degraded condition says RECLAIM_OVERDUE


def reclaim_of(obj: Mapping[str, Any]) -> Reclaim | None:
    """What a GpuLease whose status says Reclaiming takes back, and through which workload's
    pods; None for any other phase (:func:`workload_of` otherwise)."""
    status = obj.get("status")
    if not isinstance(status, Mapping) or _phase(status) != "Reclaiming":
        return None
    return workload_of(obj)


def workload_of(obj: Mapping[str, Any]) -> Reclaim | None:
    """The owner and the workload a GpuLease names, whatever its phase, with the groups its
    reclaim takes back (none outside one). Only the owner, the workload's kind and name and
    those groups are read, as strings, so a lease the controller finds invalid otherwise
    (:func:`parse_gpu_lease`) still reads as it is stored; one without the first three names
    nothing."""
    status, spec = obj.get("status"), obj.get("spec")
    owner = spec.get("owner") if isinstance(spec, Mapping) else None
    workload = spec.get("workload") if isinstance(spec, Mapping) else None
    if not isinstance(workload, Mapping):
        return None
    kind, name = workload.get("kind"), workload.get("name")
    if not (isinstance(owner, str) and isinstance(kind, str) and isinstance(name, str)):
        return None
    namespace = (obj.get("metadata") or {}).get("namespace", "")
    reclaim = status.get("reclaim") if isinstance(status, Mapping) else None
    groups = reclaim.get("groups") if isinstance(reclaim, Mapping) else None
    named = tuple(g for g in items(groups) if isinstance(g, str))
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    overdue = _true_reason(conditions, CONDITION_DEGRADED) == RECLAIM_OVERDUE
    return Reclaim(job_key(str(namespace), owner), kind, name, named, overdue)


def _true_reason(conditions: object, kind: str) -> str | None:
    for c in items(conditions):
        if isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True":
            return str(c.get("reason") or "")
    return None


def lease_conditions(
    status: LeaseStatus,
    previous: object,
    generation: int | None,
    now: float,
    degraded: Trouble | None = None,
) -> list[dict[str, Any]]:
    """The lease's conditions for ``status``: one per phase (``Steady``, ``Lending``,
    ``Reclaiming``), True for the phase it is in, and ``Degraded``, True with ``degraded``'s
    reason and message while something keeps the lease from its promise; each with
    ``observedGeneration`` the spec's generation the controller acted on. ``previous``: the
    conditions as stored (their transition times are kept while their status stays)."""
    lent = len(status.lent)
    if status.phase == "Steady":
        reason, message = "Settled", f"nothing under way; {lent} GPU(s) lent"
    elif status.phase == "Lending":
        reason = "ScalingDown"
        message = f"scaling down to {status.target_replicas} replica(s); {lent} GPU(s) lent"
    else:
        groups = ", ".join(status.reclaiming) or "the lent GPUs"
        deadline = (
            microtime(status.reclaim_deadline) if status.reclaim_deadline is not None else "-"
        )
        reason, message = "TakingBack", f"taking back {groups}; borrowers' notice ends {deadline}"
    conditions = previous if isinstance(previous, list) else None
    for phase in PHASES:
        if phase == status.phase:
            conditions = set_condition(conditions, phase, "True", reason, message, now, generation)
        else:
            conditions = set_condition(
                conditions,
                phase,
                "False",
                status.phase,
                f"the lease is {status.phase}",
                now,
                generation,
            )
    if degraded is not None:
        conditions = set_condition(
            conditions,
            CONDITION_DEGRADED,
            "True",
            degraded.reason,
            degraded.message,
            now,
            generation,
        )
    else:
        conditions = set_condition(
            conditions,
            CONDITION_DEGRADED,
            "False",
            "AsExpected",
            "nothing is overdue",
            now,
            generation,
        )
    return conditions or []
