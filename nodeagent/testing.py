"""A node's GpuNode in memory for the prewarm tests: :class:`MemoryPrewarmNode`. Production code
does not import this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from common.prewarmwire import Directive, ItemStatus, parse_items
from nodeagent.prewarm import Key


class MemoryPrewarmNode:
    """A GpuNode in memory: ``set`` the directives; ``reports`` keeps every status written."""

    def __init__(self) -> None:
        self._events: asyncio.Queue[tuple[tuple[Directive, ...], tuple[ItemStatus, ...]]] = (
            asyncio.Queue()
        )
        self.reports: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def set(self, directives: Iterable[Directive], stored: Iterable[ItemStatus] = ()) -> None:
        self._events.put_nowait((tuple(directives), tuple(stored)))

    async def watch(self) -> AsyncIterator[tuple[tuple[Directive, ...], tuple[ItemStatus, ...]]]:
        while True:
            yield await self._events.get()

    async def report(self, prewarm: dict[str, Any]) -> None:
        self.reports.append(prewarm)
        self.changed.set()

    @property
    def items(self) -> dict[Key, ItemStatus]:
        """The latest report, by item."""
        last = self.reports[-1] if self.reports else {}
        return {i.key: i for i in parse_items(last)}
