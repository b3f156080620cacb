"""The node agent's heartbeat: a coordination.k8s.io Lease per node, ``tidelease-agent-<node>``
in the agents' namespace, renewed every few seconds. Pure: what a Lease says."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common import contract
from common.model import NodeName
from common.timefmt import epoch


def heartbeat(lease: Mapping[str, Any]) -> tuple[NodeName, float | None]:
    """The node whose agent holds ``lease`` and when it last renewed it (epoch seconds)."""
    spec = lease.get("spec") or {}
    name = str((lease.get("metadata") or {}).get("name", ""))
    node = spec.get("holderIdentity") or name.removeprefix(contract.AGENT_LEASE_PREFIX)
    return NodeName(str(node)), epoch(spec.get("renewTime"))
