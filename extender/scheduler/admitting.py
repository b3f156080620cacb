"""What the verbs place: a pod's request as tidelease sees it, or why it is refused. Pure.

Every verb (filter, prioritize, preempt, bind) and ``kubectl tidelease explain`` reads a pod
through :func:`placed_request`, so they agree on it: the pod-author contract parsed
(:func:`common.podrequest.parse_pod`), privileges checked against what the admin granted
(:meth:`~extender.cluster.state.ClusterState.refusal`: nothing a pod writes grants one), and a
pod of the shared queues placed only once the queues controller released it, and a
reclaim derived from the pod's GpuLease and workload
(:meth:`~extender.cluster.state.ClusterState.with_reclaim`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.errors import NotPermitted
from common.model import PodRequest
from common.podrequest import parse_pod
from common.queuerelease import release_problem
from extender.cluster.state import ClusterState


def placed_request(
    cluster: ClusterState,
    pod: Mapping[str, Any],
    *,
    resource: str,
    online_class: str,
    release_key: bytes | None = None,
) -> PodRequest:
    """The pod's request; :class:`~common.errors.InvalidInput` for a pod that breaks the
    contract, :class:`~common.errors.NotPermitted` for one tidelease will not place: a
    privilege its namespace was not granted, or a pod of the shared queues that the queues
    controller has not released (``release_key``: the queues' key, None without the queues;
    common.queuerelease)."""
    req = parse_pod(dict(pod), resource=resource)
    why = cluster.refusal(req, online_class) or release_problem(pod, release_key)
    if why is not None:
        raise NotPermitted(why)
    return cluster.with_reclaim(req)
