"""Simulated time: discrete steps and an event queue. Nothing here sleeps. Pure.

The simulation advances in steps of a few simulated minutes. Events (a borrower finishes, a
device fails or is repaired, a pending job gives up) are kept in a heap and handled at the first
step at or after their minute, in the order of their kind and then of their scheduling.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field


class Kind(enum.IntEnum):
    """Event kinds, in the order they are handled within one step."""

    REPAIR = 0
    FAILURE = 1
    COMPLETION = 2
    ABANDON = 3


Event = tuple[int, int, int, int, int]  # minute, kind, sequence, subject, token
_KINDS = {int(k): k for k in Kind}  # Kind(n) without the enum's call


@dataclass(slots=True)
class SimClock:
    """Minute ``minute`` of a run that starts at ``start`` (UTC epoch seconds)."""

    start: float
    step: int
    minute: int = 0

    @property
    def now(self) -> float:
        """Epoch seconds, for policies that read the time of day."""
        return self.start + 60.0 * self.minute

    def ticks(self, steps: int) -> Iterator[int]:
        """Advance ``steps`` times, yielding each step's minute (0 first)."""
        for i in range(steps):
            self.minute = i * self.step
            yield self.minute


@dataclass(slots=True)
class EventQueue:
    _heap: list[Event] = field(default_factory=list)
    _seq: int = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, minute: int, kind: Kind, subject: int, token: int = 0) -> None:
        """``subject`` names what the event is about (a job id, a device number); ``token``
        lets the handler ignore events that were overtaken (a job evicted before it finished)."""
        self._seq += 1
        heapq.heappush(self._heap, (minute, int(kind), self._seq, subject, token))

    def due(self, minute: int) -> Iterator[tuple[Kind, int, int]]:
        """Pop every event at or before ``minute``, in order; events pushed meanwhile for a
        minute already due are handled in the same pass."""
        heap = self._heap
        while heap and heap[0][0] <= minute:
            _, kind, _, subject, token = heapq.heappop(heap)
            yield _KINDS[kind], subject, token
