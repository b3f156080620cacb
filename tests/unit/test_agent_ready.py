"""AgentReady from a heartbeat, and the agent's status writes keeping other writers' conditions
(the agent owns DevicesHealthy only)."""

from __future__ import annotations

import pytest

from common.timefmt import rfc3339
from extender.agents.readiness import agent_ready
from nodeagent.publishing import MemoryPublisher, keep_others_conditions

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("renewed", "key"),
    [
        (None, ("Unknown", "NoHeartbeat")),
        (NOW - 10, ("True", "Heartbeating")),
        (NOW - 60, ("True", "Heartbeating")),  # the extender's rule: silent *past* the timeout
        (NOW - 61, ("False", "AgentSilent")),
        (NOW + 5, ("True", "Heartbeating")),  # a clock ahead of ours is not silence
    ],
)
def test_agent_ready_by_the_extenders_timeout(renewed: float | None, key: tuple[str, str]) -> None:
    assert agent_ready("n1", renewed, NOW, 60).key == key


def test_the_message_names_the_lease_or_the_last_heartbeat_and_not_each_renewal() -> None:
    assert "tidelease-agent-n1" in agent_ready("n1", None, NOW, 60).message
    silent = agent_ready("n1", NOW - 300, NOW, 60).message
    assert rfc3339(NOW - 300) in silent
    assert agent_ready("n1", NOW - 1, NOW, 60) == agent_ready("n1", NOW - 2, NOW + 7, 60)


def cond(kind: str, status: str = "True") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": "R", "message": "m"}


def test_the_agent_keeps_conditions_it_does_not_write() -> None:
    stored = {"conditions": [cond("AgentReady", "False"), cond("DevicesHealthy", "False")]}
    mine = {"devices": [], "conditions": [cond("DevicesHealthy")]}
    got = keep_others_conditions(stored, mine)
    assert got["conditions"] == [cond("DevicesHealthy"), cond("AgentReady", "False")]
    assert keep_others_conditions(None, mine) is mine
    assert keep_others_conditions({"conditions": "junk"}, mine) is mine


async def test_a_restarted_agent_does_not_write_back_a_stale_agent_ready() -> None:
    from nodeagent.agent import AgentSettings, NodeView

    stored = {"status": {"conditions": [cond("AgentReady", "False"), cond("DevicesHealthy")]}}
    publisher = MemoryPublisher(stored)
    view = NodeView([], AgentSettings(node="n1"), stored)
    status = view.status(NOW)
    assert [c["type"] for c in status["conditions"]] == ["DevicesHealthy"]
    await publisher.publish(status)
    assert publisher.stored is not None
    kept = {c["type"]: c["status"] for c in publisher.stored["status"]["conditions"]}
    assert kept == {"DevicesHealthy": "True", "AgentReady": "False"}
