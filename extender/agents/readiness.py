"""Whether a node's agent is alive, as the GpuNode condition ``AgentReady`` says it. Pure.

The agent cannot report its own silence, so the control plane writes this condition from the
agent's heartbeat Lease, by the rule the extender uses to stop offering a node's GPUs
(``agent_timeout_s``). The message does not change with every heartbeat: the condition is
written only when its status or reason changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from common import contract
from common.conditions import Status
from common.timefmt import rfc3339


@dataclass(frozen=True, slots=True)
class AgentReady:
    status: Status
    reason: str
    message: str

    @property
    def key(self) -> tuple[str, str]:
        """What a change is judged on."""
        return self.status, self.reason


def agent_ready(node: str, renewed: float | None, now: float, timeout_s: float) -> AgentReady:
    """The condition for ``node`` whose agent last renewed its Lease at ``renewed`` (None: no
    Lease)."""
    if renewed is None:
        return AgentReady(
            "Unknown",
            "NoHeartbeat",
            f"no heartbeat Lease {contract.AGENT_LEASE_PREFIX}{node}: no agent has run here",
        )
    if now - renewed > timeout_s:
        return AgentReady(
            "False",
            "AgentSilent",
            f"no heartbeat since {rfc3339(renewed)} (more than {timeout_s:.0f} s): the "
            "extender offers none of this node's GPUs",
        )
    return AgentReady(
        "True", "Heartbeating", f"the agent renews its Lease (silent after {timeout_s:.0f} s)"
    )
