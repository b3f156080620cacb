"""Kueue's Workload objects as tidelease's admission check reads them, and what the check says of
each. Pure.

A Workload (``kueue.x-k8s.io``, :data:`API_VERSION`: the one place the version is named) has pod
sets (``spec.podSets[]``: a name, a count and a pod template), Kueue's conditions
(``QuotaReserved``, ``Admitted``, ``Evicted``, ``Finished``) and the state of each admission
check on it (``status.admissionChecks[]``: name, state ``Pending``/``Ready``/``Retry``/
``Rejected``, message). tidelease's check, for the ClusterQueue of borrowed GPUs, is judged by
:func:`judge`: a workload whose quota Kueue has reserved is Ready once the lent GPUs can hold
all its pods (:mod:`extender.kueue.capacity`), Pending until then; one evicted or finished is
left alone (Kueue resets the checks itself: writing Retry to an evicted workload can deadlock
its requeue, KEP-3258).

Each pod set's template is read as a pod of the workload's namespace by the extender's own
parser (:func:`common.podrequest.parse_pod`), so GPUs, type and tier mean here what they mean
at placement: a borrower's annotations, its ``nvidia.com/gpu`` limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from common import contract
from common.errors import InvalidInput
from common.podrequest import parse_pod
from extender.kueue.capacity import Capacity, PodSetNeed, Verdict, fit

GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"
PLURAL = "workloads"
CheckState = Literal["Pending", "Ready", "Retry", "Rejected"]
STATES: frozenset[str] = frozenset({"Pending", "Ready", "Retry", "Rejected"})


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str
    uid: str
    needs: tuple[PodSetNeed, ...]
    quota_reserved: bool
    admitted: bool
    evicted: bool
    finished: bool
    checks: Mapping[str, CheckState]  # admission check name -> its state on this workload

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _map(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _true(conditions: object, kind: str) -> bool:
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, dict) and c.get("type") == kind:
            return c.get("status") == "True"
    return False


def parse_workload(
    obj: Mapping[str, Any], *, resource: str = contract.DEFAULT_GPU_RESOURCE
) -> Workload:
    """The Workload's pod sets and states; :class:`InvalidInput` naming every problem."""
    meta, spec, status = (_map(obj.get(k)) for k in ("metadata", "spec", "status"))
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    problems: list[str] = []
    if not namespace or not name:
        problems.append("Workload.metadata.namespace and name are required")
    needs: list[PodSetNeed] = []
    pod_sets = spec.get("podSets")
    if not isinstance(pod_sets, list) or not pod_sets:
        problems.append("Workload.spec.podSets must be a non-empty list")
        pod_sets = []
    for i, ps in enumerate(pod_sets):
        where = f"spec.podSets[{i}]"
        if not isinstance(ps, dict):
            problems.append(f"{where} must be an object")
            continue
        set_name, count, template = ps.get("name") or "main", ps.get("count"), ps.get("template")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            problems.append(f"{where}.count must be a whole number >= 0, got {count!r}")
            continue
        if not isinstance(template, dict):
            problems.append(f"{where}.template must be a pod template")
            continue
        pod = {
            "metadata": {
                **(template.get("metadata") or {}),
                "namespace": namespace or "default",
                "name": f"{name}-{set_name}",
                "uid": f"{meta.get('uid') or name}/{set_name}",
            },
            "spec": template.get("spec") or {},
        }
        try:
            request = parse_pod(pod, resource=resource)
        except InvalidInput as e:
            problems += [f"{where}.template: {p}" for p in e.problems]
            continue
        needs.append(PodSetNeed(str(set_name), count, request))
    checks: dict[str, CheckState] = {}
    for c in status.get("admissionChecks") or []:
        if isinstance(c, dict) and isinstance(c.get("name"), str) and c.get("state") in STATES:
            checks[c["name"]] = c["state"]
    if problems:
        raise InvalidInput([f"Workload {namespace}/{name}: {p}" for p in problems])
    conditions = status.get("conditions")
    return Workload(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        needs=tuple(needs),
        quota_reserved=_true(conditions, "QuotaReserved"),
        admitted=_true(conditions, "Admitted"),
        evicted=_true(conditions, "Evicted"),
        finished=_true(conditions, "Finished"),
        checks=checks,
    )


@dataclass(frozen=True, slots=True)
class Judgement:
    """What tidelease's check says of one workload now: a state to write (None: leave the
    check as it is) and the capacity verdict behind it."""

    state: CheckState | None
    message: str
    verdict: Verdict | None = None


def judge(workload: Workload, check: str, capacity: Capacity) -> Judgement:
    """tidelease's check ``check`` on ``workload``, given the lent capacity left for it (lent
    and not kept for workloads judged Ready before it)."""
    mine = workload.checks.get(check)
    if mine is None:
        return Judgement(None, f"the workload does not carry the check {check}")
    if workload.finished or workload.evicted:
        return Judgement(None, "finished or evicted: Kueue resets the checks")
    if not workload.quota_reserved:
        return Judgement(None, "no quota reserved yet: Kueue has not chosen it")
    if mine in ("Ready", "Rejected", "Retry"):
        return Judgement(None, f"already {mine}")
    verdict = fit(workload.key, workload.needs, capacity)
    if verdict.fits:
        return Judgement("Ready", f"tidelease: {verdict.reason}", verdict)
    return Judgement("Pending", f"tidelease: waiting for lent GPUs: {verdict.reason}", verdict)
