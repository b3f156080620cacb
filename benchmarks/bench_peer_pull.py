"""Multi-peer checkpoint pull on loopback, and the cache server's single-stream throughput.

Peers are real cache servers (``nodeagent.cache.peerserver``, sendfile) in a separate process, each
behind a link emulator (``nodeagent.cache.testing.LinkEmulator``: a token bucket for the rate,
a delay on every request) of its own rate and latency. The puller runs in this process and
writes to a fresh cache each run. In the same run it measures:

* the puller (probe, shard size, earliest-completion assignment, work stealing): makespan of the
  transfer against the model optimum for the links as configured (the exact optimal assignment
  at the chosen shard size) and against the fluid bound (every link streaming from t=0), and
  the achieved rate as a fraction of the links' aggregate rate;
* baselines on the same links: the fastest peer alone, and an even split (the same shards dealt
  round-robin, no stealing);
* serving throughput for one stream from an unthrottled server: a large sparse file read and
  discarded; the same with sha256 of every byte off the event loop; and a whole pull (hash,
  write, fsync, publish) from that server.

Then, in the model alone (no transfer), the shard-size choice over ``--shard-sets`` random link
sets (issue 19): for the earlier scan over powers of two, chaos Algorithm 1 alone, and the
search the puller uses (``choose_shard_size``), the predicted makespan of the chosen size over
the best of every admissible size (brute force): median, p75, max, share exactly optimal, and
the time per choice.

    python -m benchmarks.bench_peer_pull [--size-mib 1024] [--serve-gib 2] [--dir DIR] [--smoke]
        [--shard-sets 500] [--model-only]

``--smoke``: the same runs at a tiny size (64 MiB checkpoint, 128 MiB sparse file, one run of
each, 20 link sets), in seconds: it checks that the benchmark still works, its figures mean
little. ``--model-only``: only the shard-size figures.

Targets (issue 7): makespan within 10 % of the optimum, >= 80 % of the aggregate rate,
>= 1 GB/s for one stream without hashing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import math
import multiprocessing
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import aiohttp

from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.manifest import Manifest, piece_count
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.testing import clone_entry, random_file, start_peer, write_token
from nodeagent.pulling.assignment import (
    Assignment,
    LinkModel,
    Shard,
    assign,
    bisect_shard_size,
    choose_shard_size,
    cut_shards,
    lower_bound,
    makespan,
    predicted_makespan,
    scan_candidates,
    shard_size_bounds,
)
from nodeagent.pulling.peers import Peer, StaticPeers
from nodeagent.pulling.puller import PullResult, PullSettings, bearer, pull

MIB = 1 << 20
PIECE = 4 * MIB
CKPT = EntryId("bench-job.step-1")
BIG = EntryId("bench-big")
# (rate MiB/s, request latency ms): different rates and latencies, ~470 MiB/s in all.
LINKS = [(40, 20.0), (80, 10.0), (150, 5.0), (200, 2.0)]


@dataclass(frozen=True)
class PeerSpec:
    rate: float | None
    latency_s: float


def _serve(root: Path, token_file: Path, specs: list[PeerSpec], pipe: Connection) -> None:
    """Child process: one cache server (+ link emulator) per spec, all sharing the seed entry."""

    async def main() -> None:
        seed = CacheStore(root / "seed", max_bytes=1 << 40, piece_size=PIECE)
        nodes = []
        for i, spec in enumerate(specs):
            store = CacheStore(root / f"peer{i}", max_bytes=1 << 40, piece_size=PIECE)
            for kind, entry in ((Kind.CHECKPOINT, CKPT), (Kind.CHECKPOINT, BIG)):
                if seed.has(kind, entry) and not store.has(kind, entry):
                    clone_entry(seed, kind, entry, store)
            nodes.append(
                await start_peer(store, token_file, rate=spec.rate, latency_s=spec.latency_s)
            )
        pipe.send([n.url for n in nodes])
        await asyncio.to_thread(pipe.recv)
        for n in nodes:
            await n.stop()

    asyncio.run(main())


# The sha256 of each entry the seed holds (run() fills it): the pulls are pinned to them.
DIGESTS: dict[EntryId, str] = {}


def sparse_entry(store: CacheStore, entry: EntryId, size: int) -> str:
    """A sparse file of zeros as a cache entry, its manifest computed without reading it; its
    sha256 (what a pull is pinned to)."""
    zero = hashlib.sha256(bytes(PIECE)).hexdigest()
    count = piece_count(size, PIECE)
    last = size - (count - 1) * PIECE
    pieces = (zero,) * (count - 1) + (hashlib.sha256(bytes(last)).hexdigest(),)
    whole = hashlib.sha256()
    block = bytes(min(size, 8 * MIB))
    for start in range(0, size, len(block) or 1):
        whole.update(block[: min(len(block), size - start)])
    tmp = store.temp_path(Kind.CHECKPOINT, entry)
    with open(tmp, "wb") as f:
        f.truncate(size)
    digest = whole.hexdigest()
    store.adopt(Manifest(Kind.CHECKPOINT, entry, size, PIECE, pieces, sha256=digest), tmp)
    return digest


def even_split(shards: Sequence[Shard], links: Sequence[LinkModel]) -> Assignment:
    queues = {link.name: tuple(shards[i :: len(links)]) for i, link in enumerate(links)}
    return Assignment(queues, {}, makespan(queues, links))


async def one_pull(
    root: Path, name: str, peers: list[Peer], headers: dict[str, str], **kw: object
) -> PullResult:
    dest = CacheStore(root / name, max_bytes=1 << 40, piece_size=PIECE)
    entry: EntryId = kw.pop("entry", CKPT)  # type: ignore[assignment]
    try:
        return await pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=entry,
            peers=StaticPeers(peers),
            headers=headers,
            digest=DIGESTS[entry],  # peers are not trusted for content
            **kw,  # type: ignore[arg-type]
        )
    finally:
        shutil.rmtree(root / name, ignore_errors=True)


async def stream(url: str, headers: dict[str, str], *, hashing: bool) -> tuple[int, float]:
    """Read one entry in one stream, discarding it (optionally hashing it in a thread)."""
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t = time.perf_counter()
        got = 0
        async with session.get(url, headers=headers) as resp:
            resp.raise_for_status()
            h = hashlib.sha256()
            pending: asyncio.Future[None] | None = None
            async for chunk in resp.content.iter_chunked(4 * MIB):
                got += len(chunk)
                if hashing:
                    if pending is not None:
                        await pending
                    pending = asyncio.ensure_future(asyncio.to_thread(h.update, chunk))
            if pending is not None:
                await pending
        return got, time.perf_counter() - t


def row(label: str, seconds: float, optimum: float, size: int, aggregate: float) -> str:
    rate = size / seconds / MIB
    return (
        f"| {label:<34} | {seconds:7.2f} | {optimum:7.2f} | {seconds / optimum:6.3f} "
        f"| {rate:7.0f} | {100 * rate * MIB / aggregate:5.1f} % |"
    )


async def run(args: argparse.Namespace, root: Path) -> None:
    token_file = root / "token"
    headers = bearer(write_token(token_file))
    size = args.size_mib * MIB
    seed = CacheStore(root / "seed", max_bytes=1 << 40, piece_size=PIECE)
    t = time.perf_counter()
    added = seed.add_file(Kind.CHECKPOINT, CKPT, random_file(root / "src.bin", size))
    assert added.sha256 is not None
    DIGESTS[CKPT] = added.sha256
    (root / "src.bin").unlink()
    DIGESTS[BIG] = sparse_entry(seed, BIG, int(args.serve_gib * (1 << 30)))
    # The peers' process opens the seed next: a cache directory is held by one process at a
    # time (a POSIX lock on <dir>/.lock, nodeagent/cache/cachestore.py), this one until it lets go.
    seed.close()
    print(f"# setup: {args.size_mib} MiB random checkpoint in {time.perf_counter() - t:.1f}s")

    specs = [PeerSpec(r * MIB, ms / 1000) for r, ms in LINKS] + [PeerSpec(None, 0.0)]
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(root, token_file, specs, child), daemon=True)
    proc.start()
    # The child has its own copy of its end now; with this one closed, the child's death ends
    # parent.recv (EOFError) instead of leaving it waiting for ever.
    child.close()
    try:
        try:
            urls = await asyncio.to_thread(parent.recv)
        except EOFError:
            await asyncio.to_thread(proc.join, 10)
            raise SystemExit(
                f"the peers' process ended (exit code {proc.exitcode}) before serving; "
                "its error is above"
            ) from None
        await measure(args, root, headers, size, urls)
    finally:
        with contextlib.suppress(OSError):  # the child is gone already
            parent.send("stop")
        await asyncio.to_thread(proc.join, 10)
        if proc.is_alive():
            proc.terminate()


async def measure(
    args: argparse.Namespace, root: Path, headers: dict[str, str], size: int, urls: list[str]
) -> None:
    peers = [Peer(f"peer{i}", url) for i, url in enumerate(urls[: len(LINKS)])]
    unthrottled = urls[len(LINKS)]
    true_links = [
        LinkModel(p.name, rate=r * MIB, latency_s=ms / 1000)
        for p, (r, ms) in zip(peers, LINKS, strict=True)
    ]
    aggregate = sum(link.rate for link in true_links)
    fastest = max(range(len(LINKS)), key=lambda i: LINKS[i][0])
    pieces = range(piece_count(size, PIECE))

    def optimum(shard_bytes: int, links: Sequence[LinkModel] = true_links) -> float:
        shards = cut_shards(pieces, size=size, piece_size=PIECE, shard_pieces=shard_bytes // PIECE)
        return assign(shards, links).makespan_s

    print(
        "# links: "
        + ", ".join(
            f"{p.name} {r} MiB/s {ms:g} ms" for p, (r, ms) in zip(peers, LINKS, strict=True)
        )
        + f"; aggregate {aggregate / MIB:.0f} MiB/s; fluid bound "
        f"{lower_bound(size, true_links):.2f}s for {size // MIB} MiB"
    )
    results: dict[str, list[tuple[float, float]]] = {}
    ours_runs: list[tuple[float, float]] = []  # (seconds, optimum at that run's shard size)
    for rep in range(args.repeats):
        ours = await one_pull(root, "dest", peers, headers)
        shard = ours.shard_bytes
        opt = optimum(shard)
        ours_runs.append((ours.transfer_s, opt))
        results.setdefault(f"earliest completion (shard {shard // MIB} MiB)", []).append(
            (ours.transfer_s, opt)
        )
        if rep == 0:
            print(
                f"# chosen shard {shard // MIB} MiB; plan "
                + ", ".join(f"{k}:{v}" for k, v in ours.plan.items())
                + "; probed "
                + ", ".join(
                    f"{k} {e.rate / MIB:.0f} MiB/s {1000 * e.latency_s:.1f} ms"
                    for k, e in ours.estimates.items()
                )
                + f"; predicted {ours.predicted_s:.2f}s"
            )
            print(
                "# bytes by source: "
                + ", ".join(f"{k} {v / MIB:.0f} MiB" for k, v in ours.bytes_by_source.items())
            )
        even = await one_pull(
            root,
            "dest",
            peers,
            headers,
            planner=even_split,
            settings=PullSettings(shard_bytes=shard, steal=False),
        )
        shards = cut_shards(pieces, size=size, piece_size=PIECE, shard_pieces=shard // PIECE)
        results.setdefault("even split (same shards)", []).append(
            (even.transfer_s, makespan(even_split(shards, true_links).queues, true_links))
        )
        single = await one_pull(root, "dest", [peers[fastest]], headers)
        results.setdefault(f"single source ({peers[fastest].name})", []).append(
            (single.transfer_s, optimum(single.shard_bytes, [true_links[fastest]]))
        )
    # The headline is the best run of ours against the optimum at that run's own shard size
    # (the runs may choose different shard sizes: each has its own row above).
    ours_s, best_opt = min(ours_runs)
    print()
    print(
        f"| run (best of {args.repeats})".ljust(35)
        + "| seconds | model s | ratio  | MiB/s   | of agg. |"
    )
    print("|" + "-" * 36 + "|---------|---------|--------|---------|---------|")
    for label, runs in results.items():
        seconds, model = min(runs)
        print(row(label, seconds, model, size, aggregate))
    print()
    print(
        f"ours vs optimum at its shard size: {ours_s / best_opt:.3f} (target <= 1.10); "
        f"vs fluid bound {ours_s / lower_bound(size, true_links):.3f}; "
        f"fraction of aggregate rate {size / ours_s / aggregate:.1%} (target >= 80 %)"
    )
    # Baselines against the optimum of all links, for the speed-up.
    for label, runs in results.items():
        seconds = min(s for s, _ in runs)
        print(f"  {label}: {seconds / best_opt:.2f}x the multi-link optimum")

    print()
    url = f"{unthrottled}/v1/checkpoints/{BIG}/data"
    big = int(args.serve_gib * (1 << 30))
    for hashing in (False, True):
        best = min(
            [await stream(url, headers, hashing=hashing) for _ in range(args.repeats)],
            key=lambda r: r[1],
        )
        got, seconds = best
        assert got == big, (got, big)
        print(
            f"serving, one stream, {got / (1 << 30):.1f} GiB sparse, "
            f"{'sha256 off-loop' if hashing else 'no hashing'}: {got / seconds / 1e9:.2f} GB/s"
        )
    whole = await one_pull(root, "dest", [Peer("unthrottled", unthrottled)], headers, entry=BIG)
    print(
        f"whole pull from one unthrottled peer ({big / (1 << 30):.1f} GiB: verify every piece, "
        f"write, fsync, publish): {big / whole.transfer_s / 1e9:.2f} GB/s transfer, "
        f"{big / whole.seconds / 1e9:.2f} GB/s end to end"
    )


def random_link_set(rng: random.Random) -> tuple[int, list[LinkModel], int]:
    """(bytes, links, piece size): 1-6 links of 10-1000 MiB/s (log-uniform), 0 or 0.1-50 ms
    per request, a quarter starting up to 0.5 s late; 16 MiB to 2 GiB, 1 or 4 MiB pieces (the
    same distribution as tests/unit/test_shard_search.py)."""

    def log_uniform(low: float, high: float) -> float:
        return math.exp(rng.uniform(math.log(low), math.log(high)))

    piece = rng.choice([MIB, 4 * MIB])
    total = max(1, int(log_uniform(16, 2048) * MIB) - rng.randrange(piece))
    links = [
        LinkModel(
            f"l{i}",
            rate=log_uniform(10, 1000) * MIB,
            latency_s=rng.choice([0.0, log_uniform(1e-4, 0.05)]),
            start_s=rng.choice([0.0, 0.0, 0.0, rng.uniform(0.0, 0.5)]),
        )
        for i in range(rng.randint(1, 6))
    ]
    return total, links, piece


def earlier_scan(total: int, links: Sequence[LinkModel], piece: int) -> float:
    """The rule before issue 19: the best of the scan's sizes (powers of two, window ends)."""
    return min(
        predicted_makespan(total, links, piece_size=piece, shard_bytes=s)
        for s in scan_candidates(total, links, piece_size=piece)
    )


