"""Which workloads name their replicas, so that a replica can take back the devices it lent. Pure.

Shared by the leasing decisions (which groups a scale-up takes back) and the cluster view
(whether a returning pod is the reclaim of one lent group).
"""

from __future__ import annotations

STATEFULSET = "StatefulSet"


def names_replicas(kind: str) -> bool:
    """Whether a workload of this kind names its replicas stably, so that a replica can take
    back the very devices it lent: a StatefulSet's pods are ``<name>-<ordinal>``, and a
    scale-up creates the lowest ordinals missing. A Deployment's (a ReplicaSet's) pods get new
    random names, so nothing ties a new pod to the one that left: its lent groups come back as
    a set, any new pod on any group."""
    return kind == STATEFULSET


def incoming_replicas(kind: str, name: str, have: int, target: int) -> tuple[str, ...] | None:
    """The pods a scale-up from ``have`` to ``target`` replicas creates, by name; None where the
    workload does not name them (:func:`names_replicas`)."""
    if not names_replicas(kind):
        return None
    return tuple(f"{name}-{k}" for k in range(max(0, have), max(0, target)))
