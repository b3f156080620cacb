"""The node agent: NVML health with recovery, availability tiers, heartbeat, all published on the
node's ``GpuNode``.

:class:`NodeView` is the agent's state and decisions (no I/O, clock passed in); :func:`run_agent`
runs the loops around it: an NVML event thread for XIDs, a health cycle, the heartbeat, and
publishing, which happens at once on every health change, so that the extender stops offering a
failed device within a second or two, and at least every ``flush_interval_s`` for the
availability history. Restarted, the agent reads its history and tiers back from the
``GpuNode`` it published, so accounting survives restarts; the time it was down is not
observed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common import contract
from common.conditions import Status, set_condition
from common.errors import InvalidInput, TideleaseError
from common.model import GpuUuid, Health, Tier
from common.timefmt import epoch, rfc3339
from common.topology import NodeTopology
from common.topology import to_json as topology_json
from common.waiting import wait_event
from nodeagent.deviceplugin.devices import PluginDevice
from nodeagent.health import DeviceHealth, HealthSettings, HealthTracker
from nodeagent.nvml import GpuInfo, GpuReader, Sample, XidEvent
from nodeagent.publishing import Publisher
from nodeagent.tiering import History, TierSettings, assessment_due

log = logging.getLogger(__name__)

Clock = Callable[[], float]
_TIERS = {t.name: t for t in Tier}


def gpu_type(nvml_name: str) -> str:
    """The GPU type pods ask for: NVML's name without the vendor, spaces as dashes.

    "NVIDIA H20" -> "H20"; "NVIDIA A100-SXM4-80GB" -> "A100-SXM4-80GB".
    """
    name = re.sub(r"^NVIDIA\s+", "", nvml_name.strip())
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:63] or "unknown"


def plugin_devices(
    infos: list[GpuInfo],
    health: dict[str, DeviceHealth],
    topology: NodeTopology | None = None,
) -> tuple[PluginDevice, ...]:
    """What the device plugin advertises: every GPU, healthy only when its health is Healthy
    (an Unknown device is not handed to new containers either), with its NUMA node when the
    topology knows it (the kubelet's Topology Manager aligns by it)."""

    def numa_node(index: int) -> int | None:
        place = topology.placement(index) if topology is not None else None
        return place.numa_node if place is not None else None

    return tuple(
        PluginDevice(
            uuid=GpuUuid(i.uuid),
            index=i.index,
            healthy=health.get(i.uuid, DeviceHealth(Health.UNKNOWN)).health is Health.HEALTHY,
            paths=(f"/dev/nvidia{i.minor}",),
            numa_node=numa_node(i.index),
        )
        for i in infos
    )


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: str
    health: HealthSettings = field(default_factory=HealthSettings)
    tiers: TierSettings = field(default_factory=TierSettings)
    cycle_s: float = 5.0  # health readings
    heartbeat_s: float = 10.0
    flush_interval_s: float = 300.0  # publish the availability history at least this often
    event_wait_ms: int = 1000


class NodeView:
    """The agent's knowledge of its node's devices. Pure: readings and times in."""

    def __init__(
        self,
        infos: list[GpuInfo],
        settings: AgentSettings,
        stored: dict[str, Any] | None,
        topology: NodeTopology | None = None,
    ) -> None:
        self.infos = infos
        self.settings = settings
        self.topology = topology  # read once at start: the wiring does not change while up
        self.tracker = HealthTracker([i.uuid for i in infos], settings.health)
        self.history = History()
        self.tiers: dict[str, Tier] = {}
        self.assessed_at: float | None = None
        self.last_reading: float | None = None
        self._restore(stored or {})

    def _restore(self, stored: dict[str, Any]) -> None:
        status = stored.get("status") or {}
        try:
            self.history = History.from_json(status.get("availability"))
        except InvalidInput as e:
            log.error(
                "GpuNode %s: ignoring unreadable availability history: %s", self.settings.node, e
            )
        for dev in status.get("devices") or []:
            if isinstance(dev, dict) and dev.get("tier") in _TIERS:
                self.tiers[str(dev.get("uuid"))] = _TIERS[dev["tier"]]
        self.assessed_at = epoch(status.get("tierAssessedAt"))
        # Its own conditions only (their transition times go on); others' are theirs to write.
        conditions = status.get("conditions")
        self.conditions: list[dict[str, Any]] = [
            c
            for c in (conditions if isinstance(conditions, list) else [])
            if isinstance(c, dict) and c.get("type") in AGENT_CONDITIONS
        ]

    def on_samples(self, samples: list[Sample], now: float) -> bool:
        """Apply a health cycle's readings; whether any device's health changed."""
        changed = False
        for s in samples:
            changed |= self.tracker.on_sample(s, now)
        if self.last_reading is not None:
            for info in self.infos:
                state = self.tracker.state(info.uuid)
                self.history.record(info.uuid, state.health, self.last_reading, now)
        self.last_reading = now
        return changed

    def on_events(self, events: list[XidEvent], now: float) -> bool:
        changed = False
        for e in events:
            if self.tracker.on_event(e, now):
                log.warning(
                    "device %s on %s: critical XID %d, now unhealthy",
                    e.uuid,
                    self.settings.node,
                    e.xid,
                )
                changed = True
        return changed

    def assess(self, now: float) -> bool:
        """Assign tiers when due; whether any tier changed."""
        if not assessment_due(self.assessed_at, now, self.settings.tiers):
            return False
        window = self.settings.tiers.window_s
        self.history.prune(now, window)
        new = self.history.assess([i.uuid for i in self.infos], now, window)
        changed = new != {u: self.tiers.get(u) for u in new}
        self.tiers, self.assessed_at = new, now
        log.info(
            "node %s: tiers assessed: %s",
            self.settings.node,
            ", ".join(f"{i.index}={new[i.uuid].name}" for i in self.infos),
        )
        return changed

    def health(self) -> dict[str, DeviceHealth]:
        return self.tracker.states()

    def status(self, now: float, cache: dict[str, Any] | None = None) -> dict[str, Any]:
        """The GpuNode status to publish; ``cache`` is the peer cache's inventory, if any."""
        devices = []
        for info in self.infos:
            state = self.tracker.state(info.uuid)
            devices.append(
                {
                    "index": info.index,
                    "uuid": info.uuid,
                    "type": gpu_type(info.name),
                    "health": state.health.value,
                    "tier": self.tiers.get(info.uuid, Tier.HA).name,
                    "reason": state.reason[:1024],
                }
            )
        status: dict[str, Any] = {
            "devices": devices,
            "availability": self.history.to_json(),
            "cache": cache if cache is not None else {"images": [], "checkpoints": []},
            "observedAt": rfc3339(now),
        }
        if self.assessed_at is not None:
            status["tierAssessedAt"] = rfc3339(self.assessed_at)
        if self.topology is not None:
            status["topology"] = topology_json(self.topology)
        self.conditions = set_condition(
            self.conditions, contract.CONDITION_DEVICES_HEALTHY, *devices_healthy(devices), now
        )
        status["conditions"] = self.conditions
        return status


AGENT_CONDITIONS = frozenset({contract.CONDITION_DEVICES_HEALTHY})


def devices_healthy(devices: list[dict[str, Any]]) -> tuple[Status, str, str]:
    """The DevicesHealthy condition of the devices' health: its status, reason and message."""
    unhealthy = [d for d in devices if d["health"] == Health.UNHEALTHY.value]
    unknown = [d for d in devices if d["health"] == Health.UNKNOWN.value]
    if unhealthy:
        which = ", ".join(f"{d['index']} ({d['reason'] or 'unhealthy'})" for d in unhealthy)
        return "False", "DevicesUnhealthy", f"{len(unhealthy)} of {len(devices)}: {which}"
    if unknown:
        which = ", ".join(str(d["index"]) for d in unknown)
        return "Unknown", "HealthUnknown", f"{len(unknown)} of {len(devices)} unread: {which}"
    return "True", "AllHealthy", f"{len(devices)} of {len(devices)} healthy"


async def _event_pump(
    reader: GpuReader, wait_ms: int, sink: Callable[[list[XidEvent]], None]
) -> None:
    """NVML's blocking event wait, in a thread; events are handled back on the loop."""
    while True:
        events = await asyncio.to_thread(reader.wait_events, wait_ms)
        if events:
            sink(events)


async def run_agent(
    *,
    reader: GpuReader,
    publisher: Publisher,
    settings: AgentSettings,
    clock: Clock = time.time,
    on_change: Callable[[tuple[PluginDevice, ...]], object] | None = None,
    on_topology: Callable[[NodeTopology | None], object] | None = None,
    ready: asyncio.Event | None = None,
    cache_inventory: Callable[[], dict[str, Any]] | None = None,
    prewarm_status: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Watch the node's GPUs and publish what is seen, until cancelled. ``cache_inventory``
    gives the peer cache's contents (docs/peer-cache.md); a change is published next cycle.
    ``prewarm_status``: the prewarm progress (:mod:`nodeagent.prewarm`, which also writes it
    itself), kept in every status this loop publishes. ``on_topology`` is told the node's
    topology once it is read (the device plugin's choice for pods placed without the
    extender)."""
    infos = await asyncio.to_thread(reader.devices)
    reading = await asyncio.to_thread(reader.topology)
    for error in reading.errors:
        log.warning("node %s: topology: %s", settings.node, error)
    if on_topology is not None:
        on_topology(reading.topology)
    view = NodeView(infos, settings, await publisher.load(), reading.topology)
    log.info(
        "node %s: %d GPU(s): %s",
        settings.node,
        len(infos),
        ", ".join(f"{i.index}:{gpu_type(i.name)}" for i in infos) or "none",
    )
    wake = asyncio.Event()
    dirty = True

    def events_arrived(events: list[XidEvent]) -> None:
        nonlocal dirty
        if view.on_events(events, clock()):
            dirty = True
            wake.set()

    cache: dict[str, Any] | None = None

    async def publish(now: float) -> None:
        status = view.status(now, cache)
        if prewarm_status is not None:
            status["prewarm"] = prewarm_status()
        await publisher.publish(status)
        if on_change is not None:
            on_change(plugin_devices(infos, view.health(), view.topology))

    pump = asyncio.create_task(_event_pump(reader, settings.event_wait_ms, events_arrived))
    heartbeat = asyncio.create_task(_heartbeats(publisher, settings, clock))
    last_flush = 0.0
    try:
        while True:
            now = clock()
            samples = await asyncio.to_thread(lambda: [reader.sample(i.uuid) for i in infos])
            now = clock()
            dirty |= view.on_samples(samples, now)
            dirty |= view.assess(now)
            if cache_inventory is not None:
                held = await asyncio.to_thread(cache_inventory)
                dirty |= held != cache
                cache = held
            if dirty or now - last_flush >= settings.flush_interval_s:
                try:
                    await publish(now)
                    dirty, last_flush = False, now
                except TideleaseError as e:
                    log.warning("publishing GpuNode %s failed, will retry: %s", settings.node, e)
            if ready is not None:
                ready.set()
            wake.clear()
            await wait_event(wake, settings.cycle_s)
    finally:
        for task in (pump, heartbeat):
            task.cancel()
        await asyncio.gather(pump, heartbeat, return_exceptions=True)


async def _heartbeats(publisher: Publisher, settings: AgentSettings, clock: Clock) -> None:
    while True:
        try:
            await publisher.heartbeat(clock())
        except TideleaseError as e:
            log.warning("heartbeat of %s failed: %s", settings.node, e)
        await asyncio.sleep(settings.heartbeat_s)
