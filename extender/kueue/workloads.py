"""Kueue's Workload objects as tidelease's admission check reads them. Pure.

A Workload (``kueue.x-k8s.io``, :data:`API_VERSION`: the one place the version is named) has pod
sets (``spec.podSets[]``: a name, a count and a pod template), Kueue's conditions
(``QuotaReserved``, ``Admitted``, ``Evicted``, ``Finished``) and the state of each admission
check on it (``status.admissionChecks[]``: name, state ``Pending``/``Ready``/``Retry``/
``Rejected``, message). What tidelease's check says of each is decided in
:mod:`extender.kueue.admission`.

Each pod set's template is read as a pod of the workload's namespace by the extender's own
parser (:func:`common.podrequest.parse_pod`), so GPUs, type and tier mean here what they mean
at placement: a borrower's annotations, its ``nvidia.com/gpu`` limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from common import contract
from common.errors import InvalidInput
from common.keptmarks import kept_key
from common.podrequest import parse_pod
from common.timefmt import epoch
from extender.kueue.capacity import PodSetNeed

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
    messages: Mapping[str, str] = field(default_factory=dict)  # check name -> its message
    owner_uid: str = ""  # its controlling owner's UID (the Job): what its pods are owned by
    owner_ref: tuple[str, str] = ("", "")  # and that owner's (kind, name)
    created: float = 0.0  # metadata.creationTimestamp, epoch seconds: the order of judging
    # Pod sets whose template already carries tidelease.io/lent-only (Kueue refuses a
    # podSetUpdate of a key the template has).
    lent_only_set: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def owner(self) -> str:
        """``namespace/UID`` of its controlling owner: a pod is the workload's when it is in
        the same namespace with that controller (an owner reference names no namespace, and a
        pod of another namespace may name any UID)."""
        return f"{self.namespace}/{self.owner_uid}"

    @property
    def kept_key(self) -> str | None:
        """Whose pods the lent GPUs kept for it are (common/keptmarks.py): its controlling
        owner's, by kind and name in its namespace; None without one."""
        kind, name = self.owner_ref
        return kept_key(self.namespace, kind, name) if kind and name else None


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
    lent_only_set: set[str] = set()
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
        if contract.ANN_LENT_ONLY in (pod["metadata"].get("annotations") or {}):
            lent_only_set.add(str(set_name))
    checks: dict[str, CheckState] = {}
    messages: dict[str, str] = {}
    for c in status.get("admissionChecks") or []:
        if isinstance(c, dict) and isinstance(c.get("name"), str) and c.get("state") in STATES:
            checks[c["name"]] = c["state"]
            messages[c["name"]] = str(c.get("message") or "")
    if problems:
        raise InvalidInput([f"Workload {namespace}/{name}: {p}" for p in problems])
    conditions = status.get("conditions")
    owner_uid, owner_ref = "", ("", "")
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            owner_uid = str(ref.get("uid") or "")
            owner_ref = (str(ref.get("kind") or ""), str(ref.get("name") or ""))
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
        messages=messages,
        owner_uid=owner_uid,
        owner_ref=owner_ref,
        created=epoch(meta.get("creationTimestamp")) or 0.0,
        lent_only_set=frozenset(lent_only_set),
    )
