"""Reliability tiers from each device's availability history (the agent's accounting of
observed intervals; :mod:`common.availability` computes availability from them). Pure:
intervals in, tiers out.

Each device keeps a list of observed intervals ``[start, end, healthy]`` (seconds since the
epoch), merged when contiguous and pruned to the rolling window (14 days by default).
Availability is healthy time over observed time inside the window. Time the agent was down is
simply not observed — it counts as unknown, not as down — and so is time when NVML could not
read the device (Unknown health). A device never observed is taken as fully available: no
downtime has been seen.

Tiers: HA (high availability) at 100 %, MA (medium) from 97 % up to 100 %, LA (low) below
97 %. They are assessed on a schedule (every 14 days by default), not continuously, so that
placement sees stable tiers; the same history always gives the same tier.

Reference: weflex 3.5 (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from common.availability import Interval, availability
from common.errors import InvalidInput
from common.model import Health, Tier

DAY = 86_400.0
MA_THRESHOLD = 0.97
# Readings closer than this are contiguous: a cycle's end and the next cycle's start.
CONTIGUOUS_S = 1.0


@dataclass(frozen=True, slots=True)
class TierSettings:
    window_s: float = 14 * DAY
    period_s: float = 14 * DAY


def tier_for(availability: float) -> Tier:
    if availability >= 1.0:
        return Tier.HA
    if availability >= MA_THRESHOLD:
        return Tier.MA
    return Tier.LA


class History:
    """Observed intervals of every device of a node."""

    def __init__(self, intervals: Mapping[str, list[Interval]] | None = None) -> None:
        self._intervals: dict[str, list[Interval]] = {
            u: sorted(v) for u, v in (intervals or {}).items()
        }

    def intervals(self, uuid: str) -> list[Interval]:
        return list(self._intervals.get(uuid, ()))

    def record(self, uuid: str, health: Health, start: float, end: float) -> None:
        """Add an observation; Unknown health is not an observation."""
        if end <= start or health is Health.UNKNOWN:
            return
        ok = health is Health.HEALTHY
        items = self._intervals.setdefault(uuid, [])
        if items:
            a, b, last_ok = items[-1]
            if last_ok == ok and start - b <= CONTIGUOUS_S and start >= a:
                items[-1] = (a, max(b, end), ok)
                return
        items.append((start, end, ok))

    def prune(self, now: float, window_s: float) -> None:
        horizon = now - window_s
        for uuid, items in self._intervals.items():
            self._intervals[uuid] = [(max(a, horizon), b, ok) for a, b, ok in items if b > horizon]

    def availability(self, uuid: str, now: float, window_s: float) -> float:
        return availability(self._intervals.get(uuid, ()), now, window_s)

    def assess(self, uuids: Iterable[str], now: float, window_s: float) -> dict[str, Tier]:
        return {u: tier_for(self.availability(u, now, window_s)) for u in uuids}

    # --- persistence (in GpuNode.status.availability) ---
    def to_json(self) -> dict[str, list[list[int]]]:
        return {
            u: [[int(a), int(b + 0.5), int(ok)] for a, b, ok in items]
            for u, items in sorted(self._intervals.items())
            if items
        }

    @classmethod
    def from_json(cls, value: Any) -> History:
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise InvalidInput("availability must be a map of device UUID to intervals")
        out: dict[str, list[Interval]] = {}
        for uuid, items in value.items():
            if not isinstance(items, list):
                raise InvalidInput(f"availability of {uuid} must be a list")
            parsed: list[Interval] = []
            for item in items:
                if (
                    not isinstance(item, list)
                    or len(item) != 3
                    or not all(isinstance(x, int | float) for x in item)
                    or item[1] < item[0]
                ):
                    raise InvalidInput(f"availability of {uuid}: bad interval {item!r}")
                parsed.append((float(item[0]), float(item[1]), bool(item[2])))
            out[str(uuid)] = parsed
        return cls(out)


def assessment_due(last_assessed: float | None, now: float, settings: TierSettings) -> bool:
    return last_assessed is None or now - last_assessed >= settings.period_s
