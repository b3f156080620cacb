"""Which peer sends which shard, and how big shards are. Pure.

The model (the paper's transfer-time model, plus a per-request cost): link ``u`` can start at
``start_s`` and sends a shard of ``b`` bytes in ``latency_s + b / rate``; shards on a link go one
after another, so the link finishes at ``start_s + sum of its shards' times``; the pull's makespan
is the latest finish over the links that send anything.

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

Reference: chaos III, eq. 1, Algorithm 2 and its 4/3 bound (docs/references.md).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
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


def makespan(queues: Mapping[str, Sequence[Shard]], links: Sequence[LinkModel]) -> float:
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


DESCENT_STARTS = 5  # choose_shard_size descends from this many of the best sizes it evaluated


@dataclass(frozen=True, slots=True)
class ShardSizeChoice:
    shard_bytes: int
    predicted_s: float
    reason: str
    evaluations: int = 0  # shard sizes whose assignment was computed to choose


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


def shard_size_bounds(
    total: int,
    links: Sequence[LinkModel],
    *,
    piece_size: int,
    overhead: float = 0.05,
    shards_per_link: int = 4,
) -> tuple[int, int]:
    """The sizes :func:`choose_shard_size` chooses among, (smallest, largest) in bytes: every
    multiple of the piece size in :func:`shard_size_window`, or, when that window is empty,
    every one from one piece to the whole file (one shard)."""
    low, high = shard_size_window(
        total, links, piece_size=piece_size, overhead=overhead, shards_per_link=shards_per_link
    )
    if low <= high:
        return low, high
    return piece_size, max(piece_size, math.ceil(total / piece_size) * piece_size)


def scan_candidates(
    total: int,
    links: Sequence[LinkModel],
    *,
    piece_size: int,
    overhead: float = 0.05,
    shards_per_link: int = 4,
) -> tuple[int, ...]:
    """The earlier rule's sizes (it scanned only these): the piece size times powers of two, plus
    the window's ends and the whole file, those inside the window (all of them when it is
    empty). :func:`choose_shard_size` still evaluates them, so it is never worse than the scan."""
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
    return tuple(inside or sorted(grid))


def predicted_makespan(
    total: int, links: Sequence[LinkModel], *, piece_size: int, shard_bytes: int
) -> float:
    """The puller's latency model for one shard size: the makespan of the optimal assignment
    (:func:`assign`) of ``total`` bytes cut into shards of ``shard_bytes`` (whole pieces)."""
    pieces = range(-(-total // piece_size))
    shards = cut_shards(
        pieces, size=total, piece_size=piece_size, shard_pieces=max(1, shard_bytes // piece_size)
    )
    return assign(shards, links).makespan_s


def bisect_shard_size(
    low: int, high: int, predict: Callable[[int], float]
) -> tuple[int, float, tuple[int, ...]]:
    """Chaos Algorithm 1, as written, over the integers ``[low, high]`` (shard sizes in pieces):
    probe the midpoint ``s = (low + high) // 2``; if its objective beats the best so far, keep
    it and go on among the smaller sizes (``high = s - 1``), otherwise among the larger ones
    (``low = s + 1``); stop when ``low > high``. Returns (best size, its objective, the sizes
    probed in order): at most ``floor(log2(high - low + 1)) + 1`` probes.

    It finds the best size when the objective increases with the size (the paper's eq. 13 for a
    fixed assignment); the makespan of a pull is not monotone in the size (see
    :func:`choose_shard_size`), so on its own the search can stop far from the best size."""
    if low > high:
        raise ValueError(f"empty range [{low}, {high}]")
    best_s, best = low, math.inf
    probes: list[int] = []
    while low <= high:
        s = (low + high) // 2
        theta = predict(s)
        probes.append(s)
        if theta < best:
            best_s, best = s, theta
            high = s - 1
        else:
            low = s + 1
    return best_s, best, tuple(probes)


def choose_shard_size(
    total: int,
    links: Sequence[LinkModel],
    *,
    piece_size: int,
    overhead: float = 0.05,
    shards_per_link: int = 4,
) -> ShardSizeChoice:
    """The shard size (a multiple of the piece size) for a pull of ``total`` bytes: the one
    among :func:`shard_size_bounds` whose optimal assignment predicts the smallest makespan
    (:func:`predicted_makespan`), as near as three cheap steps find it:

    1. chaos Algorithm 1 (:func:`bisect_shard_size`) over the bounds, in whole pieces;
    2. the earlier scan's sizes (:func:`scan_candidates`): the result is never worse than it;
    3. from each of the ``DESCENT_STARTS`` best sizes so far, a descent one piece at a time
       while a neighbouring size predicts better.

    The makespan is not unimodal in the size (the shard count jumps, and which link takes the
    short last shard changes), so neither the bisection nor the scan alone reaches the best size
    often; together, with the descents, they reach it in most cases and stay within a few per
    cent in the rest (docs/performance.md, "Shard-size choice", has the figures). Ties (within
    1e-9) go to the larger size: fewer requests.
    """
    if total <= 0:
        return ShardSizeChoice(piece_size, 0.0, "empty")
    low, high = shard_size_window(
        total, links, piece_size=piece_size, overhead=overhead, shards_per_link=shards_per_link
    )
    reason = "window" if low <= high else "no size meets both rules; best predicted"
    first, last = shard_size_bounds(
        total, links, piece_size=piece_size, overhead=overhead, shards_per_link=shards_per_link
    )
    known: dict[int, float] = {}  # pieces per shard -> predicted makespan

    def predict(k: int) -> float:
        if k not in known:
            known[k] = predicted_makespan(
                total, links, piece_size=piece_size, shard_bytes=k * piece_size
            )
        return known[k]

    def order(k: int) -> tuple[float, int]:
        return (predict(k), -k)

    lo, hi = first // piece_size, last // piece_size
    bisect_shard_size(lo, hi, predict)  # 1
    for s in scan_candidates(  # 2
        total, links, piece_size=piece_size, overhead=overhead, shards_per_link=shards_per_link
    ):
        predict(s // piece_size)
    for k in sorted(known, key=order)[:DESCENT_STARTS]:  # 3
        while True:
            better = [j for j in (k - 1, k + 1) if lo <= j <= hi and predict(j) < predict(k)]
            if not better:
                break
            k = min(better, key=order)
    least = min(known.values())
    best = max(k for k, t in known.items() if t <= least * (1 + 1e-9))  # ties: the larger
    return ShardSizeChoice(best * piece_size, predict(best), reason, len(known))


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
