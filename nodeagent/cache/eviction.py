"""Which entries to evict to keep the cache under its size bound, or to keep its filesystem's
reserve free: abandoned partial pulls first (oldest progress first), then complete entries,
least recently used first; and which partial pulls have been left too long to keep for a
resume. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from nodeagent.cache.naming import EntryId, Kind

# A partial pull with no progress for this long is dropped at start rather than resumed.
DEFAULT_PARTIAL_TTL_S = 24 * 3600.0
# Bytes the cache leaves free on its filesystem, whatever its size bound says.
DEFAULT_RESERVE_BYTES = 1 << 30


def size_refusal(*, size: int, max_bytes: int, max_entry_bytes: int) -> str | None:
    """Why an entry that claims ``size`` bytes cannot be taken whatever is evicted, or None.
    Asked before anything is evicted for it: a manifest is a peer's claim, and one that claims
    more than the cache may ever hold must not empty the cache first (the filesystem's side is
    :func:`disk_shortfall` against what eviction could free)."""
    if size > max_entry_bytes:
        return f"claims {size} bytes, more than the largest entry allowed ({max_entry_bytes})"
    if size > max_bytes:
        return f"claims {size} bytes, more than the whole cache holds ({max_bytes})"
    return None


def disk_shortfall(*, free: int, need: int, reserve: int) -> int:
    """The bytes to free before ``need`` more can be written with ``reserve`` left free of the
    ``free`` there are (zero or less: it fits)."""
    return need + reserve - free


def disk_bound(*, held: int, incoming: int, shortfall: int) -> int:
    """The size bound under which :func:`choose_room` frees ``shortfall`` bytes of the ``held``
    (entries and abandoned partials) when ``incoming`` bytes are to arrive."""
    return held + incoming - shortfall


@dataclass(frozen=True, slots=True)
class EntryUse:
    kind: Kind
    id: EntryId
    size: int
    last_used: float


@dataclass(frozen=True, slots=True)
class PartialUse:
    """A partial pull on disk that no pull in this process is working on."""

    kind: Kind
    id: EntryId
    size: int  # bytes allocated on disk (the data file is sparse) plus its log
    last_progress: float  # mtime of its log (of its data file when it has no log)


class Room(NamedTuple):
    """What to delete to make room: abandoned partial pulls, then complete entries."""

    partials: tuple[PartialUse, ...]
    entries: tuple[EntryUse, ...]


def _oldest_first(p: PartialUse) -> tuple[float, str, str]:
    return (p.last_progress, p.kind.value, p.id)


def choose_room(
    entries: Iterable[EntryUse],
    partials: Iterable[PartialUse],
    *,
    max_bytes: int,
    incoming: int = 0,
    keep: frozenset[tuple[Kind, EntryId]] = frozenset(),
) -> Room:
    """What to delete so that complete entries, abandoned partial pulls and ``incoming`` bytes
    fit in ``max_bytes``. Abandoned partials count against the bound and go first, least recent
    progress first; only when dropping them all is not enough are entries evicted (least
    recently used first, ``keep`` never; see :func:`choose_evictions`)."""
    held = list(entries)
    abandoned = list(partials)
    total = sum(e.size for e in held) + sum(p.size for p in abandoned) + incoming
    dropped: list[PartialUse] = []
    for p in sorted(abandoned, key=_oldest_first):
        if total <= max_bytes:
            break
        dropped.append(p)
        total -= p.size
    left = sum(p.size for p in abandoned) - sum(p.size for p in dropped)
    victims = choose_evictions(held, max_bytes=max_bytes, incoming=incoming + left, keep=keep)
    return Room(tuple(dropped), victims)


def expired_partials(
    partials: Iterable[PartialUse], *, now: float, ttl_s: float
) -> tuple[PartialUse, ...]:
    """The partial pulls with no progress for more than ``ttl_s`` seconds, oldest first: too
    old to be worth resuming."""
    return tuple(sorted((p for p in partials if now - p.last_progress > ttl_s), key=_oldest_first))


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
