"""Which workloads name their replicas, so that a replica can take back the devices it lent. Pure.

Shared by the leasing decisions (which groups a scale-up takes back) and the cluster view
(whether a returning pod is the reclaim of one lent group).

Two kinds name their pods stably, and so take back per pod the very devices each pod lent:

* a StatefulSet: one pod per replica, ``NAME-ORDINAL``; a scale-down removes the highest
  ordinals, a scale-up creates the lowest missing;
* a LeaderWorkerSet (and any workload of that kind, e.g. a CRD shaped like it): a replica is a
  group of pods, its leader ``NAME-GROUP`` and its workers ``NAME-GROUP-WORKER``, and the scale
  counts groups; a scale-down removes the highest groups whole. Each pod of a group takes back
  the devices it lent, so each group is back on its own devices.

Any other workload with a ``scale`` subresource (a Deployment, a CRD of another kind) is leased
per set: its lent groups come back as a set, any new pod on any group.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import partial

from common.tenancy import GROUP_INDEX
from extender.rightofreturn.rules import ordinal

STATEFULSET = "StatefulSet"
LEADERWORKERSET = "LeaderWorkerSet"

_GROUP_MEMBER = re.compile(f"({GROUP_INDEX})(-(?:{GROUP_INDEX}))?")


def names_replicas(kind: str) -> bool:
    """Whether a workload of this kind names its pods stably, so that each can take back the
    very devices it lent: a StatefulSet's pods are ``<name>-<ordinal>``, a LeaderWorkerSet's
    ``<name>-<group>[-<worker>]``. A Deployment's (a ReplicaSet's) pods get new random names,
    so nothing ties a new pod to the one that left: its lent groups come back as a set, any new
    pod on any group."""
    return kind in (STATEFULSET, LEADERWORKERSET)


def in_groups(kind: str) -> bool:
    """Whether a replica of this kind is a group of pods (a LeaderWorkerSet's)."""
    return kind == LEADERWORKERSET


def _split(workload: str, pod_name: str) -> tuple[int, str]:
    """(group index, member suffix: "" for the leader, "-W" for worker W) of a
    LeaderWorkerSet's pod; (-1, name) for a name that is not one of its pods'."""
    prefix = f"{workload}-"
    if not pod_name.startswith(prefix):
        return -1, pod_name
    m = _GROUP_MEMBER.fullmatch(pod_name[len(prefix) :])
    if m is None:
        return -1, pod_name
    return int(m.group(1)), m.group(2) or ""


def replica_index(kind: str, workload: str, pod_name: str) -> int:
    """The replica a pod is part of, by its name: a StatefulSet's ordinal, a LeaderWorkerSet's
    group; -1 where the name carries none."""
    if in_groups(kind):
        return _split(workload, pod_name)[0]
    return ordinal(pod_name)


def indexer(kind: str, workload: str) -> Callable[[str], int]:
    """:func:`replica_index` for one workload."""
    return partial(replica_index, kind, workload)


def member_name(kind: str, workload: str, pod_name: str, index: int) -> str:
    """The name the same member of replica ``index`` has: a StatefulSet's ``NAME-INDEX``, a
    LeaderWorkerSet's leader or worker of group ``index`` in the same place."""
    if in_groups(kind):
        _, member = _split(workload, pod_name)
        return f"{workload}-{index}{member}"
    return f"{workload}-{index}"


def incoming_replicas(
    kind: str, name: str, have: int, target: int, lent: Iterable[str] = ()
) -> tuple[str, ...] | None:
    """The pods a scale-up from ``have`` to ``target`` replicas brings back that lent devices,
    by name; None where the workload does not name them (:func:`names_replicas`). A
    StatefulSet's are its new ordinals; a LeaderWorkerSet's the members of its new groups that
    lent a group (``lent``, the lent groups' names)."""
    if not names_replicas(kind):
        return None
    if in_groups(kind):
        return tuple(n for n in lent if have <= _split(name, n)[0] < target)
    return tuple(f"{name}-{k}" for k in range(max(0, have), max(0, target)))
