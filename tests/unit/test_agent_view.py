"""The node agent's view: what it publishes, and what it remembers across restarts."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from common.model import Health, Tier
from common.objects import parse_gpu_node
from nodeagent.agent import AgentSettings, NodeView, gpu_type
from nodeagent.nvml import NvmlReader, XidEvent
from nodeagent.nvmlfake import FakeNvml, full_gpu
from nodeagent.tiering import DAY
from tests.unit.test_manifests import crd_schema

NODE = "gpu-node-1"


def view(stored: dict[str, Any] | None = None, n: int = 2) -> tuple[NodeView, FakeNvml, NvmlReader]:
    fake = FakeNvml([full_gpu(i) for i in range(n)])
    reader = NvmlReader(fake)
    return NodeView(reader.devices(), AgentSettings(node=NODE), stored), fake, reader


def cycle(v: NodeView, reader: NvmlReader, now: float) -> bool:
    return v.on_samples([reader.sample(i.uuid) for i in v.infos], now)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H20", "H20"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"),
        ("  ", "unknown"),
    ],
)
def test_gpu_type(name: str, expected: str) -> None:
    assert gpu_type(name) == expected


def test_published_status_is_what_the_extender_reads() -> None:
    v, fake, reader = view()
    cycle(v, reader, 0)
    v.assess(0)
    fake.inject_xid(1, 48)
    assert v.on_events(reader.wait_events(0), 1)
    obj = {
        "apiVersion": "tidelease.io/v1alpha1",
        "kind": "GpuNode",
        "metadata": {"name": NODE},
        "spec": {},
        "status": v.status(2),
    }
    jsonschema.validate(obj, crd_schema("gpunodes"))
    inv = parse_gpu_node(obj)
    assert [(d.index, d.gpu_type, d.cls.healthy, d.tier) for d in inv.devices] == [
        (0, "H20", True, Tier.HA),
        (1, "H20", False, Tier.HA),
    ]
    assert "critical XID 48" in obj["status"]["devices"][1]["reason"]


def test_history_and_tiers_survive_a_restart() -> None:
    v, fake, reader = view()
    cycle(v, reader, 0)
    cycle(v, reader, DAY)
    fake.gpu(1).remap_pending = True
    cycle(v, reader, DAY + 3600)  # an hour unhealthy out of 25
    v.assess(DAY + 3600)
    assert v.tiers[fake.gpu(1).uuid] is Tier.LA
    stored = {"status": v.status(DAY + 3600)}

    again, _, reader2 = view(stored)
    assert again.tiers == v.tiers
    assert again.history.intervals(fake.gpu(1).uuid) == [(0.0, DAY, True), (DAY, DAY + 3600, False)]
    assert not again.assess(DAY + 7200)  # not due: assessed an hour ago
    # The restart's first reading starts a new interval: downtime is not observed.
    cycle(again, reader2, 2 * DAY)
    cycle(again, reader2, 2 * DAY + 60)
    assert again.history.intervals(fake.gpu(0).uuid)[-1] == (2 * DAY, 2 * DAY + 60, True)


def test_unreadable_stored_history_is_ignored_not_fatal() -> None:
    v, _, _ = view({"status": {"availability": {"GPU-x": "garbage"}, "devices": "nope"}})
    assert v.history.to_json() == {}
    assert v.tiers == {}


def test_events_for_a_lost_gpu_and_no_change_when_ignored() -> None:
    v, fake, reader = view()
    cycle(v, reader, 0)
    assert not v.on_events([XidEvent(fake.gpu(0).uuid, 13)], 1)
    fake.gpu(0).lost = True
    assert cycle(v, reader, 2)
    assert v.health()[fake.gpu(0).uuid].health is Health.UNHEALTHY


def test_plugin_devices_follow_health() -> None:
    from nodeagent.agent import plugin_devices

    v, fake, reader = view()
    cycle(v, reader, 0)
    devices = plugin_devices(v.infos, v.health())
    assert [(d.uuid, d.healthy) for d in devices] == [
        (fake.gpu(0).uuid, True),
        (fake.gpu(1).uuid, True),
    ]
    assert devices[0].paths == ("/dev/nvidia0",)
    fake.gpu(1).lost = True
    cycle(v, reader, 1)
    assert [d.healthy for d in plugin_devices(v.infos, v.health())] == [True, False]
    assert plugin_devices(v.infos, {})[0].healthy is False  # never read: not handed out


def test_devices_healthy_condition_follows_health_and_keeps_its_transition_time() -> None:
    v, fake, reader = view()
    cycle(v, reader, 0)

    def condition(now: float, agent: NodeView = v) -> dict[str, Any]:
        (c,) = agent.status(now)["conditions"]
        assert c["type"] == "DevicesHealthy"
        return c

    first = condition(10)
    stored_healthy = {"status": v.status(10)}
    assert (first["status"], first["reason"], first["message"]) == (
        "True",
        "AllHealthy",
        "2 of 2 healthy",
    )
    assert condition(20)["lastTransitionTime"] == first["lastTransitionTime"]  # no change
    fake.inject_xid(1, 48)
    assert v.on_events(reader.wait_events(0), 30)
    down = condition(30)
    assert (down["status"], down["reason"]) == ("False", "DevicesUnhealthy")
    assert down["message"].startswith("1 of 2: 1 (")
    assert "XID 48" in down["message"]
    assert down["lastTransitionTime"] != first["lastTransitionTime"]
    # A restarted agent that reads the same health keeps the time the status last changed.
    again, _, reader2 = view(stored_healthy)
    cycle(again, reader2, 60)
    restarted = condition(60, again)
    assert (restarted["status"], restarted["lastTransitionTime"]) == (
        "True",
        first["lastTransitionTime"],
    )
