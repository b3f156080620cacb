"""Right of return: where a returning pod's lent devices are. Pure over the cluster view.

A replica that takes back its lent group (``PodRequest.lent_group``, a StatefulSet replica
while its lease reclaims) goes to the node holding that group, while the group can come back
whole (:func:`~extender.rightofreturn.rules.group_can_return`, the leasing controller's rule).
A Deployment's pods take its groups back as a set: a returning pod goes to a node holding one
of the groups its lease is taking back (``GpuLease.status.reclaim.groups``) that can come back
whole. Either way the filter rejects every other node and the preempt verb evicts only there,
so kube-scheduler cannot send the pod to another node whose devices happen to be free (which
would leave the lent devices' borrowers evicted for nothing). Where no group can come back, the
pod is placed as any reclaim is (its node's other devices, then the standby pool).
"""

from __future__ import annotations

from common.model import Device, GpuUuid, Holder, NodeName, PodRequest
from extender.cluster.state import ClusterState
from extender.rightofreturn.rules import group_can_return

RETURN_HOME = "tidelease: this replica's own lent GPUs are on node {node} (right of return)"
RETURN_HOMES = (
    "tidelease: the lent GPUs this job takes back are on node(s) {nodes} (right of return)"
)
RETURN_HOME_UNOFFERED = (
    "tidelease: waits for its lent GPUs on node(s) {nodes}, which kube-scheduler did not offer"
    " now (a borrower there still being evicted?); elsewhere once the reclaim is overdue"
)


def return_homes(cluster: ClusterState, req: PodRequest) -> frozenset[NodeName]:
    """The nodes a returning pod must go to: its own group's node (a StatefulSet replica), or
    the nodes of the groups its lease takes back (a Deployment's pod), each only while that
    group can come back whole; empty for any other pod, or where none can."""
    if req.owner is None or not req.reclaim:
        return frozenset()
    groups = frozenset({req.lent_group}) if req.lent_group is not None else req.lent_groups
    if not groups:
        return frozenset()
    devices: dict[str, dict[GpuUuid, Device]] = {g: {} for g in groups}
    for d in cluster.lent_devices(req.owner):
        if d.cls.replica in groups:
            devices[d.cls.replica][d.uuid] = d
    lent = {u for group in devices.values() for u in group}
    holders: dict[GpuUuid, Holder] = {}
    offering: dict[str, bool] = {}
    for node in {d.node for group in devices.values() for d in group.values()}:
        state = cluster.get(node)
        if state is None:
            continue
        offering[state.node] = state.offering
        for a in state.allocations.values():
            for u in a.devices:
                if u in lent:
                    holders[u] = a.holder
    homes = set()
    for group in devices.values():
        if group and group_can_return(req.owner, group, group, holders, offering):
            homes.add(next(iter(group.values())).node)
    return frozenset(homes)


def home_reason(req: PodRequest, homes: frozenset[NodeName]) -> str:
    """Why a node outside ``homes`` is rejected, as the filter says it."""
    if req.lent_group is not None and len(homes) == 1:
        return RETURN_HOME.format(node=next(iter(homes)))
    return RETURN_HOMES.format(nodes=", ".join(sorted(homes)))


def home_unoffered_reason(homes: frozenset[NodeName]) -> str:
    """Why every node is rejected while kube-scheduler offers none of ``homes``."""
    return RETURN_HOME_UNOFFERED.format(nodes=", ".join(sorted(homes)))