def bisection_alone(total: int, links: Sequence[LinkModel], piece: int) -> float:
    first, last = shard_size_bounds(total, links, piece_size=piece)
    return bisect_shard_size(
        first // piece,
        last // piece,
        lambda k: predicted_makespan(total, links, piece_size=piece, shard_bytes=k * piece),
    )[1]


def the_search(total: int, links: Sequence[LinkModel], piece: int) -> float:
    return choose_shard_size(total, links, piece_size=piece).predicted_s


def shard_size_figures(sets: int, seed: int = 19) -> None:
    rng = random.Random(seed)
    cases = [random_link_set(rng) for _ in range(sets)]
    t = time.perf_counter()
    best = []
    for total, links, piece in cases:
        first, last = shard_size_bounds(total, links, piece_size=piece)
        best.append(
            min(
                predicted_makespan(total, links, piece_size=piece, shard_bytes=s)
                for s in range(first, last + 1, piece)
            )
        )
    brute_ms = 1000 * (time.perf_counter() - t) / sets
    print()
    print(
        f"# shard size, {sets} random link sets: predicted makespan of the chosen size over the "
        f"best of every admissible size (brute force, {brute_ms:.2f} ms per set)"
    )
    rules: list[tuple[str, Callable[[int, Sequence[LinkModel], int], float]]] = [
        ("earlier scan", earlier_scan),
        ("chaos Algorithm 1 alone", bisection_alone),
        ("search (choose_shard_size)", the_search),
    ]
    for label, rule in rules:
        t = time.perf_counter()
        got = [rule(*case) for case in cases]
        per_choice_ms = 1000 * (time.perf_counter() - t) / sets
        ratios = sorted(g / b for g, b in zip(got, best, strict=True))
        exact = sum(r <= 1 + 1e-9 for r in ratios) / sets
        print(
            f"shard size, {label}: median {statistics.median(ratios):.4f}, "
            f"p75 {ratios[(3 * sets) // 4]:.4f}, max {ratios[-1]:.4f}, "
            f"exact {exact:.0%}, {per_choice_ms:.2f} ms per choice"
        )


SMOKE = {"size_mib": 64, "serve_gib": 0.125, "repeats": 1, "shard_sets": 20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024, help="checkpoint size for the pulls")
    p.add_argument("--serve-gib", type=float, default=2.0, help="sparse file for throughput")
    p.add_argument("--repeats", type=int, default=2, help="runs of each; the best is shown")
    p.add_argument(
        "--dir",
        type=Path,
        default=Path("/dev/shm") if os.path.isdir("/dev/shm") else None,
        help="where the caches live (default: tmpfs when there is one)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, to check it still runs")
    p.add_argument("--shard-sets", type=int, default=500, help="random link sets, shard size")
    p.add_argument("--model-only", action="store_true", help="only the shard-size figures")
    args = p.parse_args()
    if args.smoke:  # the smoke sizes, unless given
        p.set_defaults(**SMOKE)
        args = p.parse_args()
    if not args.model_only:
        root = Path(tempfile.mkdtemp(prefix="bench-peer-", dir=args.dir))
        try:
            asyncio.run(run(args, root))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    shard_size_figures(args.shard_sets)


if __name__ == "__main__":
    main()
