"""Who may do what among tenants: owners are (namespace, job), privileges come from the admin. Pure.

tidelease lends one tenant's GPUs to others, so nothing a pod author writes may grant a
privilege. The model (docs/tenancy.md):

* **An owner is a job in a namespace.** Its identity is the *job key* ``namespace/job``: device
  tags, ledger entries, reclaim marks, Events and ``kubectl tidelease`` carry it, so a pod is
  "own" only to devices its namespace's job lent. A GpuLease (namespaced) is the one source of an
  owner's identity: its ``spec.owner`` names the job in the lease's namespace.
* **Online jobs run only where the admin says.** A namespace the admin labels
  ``tidelease.io/online: "true"`` (a label tenants with the ``edit`` role cannot set: namespaces
  are cluster-scoped) may run pods with ``tidelease.io/priority: high`` or the online
  PriorityClass, and GpuLeases. Elsewhere those are refused, at admission (the chart's policies)
  and by the extender and the controllers alike.
* **A reclaim is derived, never declared**: a pod takes lent devices back (and may use standby
  devices) only while its namespace's GpuLease for its owner reclaims and the pod belongs to the
  lease's workload (its owner references).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from common import contract
from common.model import JobKey

# The Namespace label by which an admin grants online jobs (value "true").
LABEL_ONLINE: Final = f"{contract.PREFIX}/online"
ONLINE_VALUE: Final = "true"
# The chart's PriorityClass of online pods (values: priorityClasses.online.name).
DEFAULT_ONLINE_PRIORITY_CLASS: Final = "tidelease-online"
SEPARATOR: Final = "/"


def job_key(namespace: str, job: str) -> JobKey:
    """The identity of job ``job`` of ``namespace``: ``namespace/job``."""
    return JobKey(f"{namespace}{SEPARATOR}{job}")


def split_job_key(key: str) -> tuple[str, str] | None:
    """``(namespace, job)`` of a job key; None for a name without a namespace (a tag written
    before owners were namespaced)."""
    namespace, sep, job = key.partition(SEPARATOR)
    if not sep or not namespace or not job:
        return None
    return namespace, job


def is_job_key(value: str) -> bool:
    return split_job_key(value) is not None


def granted(labels: object) -> bool:
    """Whether a Namespace with these labels may run online jobs."""
    return isinstance(labels, dict) and labels.get(LABEL_ONLINE) == ONLINE_VALUE


def online_refusal(namespace: str, what: str) -> str:
    """Why ``what`` (e.g. ``tidelease.io/priority: high``) is refused in ``namespace``: the one
    message the extender, the controllers and the admission policies give."""
    return (
        f"{what} is for online jobs, and namespace {namespace} may not run them: "
        f'a cluster admin grants it with the namespace label {LABEL_ONLINE}="{ONLINE_VALUE}"'
    )


def pod_owner(pod: Mapping[str, Any]) -> JobKey | None:
    """The job key of a raw pod: its ``tidelease.io/owner`` in the pod's own namespace."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    owner = annotations.get(contract.ANN_OWNER) if isinstance(annotations, dict) else None
    if not isinstance(owner, str) or not owner:
        return None
    return job_key(str(meta.get("namespace", "")), owner)


# A ReplicaSet a Deployment made: the Deployment's name, "-", the pod template's hash.
_TEMPLATE_HASH = re.compile(r"[a-z0-9]{1,10}")
# A LeaderWorkerSet's group index (and worker index) in its pods' and StatefulSets' names: a
# StatefulSet it made for one group's workers is its name, "-", the group index.
GROUP_INDEX = "0|[1-9][0-9]{0,8}"
_GROUP = re.compile(GROUP_INDEX)


def belongs(controller: tuple[str, str] | None, kind: str, name: str) -> bool:
    """Whether a pod whose controlling owner reference is ``controller`` (kind, name) is a
    replica of the workload ``kind``/``name`` of its own namespace: the workload itself controls
    it (a StatefulSet, or any workload kind that makes its pods directly), or, for a
    Deployment, one of the ReplicaSets it makes (``NAME-HASH``), or, for a LeaderWorkerSet,
    one of the StatefulSets it makes (``NAME`` of the leaders, ``NAME-GROUP`` of a group's
    workers)."""
    if controller is None:
        return False
    ref_kind, ref_name = controller
    if ref_kind == kind and ref_name == name:
        return True
    prefix = f"{name}-"
    if kind == "LeaderWorkerSet" and ref_kind == "StatefulSet":
        return ref_name == name or (
            ref_name.startswith(prefix) and _GROUP.fullmatch(ref_name[len(prefix) :]) is not None
        )
    return (
        kind == "Deployment"
        and ref_kind == "ReplicaSet"
        and ref_name.startswith(prefix)
        and _TEMPLATE_HASH.fullmatch(ref_name[len(prefix) :]) is not None
    )
