"""Right of return per replica: where a returning replica's own lent group is. Pure over the
cluster view.

A replica that takes back its lent group (``PodRequest.lent_group``, a StatefulSet replica
while its lease reclaims) goes to the node holding that group, while the group can come back
whole (:func:`~extender.rightofreturn.rules.group_can_return`, the leasing controller's rule):
the filter rejects every other node and the preempt verb evicts only there, so kube-scheduler
cannot send the replica to another node whose devices happen to be free. Where the group cannot
come back, the replica is placed as any reclaim is (its node's other devices, then the standby
pool).
"""

from __future__ import annotations

from common.model import Device, GpuUuid, Holder, NodeName, PodRequest
from extender.cluster.state import ClusterState
from extender.rightofreturn.rules import group_can_return

RETURN_HOME = "tidelease: this replica's own lent GPUs are on node {node} (right of return)"


def lent_group_home(cluster: ClusterState, req: PodRequest) -> NodeName | None:
    """The node holding the request's lent group, when the group can come back whole."""
    if req.lent_group is None or req.owner is None:
        return None
    devices: dict[GpuUuid, Device] = {}
    holders: dict[GpuUuid, Holder] = {}
    offering: dict[str, bool] = {}
    for state in cluster:
        mine = [
            d for d in state.devices if d.cls.replica == req.lent_group and d.cls.owner == req.owner
        ]
        if not mine:
            continue
        offering[state.node] = state.offering
        for d in mine:
            devices[d.uuid] = d
        for a in state.allocations.values():
            for u in a.devices:
                if u in devices:
                    holders[u] = a.holder
    if not group_can_return(req.owner, devices, devices, holders, offering):
        return None
    return next(iter(devices.values())).node
