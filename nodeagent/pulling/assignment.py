"""Which peer sends which shard, and how big shards are. Pure.

The model (chaos III, eq. 1 with a per-request cost): link ``u`` can start at ``start_s`` and
sends a shard of ``b`` bytes in ``latency_s + b / rate``; shards on a link go one after another,
so the link finishes at ``start_s + sum of its shards' times``; the pull's makespan is the latest
finish over the links that send anything.

**Earliest completion is optimal for equal shards.** With every shard taking ``t_u`` on link
``u``, the k-th shard a link sends cannot finish before ``a_u + k * t_u``: the possible finishing
times are the slots ``{a_u + k * t_u : k >= 1}``, a link's used slots are a prefix of its own,
and any assignment of K shards uses K distinct slots, so its makespan is at least the K-th
smallest slot. Giving each shard to the link where it would finish earliest takes exactly the K
smallest slots (each link's slots increase), so it reaches that bound: optimal, not only within
the 4/3 bound the paper quotes for its greedy. A file rarely divides evenly, so one shard is
shorter: :func:`assign` tries the short shard on each link (it raises that link's start) and keeps
the best, which is again exact. Shards of arbitrary sizes (a resumed pull's gaps) go longest
first to the earliest finish, a heuristic.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LinkModel:
    """A peer as the assignment sees it."""

    name: str
    rate: float  # bytes per second
    latency_s: float = 0.0  # per request: time to first byte
    start_s: float = 0.0  # when it can begin (connection setup, work already queued)

    def cost(self, length: int) -> float:
        return self.latency_s + length / self.rate


@dataclass(frozen=True, slots=True)
class Shard:
    """A run of whole pieces: bytes ``[offset, offset + length)``."""

    first_piece: int
    pieces: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Assignment:
    queues: dict[str, tuple[Shard, ...]]  # per link, in sending order
    finish_s: dict[str, float]  # per link that sends anything
    makespan_s: float


def cut_shards(
    missing: Iterable[int], *, size: int, piece_size: int, shard_pieces: int
) -> tuple[Shard, ...]:
    """Shards of at most ``shard_pieces`` pieces over the runs of consecutive missing pieces."""
    if shard_pieces < 1:
        raise ValueError("shard_pieces must be at least 1")
    shards: list[Shard] = []
    run: list[int] = []

    def flush() -> None:
        for i in range(0, len(run), shard_pieces):
            first, n = run[i], len(run[i : i + shard_pieces])
            offset = first * piece_size
            end = min(size, (first + n) * piece_size)
            shards.append(Shard(first, n, offset, end - offset))
        run.clear()

    for piece in sorted(set(missing)):
        if run and piece != run[-1] + 1:
            flush()
        run.append(piece)
    flush()
    return tuple(shards)


def makespan(queues: dict[str, Sequence[Shard]], links: Sequence[LinkModel]) -> float:
    """Latest finish over the links that send anything (0 for nothing to send)."""
    by_name = {link.name: link for link in links}
    finishes = [
        by_name[name].start_s + sum(by_name[name].cost(s.length) for s in shards)
        for name, shards in queues.items()
        if shards
    ]
    return max(finishes, default=0.0)


def _earliest_completion(
    shards: Sequence[Shard], links: Sequence[LinkModel], loads: list[float], used: list[bool]
) -> list[list[Shard]]:
    """Give each shard, in order, to the link where it would finish first (ties: lower index).
    ``loads`` and ``used`` are updated in place."""
    queues: list[list[Shard]] = [[] for _ in links]
    if not shards:
        return queues
    if all(s.length == shards[0].length for s in shards):
        length = shards[0].length
        heap = [(loads[i] + link.cost(length), i) for i, link in enumerate(links)]
        heapq.heapify(heap)
        for shard in shards:
            finish, i = heapq.heappop(heap)
            queues[i].append(shard)
            loads[i], used[i] = finish, True
            heapq.heappush(heap, (finish + links[i].cost(length), i))
        return queues
    for shard in shards:
        i = min(range(len(links)), key=lambda j: (loads[j] + links[j].cost(shard.length), j))
        queues[i].append(shard)
        loads[i] += links[i].cost(shard.length)
        used[i] = True
    return queues


def _result(
    links: Sequence[LinkModel], queues: list[list[Shard]], loads: list[float], used: list[bool]
) -> Assignment:
    finish = {link.name: loads[i] for i, link in enumerate(links) if used[i]}
    return Assignment(
        queues={link.name: tuple(queues[i]) for i, link in enumerate(links)},
        finish_s=finish,
        makespan_s=max(finish.values(), default=0.0),
    )


def assign(shards: Sequence[Shard], links: Sequence[LinkModel]) -> Assignment:
    """Assign every shard to a link, minimising the makespan (exactly, when all shards but one
    have the same length; see the module's docstring)."""
    if not links:
        raise ValueError("no links to assign to")
    if any(link.rate <= 0 or not math.isfinite(link.rate) for link in links):
        raise ValueError("every link needs a positive, finite rate")
    lengths = sorted({s.length for s in shards})
    full = [s for s in shards if s.length == lengths[-1]] if lengths else []
    short = [s for s in shards if lengths and s.length != lengths[-1]]
    if len(lengths) > 2 or len(short) > 1:
        ordered = sorted(shards, key=lambda s: (-s.length, s.offset))
        loads = [link.start_s for link in links]
        used = [False] * len(links)
        return _result(links, _earliest_completion(ordered, links, loads, used), loads, used)
    if not short:
        loads = [link.start_s for link in links]
        used = [False] * len(links)
        return _result(links, _earliest_completion(full, links, loads, used), loads, used)
    best: Assignment | None = None
    for host in range(len(links)):  # the short shard on each link in turn
        loads = [link.start_s for link in links]
        used = [False] * len(links)
        loads[host] += links[host].cost(short[0].length)
        used[host] = True
        queues = _earliest_completion(full, links, loads, used)
        queues[host].append(short[0])  # sent last: the full shards keep their slots
        candidate = _result(links, queues, loads, used)
        if best is None or candidate.makespan_s < best.makespan_s:
            best = candidate
    assert best is not None
    return best


def lower_bound(total: int, links: Sequence[LinkModel]) -> float:
    """No pull of ``total`` bytes can be faster than all links streaming at full rate from their
    start, paying one request latency each (the fluid bound)."""
    # Earliest time T with sum over links of rate * (T - start - latency)^+ >= total.
    order = sorted(links, key=lambda link: link.start_s + link.latency_s)
    rate = 0.0
    weighted = 0.0
    for i, link in enumerate(order):
        rate += link.rate
        weighted += link.rate * (link.start_s + link.latency_s)
        t = (total + weighted) / rate
        nxt = order[i + 1].start_s + order[i + 1].latency_s if i + 1 < len(order) else math.inf
        if t <= nxt:
            return t
    return math.inf


@dataclass(frozen=True, slots=True)
class ShardSizeChoice:
    shard_bytes: int
    predicted_s: float
    reason: str


def shard_size_window(
    total: int,
    links: Sequence[LinkModel],
    *,
    piece_size: int,
    overhead: float = 0.05,
    shards_per_link: int = 4,
) -> tuple[int, int]:
    """(smallest, largest) shard size the rule allows, in whole pieces.

    Smallest: a request's latency stays under ``overhead`` of the shard's transfer time on every
    link (``s >= latency * rate / overhead``, the bandwidth-delay product over the overhead).
    Largest: at least ``shards_per_link`` shards per link, so the last shards can balance the
    links' finishing times (the imbalance is at most one shard's time).
    """

    def pieces_up(b: float) -> int:
        return max(piece_size, math.ceil(b / piece_size) * piece_size)

    low = pieces_up(max(link.latency_s * link.rate for link in links) / overhead)
    high = max(piece_size, (total // (shards_per_link * len(links))) // piece_size * piece_size)
    return low, high


def choose_shard_size(
    total: int,
    links: Sequence[LinkModel],
    *,
    piece_size: int,
    overhead: float = 0.05,
    shards_per_link: int = 4,
) -> ShardSizeChoice:
    """The shard size (a multiple of the piece size) for a pull of ``total`` bytes.

    Candidates are the piece size times powers of two, plus the rule's window ends; within the
    window of :func:`shard_size_window` (or among all candidates when the window is empty: a
    small file or links with a large bandwidth-delay product), the one whose optimal assignment
    (:func:`assign`) has the smallest predicted makespan wins, larger on ties. Each evaluation is
    exact and cheap, so a scan replaces the paper's binary search over s.
    """
    if total <= 0:
        return ShardSizeChoice(piece_size, 0.0, "empty")
    low, high = shard_size_window(
        total, links, piece_size=piece_size, overhead=overhead, shards_per_link=shards_per_link
    )
    whole = max(piece_size, math.ceil(total / piece_size) * piece_size)  # one shard
    grid = {min(low, whole), min(high, whole), whole}
    s = piece_size
    while s < total:
        grid.add(s)
        s *= 2
    inside = sorted(s for s in grid if low <= s <= high)
    reason = "window" if inside else "no size meets both rules; best predicted"
    candidates = inside or sorted(grid)
    pieces = range(-(-total // piece_size))
    best: ShardSizeChoice | None = None
    for s in candidates:
        shards = cut_shards(pieces, size=total, piece_size=piece_size, shard_pieces=s // piece_size)
        predicted = assign(shards, links).makespan_s
        if best is None or predicted <= best.predicted_s * (1 + 1e-9):
            best = ShardSizeChoice(s, predicted, reason)
    assert best is not None
    return best


def steal(
    idle: LinkModel,
    queues: dict[str, list[Shard]],
    links: dict[str, LinkModel],
    now_s: float,
    busy_until: dict[str, float],
) -> tuple[str, Shard] | None:
    """Work stealing for an idle link (estimates are never exact): the queued shard that would
    finish last where it is moves to ``idle`` if it would finish earlier there. Returns (link it
    leaves, shard) or None."""
    worst: tuple[float, str] | None = None
    for name, queue in queues.items():
        if name == idle.name or not queue:
            continue
        link = links[name]
        finish = max(busy_until.get(name, now_s), now_s) + sum(link.cost(s.length) for s in queue)
        if worst is None or finish > worst[0]:
            worst = (finish, name)
    if worst is None:
        return None
    finish, name = worst
    shard = queues[name][-1]
    if now_s + idle.start_s + idle.cost(shard.length) < finish:
        return name, shard
    return None
