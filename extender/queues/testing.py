"""A throughput reader for tests: :class:`FakeReader` answers each query from a function of time.
Production code does not import this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from common.errors import InvalidInput


@dataclass
class FakeReader:
    """Throughput as a function of time, per query; an unknown query has no data."""

    series: dict[str, Callable[[float], float]] = field(default_factory=dict)
    fail: Exception | None = None
    calls: int = 0

    async def instant(self, query: str, at_s: float, what: str) -> float:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        fn = self.series.get(query)
        if fn is None:
            raise InvalidInput(f"{what}: no data (empty vector)")
        return fn(at_s)
