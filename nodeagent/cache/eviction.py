"""Which entries to evict to keep the cache under its size bound: least recently used first.
Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nodeagent.cache.naming import EntryId, Kind


@dataclass(frozen=True, slots=True)
class EntryUse:
    kind: Kind
    id: EntryId
    size: int
    last_used: float


def choose_evictions(
    entries: Iterable[EntryUse],
    *,
    max_bytes: int,
    incoming: int = 0,
    keep: frozenset[tuple[Kind, EntryId]] = frozenset(),
) -> tuple[EntryUse, ...]:
    """The least recently used entries whose removal brings the total (plus ``incoming`` bytes
    about to arrive) under ``max_bytes``; entries in ``keep`` are never chosen. If even evicting
    everything else is not enough, everything else is chosen and the caller decides."""
    held = list(entries)
    total = sum(e.size for e in held) + incoming
    chosen: list[EntryUse] = []
    for e in sorted(held, key=lambda e: (e.last_used, e.kind.value, e.id)):
        if total <= max_bytes:
            break
        if (e.kind, e.id) in keep:
            continue
        chosen.append(e)
        total -= e.size
    return tuple(chosen)
