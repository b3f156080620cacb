"""What a server that asks the API server about bearer tokens keeps between asks. Pure.

Every random token sent to an endpoint that checks callers with a TokenReview would cost the API
server a request; so verdicts are kept for a while (:class:`ExpiringCache`, a bounded LRU whose
entries expire), and reviews of tokens not known yet are rate-limited (:class:`TokenBucket`).
Used by /metrics' delegated authentication (common/delegatedauth.py) and the peer cache's
identity check (nodeagent/cache/peerauth.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TokenBucket:
    """``take`` is True at most ``burst`` times at once, then ``rate`` times a second."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self._clock = rate, float(burst), clock
        self._level, self._at = float(burst), clock()

    def take(self) -> bool:
        now = self._clock()
        self._level = min(self.burst, self._level + max(0.0, now - self._at) * self.rate)
        self._at = now
        if self._level < 1.0:
            return False
        self._level -= 1.0
        return True


class ExpiringCache(Generic[K, V]):
    """At most ``size`` entries, each until its own time; the least recently used out first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: K, until: float, value: V) -> None:
        self._entries[key] = (until, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
