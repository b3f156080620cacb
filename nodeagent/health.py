"""Device health from NVML signals, with recovery. Pure: readings and a clock in, states out.

Rules (``HealthSettings`` holds the knobs):

* a critical XID marks the device unhealthy, except the application XIDs (13, 31, 43, 45, 68,
  109 by default: faults of the program, not of the GPU); XID 79 (fallen off the bus) always;
* a lost GPU (NVML answers GPU_IS_LOST) is unhealthy;
* pending row remaps, a failed row remap, or retired pages pending are unhealthy (they need a
  reset to clear);
* a rise of the volatile uncorrectable ECC counter is unhealthy;
* a failing NVML call (other than NOT_SUPPORTED, which only means the check does not apply)
  makes the device Unknown, never unhealthy and never a crash;
* unlike every peer, a device comes back: it is healthy again once every condition has been
  clear for ``quiet_period_s`` (events such as XIDs and ECC rises count from their last
  occurrence; standing conditions from the last reading that showed them).

Throttling (clock-event reasons such as HW slowdown) is reported in the reason, not counted as a
fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.model import Health

if TYPE_CHECKING:
    from nodeagent.nvml import Sample, XidEvent

DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
XID_FALLEN_OFF_BUS = 79
_THROTTLE_BITS = {0x8: "HW slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake"}


@dataclass(frozen=True, slots=True)
class HealthSettings:
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    quiet_period_s: float = 300.0


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    health: Health
    reason: str = ""


@dataclass(slots=True)
class _Memory:
    """What the tracker remembers of one device between readings."""

    last_fault: float | None = None  # time of the last fault seen (event or standing condition)
    last_reason: str = ""
    ecc_seen: int | None = None
    state: DeviceHealth = field(default_factory=lambda: DeviceHealth(Health.UNKNOWN, "not read"))


def faults(sample: Sample, previous_ecc: int | None) -> list[str]:
    """The standing conditions and ECC rise in one reading, as reasons."""
    found: list[str] = []
    if sample.lost:
        found.append("GPU is lost")
    if sample.remap_failed:
        found.append("row remapping failed")
    if sample.remap_pending:
        found.append("row remap pending")
    if sample.retired_pages_pending:
        found.append("retired pages pending")
    ecc = sample.ecc_uncorrected_volatile
    if ecc is not None and previous_ecc is not None and ecc > previous_ecc:
        found.append(f"{ecc - previous_ecc} new uncorrectable ECC error(s)")
    return found


def critical(xid: int, settings: HealthSettings) -> bool:
    return xid == XID_FALLEN_OFF_BUS or xid not in settings.ignored_xids


def throttling(sample: Sample) -> str:
    bits = sample.clock_event_reasons or 0
    names = [name for bit, name in _THROTTLE_BITS.items() if bits & bit]
    return ", ".join(names)


class HealthTracker:
    """Per-device health over time. Feed readings and events with the time they were taken."""

    def __init__(self, uuids: list[str], settings: HealthSettings) -> None:
        self._settings = settings
        self._memory = {u: _Memory() for u in uuids}

    def state(self, uuid: str) -> DeviceHealth:
        return self._memory[uuid].state

    def states(self) -> dict[str, DeviceHealth]:
        return {u: m.state for u, m in self._memory.items()}

    def on_event(self, event: XidEvent, now: float) -> bool:
        """Record an XID; whether the device's state changed."""
        memory = self._memory.get(event.uuid)
        if memory is None or not critical(event.xid, self._settings):
            return False
        memory.last_fault = now
        memory.last_reason = f"critical XID {event.xid}"
        return self._set(memory, DeviceHealth(Health.UNHEALTHY, memory.last_reason))

    def on_sample(self, sample: Sample, now: float) -> bool:
        """Apply one reading; whether the device's state changed."""
        memory = self._memory.get(sample.uuid)
        if memory is None:
            return False
        found = faults(sample, memory.ecc_seen)
        if sample.ecc_uncorrected_volatile is not None:
            memory.ecc_seen = sample.ecc_uncorrected_volatile
        if found:
            memory.last_fault = now
            memory.last_reason = "; ".join(found)
            return self._set(memory, DeviceHealth(Health.UNHEALTHY, memory.last_reason))
        quiet = self._settings.quiet_period_s
        if memory.last_fault is not None and now - memory.last_fault < quiet:
            left = quiet - (now - memory.last_fault)
            reason = f"{memory.last_reason}; healthy again after {left:.0f} s without faults"
            return self._set(memory, DeviceHealth(Health.UNHEALTHY, reason))
        if sample.errors:
            return self._set(memory, DeviceHealth(Health.UNKNOWN, "; ".join(sample.errors)))
        return self._set(memory, DeviceHealth(Health.HEALTHY, throttling(sample)))

    @staticmethod
    def _set(memory: _Memory, state: DeviceHealth) -> bool:
        changed = state.health is not memory.state.health
        memory.state = state
        return changed
