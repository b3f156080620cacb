"""Pull an entry from several peers at once, verified, resumable, published atomically.

1. Ask the :class:`PeerSource` who holds the entry and each holder for its manifest. Peers are
   not trusted for content: a pull is pinned to the content's sha256 (``digest``), and only
   manifests that claim it are used (the one most holders offer first), or, without a digest,
   the origin's manifest is the trusted one and only holders offering the same pieces are used.
2. Open (or resume) the partial file: pieces verified by an earlier, interrupted pull are kept.
   The store checks the disk first and allocates the file (``NoSpace`` when it cannot).
3. Probe every holder (a 1-byte and a small range request) for request latency and rate.
4. Choose the shard size and assign the missing shards by earliest completion (``assignment``).
5. One worker per link sends its queue in order over a kept-alive connection; every piece is
   hashed and written in a thread as it arrives, and recorded once durable. After each shard the
   link's estimate is refreshed; a link that runs out of work steals the queued shard that would
   finish last elsewhere, if it would finish earlier on the idle link.
6. A link that fails (refused, reset, stalled) is dropped and its unfinished shards are assigned
   to the others by earliest completion, or to the origin when no peer is left. A piece whose
   hash does not match is fetched again, from another link when there is one; a link that sends
   bad data twice is dropped.
7. When every piece is verified, the whole file's sha256 is checked against the manifest's (so
   against ``digest``), and the file is fsynced and renamed to its final name. A file that does
   not match was verified against a forged manifest: it is dropped, and the pull starts again
   on the next manifest offered for the digest, from the holders that offered that one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from common.errors import InvalidInput, TideleaseError
from nodeagent.cache.cachestore import CacheStore, ContentMismatch, NoSpace, PartialPull
from nodeagent.cache.manifest import Manifest, parse_manifest, valid_digest
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.pulling.assignment import (
    Assignment,
    LinkModel,
    Shard,
    assign,
    choose_shard_size,
    cut_shards,
    steal,
)
from nodeagent.pulling.estimation import LinkEstimate, from_probe
from nodeagent.pulling.peers import Peer, PeerSource

log = logging.getLogger(__name__)

Planner = Callable[[Sequence[Shard], Sequence[LinkModel]], Assignment]
ORIGIN = "origin"


class PullFailed(TideleaseError):
    """No source could provide the entry."""


class _LinkFailed(Exception):
    """The link broke: connection refused, reset, stalled or answered nonsense."""


@dataclass(frozen=True, slots=True)
class PullSettings:
    probe_bytes: int = 4 << 20  # rate probe: a real piece up to twice this, else this much
    overhead: float = 0.05  # shard-size rule: request latency <= 5 % of a shard's time
    shards_per_link: int = 4  # shard-size rule: at least this many shards per link
    shard_bytes: int | None = None  # fixed shard size (a multiple of the piece size)
    connect_timeout_s: float = 5.0
    stall_timeout_s: float = 15.0  # no bytes for this long: the link is dead
    max_bad_shards: int = 2  # a link sending bad data this often is dropped
    max_piece_attempts: int = 5
    steal: bool = True

    def validate(self) -> list[str]:
        problems = []
        if self.probe_bytes < 2:
            problems.append("probe_bytes must be at least 2")
        if not 0 < self.overhead < 1:
            problems.append("overhead must be in (0, 1)")
        if self.shards_per_link < 1:
            problems.append("shards_per_link must be at least 1")
        if self.shard_bytes is not None and self.shard_bytes <= 0:
            problems.append("shard_bytes must be positive")
        return problems


@dataclass(frozen=True, slots=True)
class PullResult:
    manifest: Manifest
    seconds: float  # the whole pull, discovery to publication
    transfer_s: float  # from the first shard request to the last verified piece
    predicted_s: float  # the plan's makespan, from the probed estimates
    shard_bytes: int
    bytes_by_source: dict[str, int]
    resumed_pieces: int
    refetched_pieces: int
    dropped: tuple[str, ...]  # sources dropped, or not used for offering a forged manifest
    rejected: dict[str, int]  # pieces per source that failed verification
    plan: dict[str, int]  # shards planned per link
    estimates: dict[str, LinkEstimate]


@dataclass(slots=True)
class _Link:
    peer: Peer
    estimate: LinkEstimate
    queue: list[Shard] = field(default_factory=list)
    busy_until: float = 0.0
    bad_shards: int = 0
    rejected: int = 0
    alive: bool = True
    sent: int = 0

    @property
    def name(self) -> str:
        return self.peer.name

    def model(self, start_s: float = 0.0) -> LinkModel:
        return LinkModel(self.name, self.estimate.rate, self.estimate.latency_s, start_s)


def _url(peer: Peer, kind: Kind, entry: EntryId, what: str) -> str:
    return f"{peer.url}/v1/{kind.value}/{entry}/{what}"


class _Pull:
    """One pull's shared state; workers run on one event loop, so no locks are needed beyond
    the condition that wakes idle workers."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        headers: Callable[[], dict[str, str]],
        partial: PartialPull,
        settings: PullSettings,
        origin: Peer | None,
    ) -> None:
        self.session = session
        self.headers = headers
        self.partial = partial
        self.manifest = partial.manifest
        self.settings = settings
        self.origin = origin
        self.links: dict[str, _Link] = {}
        self.missing: set[int] = set(partial.missing)
        self.attempts: dict[int, int] = {}
        self.refetched = 0
        self.dropped: list[str] = []
        self.changed = asyncio.Condition()
        self.failure: Exception | None = None
        self.group: asyncio.TaskGroup | None = None
        self.t0 = time.monotonic()
        self.last_piece_at = self.t0

    def now(self) -> float:
        return time.monotonic() - self.t0

    # --- transfers ---

    async def _get(
        self, peer: Peer, start: int, length: int
    ) -> tuple[aiohttp.ClientResponse, float]:
        url = _url(peer, self.manifest.kind, self.manifest.id, "data")
        headers = {**self.headers(), "Range": f"bytes={start}-{start + length - 1}"}
        t = time.monotonic()
        try:
            resp = await self.session.get(url, headers=headers)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise _LinkFailed(f"{peer.name}: {e!r}") from e
        if resp.status != 206 or resp.content_length != length:
            resp.release()
            raise _LinkFailed(f"{peer.name}: HTTP {resp.status} for a {length}-byte range")
        return resp, time.monotonic() - t

    async def _timed_read(self, peer: Peer, offset: int, length: int) -> tuple[float, float]:
        """Read a range and drop it: (seconds to the first byte, seconds in all)."""
        t = time.monotonic()
        resp, first = await self._get(peer, offset, length)
        try:
            await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise _LinkFailed(f"{peer.name}: {e!r}") from e
        finally:
            resp.release()
        return first, time.monotonic() - t

    async def probe(self, peer: Peer, shard: Shard | None = None) -> _Link:
        """Time a 1-byte range (latency), then real pieces of about ``probe_bytes`` (rate),
        verified and kept like any other shard: the probe costs no extra bytes. Without pieces
        to spare, a range of ``probe_bytes`` from the end is timed and dropped."""
        size = self.manifest.size
        _, tiny = await self._timed_read(peer, 0, 1)
        link = _Link(peer, LinkEstimate(tiny, 1.0))
        if shard is not None:
            bad, first, total = await self.fetch(link, shard)
            length = shard.length
            if bad:  # left missing: planned like the rest, but counted against the link
                self.refetched += len(bad)
                link.bad_shards += 1
                link.rejected += len(bad)
        else:
            length = min(self.settings.probe_bytes, size)
            first, total = await self._timed_read(peer, size - length, length)
        link.estimate = from_probe(
            tiny_s=tiny, small_bytes=length, small_first_byte_s=first, small_total_s=total
        )
        return link

    async def fetch(self, link: _Link, shard: Shard) -> tuple[list[int], float, float]:
        """Fetch, verify and write one shard: (pieces that failed verification, seconds to the
        first byte, seconds in all). Pieces verified before a link failure are kept (recorded)
        before the failure is raised."""
        t = time.monotonic()
        resp, first = await self._get(link.peer, shard.offset, shard.length)
        writes: list[tuple[int, asyncio.Task[bool]]] = []
        broken: _LinkFailed | None = None
        try:
            for index in range(shard.first_piece, shard.first_piece + shard.pieces):
                _, length = self.manifest.piece_span(index)
                try:
                    data = await resp.content.readexactly(length)
                except (aiohttp.ClientError, TimeoutError, OSError, EOFError) as e:
                    broken = _LinkFailed(f"{link.name}: {e!r}")
                    break
                # Hash and write in a thread while the next piece arrives.
                task = asyncio.create_task(asyncio.to_thread(self.partial.write_piece, index, data))
                writes.append((index, task))
        finally:
            resp.release()
            results = await asyncio.gather(*(task for _, task in writes), return_exceptions=True)
        good = [i for (i, _), ok in zip(writes, results, strict=True) if ok is True]
        await asyncio.to_thread(self.partial.record, good)
        self.missing.difference_update(good)
        link.sent += sum(self.manifest.piece_span(i)[1] for i in good)
        self.last_piece_at = time.monotonic()
        for err in results:
            if isinstance(err, BaseException):
                raise err  # a local write failed: not the link's fault
        if broken is not None:
            raise broken
        return [i for i, _ in writes if i not in good], first, time.monotonic() - t

    # --- planning ---

    def alive(self) -> list[_Link]:
        return [link for link in self.links.values() if link.alive]

    def backlog(self, link: _Link) -> float:
        now = self.now()
        model = link.model()
        return max(link.busy_until, now) - now + sum(model.cost(s.length) for s in link.queue)

    def distribute(self, shards: Sequence[Shard], avoid: str | None = None) -> None:
        """Give ``shards`` to the live links by earliest completion, after their backlogs."""
        if not shards:
            return
        targets = [link for link in self.alive() if link.name != avoid] or self.alive()
        if not targets:
            return
        plan = assign(shards, [link.model(self.backlog(link)) for link in targets])
        for link in targets:
            link.queue.extend(plan.queues[link.name])

    def _stealable(self, link: _Link) -> tuple[str, Shard] | None:
        if not self.settings.steal:
            return None
        models = {name: other.model() for name, other in self.links.items() if other.alive}
        queues = {name: other.queue for name, other in self.links.items() if other.alive}
        busy = {name: other.busy_until for name, other in self.links.items()}
        return steal(link.model(), queues, models, self.now(), busy)

    def take(self, link: _Link) -> Shard | None:
        if link.queue:
            return link.queue.pop(0)
        moved = self._stealable(link)
        if moved is None:
            return None
        source, shard = moved
        self.links[source].queue.remove(shard)
        return shard

    async def drop(self, link: _Link, reason: str, unfinished: Sequence[Shard]) -> None:
        log.warning("pull %s: dropping %s: %s", self.manifest.id, link.name, reason)
        link.alive = False
        self.dropped.append(link.name)
        orphans = [*unfinished, *link.queue]
        link.queue.clear()
        if not self.alive() and self.origin is not None and ORIGIN not in self.links:
            await self.add_origin()
        if not self.alive():
            if self.missing:
                self.failure = PullFailed(f"{self.manifest.id}: every source failed ({reason})")
        else:
            self.distribute(orphans)
        async with self.changed:
            self.changed.notify_all()

    async def add_origin(self) -> None:
        assert self.origin is not None
        try:
            link = await self.probe(self.origin)
        except _LinkFailed as e:
            log.warning("pull %s: origin unusable: %s", self.manifest.id, e)
            return
        except NoSpace as e:
            self.failure = e
            return
        self.links[ORIGIN] = link
        assert self.group is not None
        self.group.create_task(self.worker(link))

    # --- workers ---

    def finished(self) -> bool:
        return not self.missing or self.failure is not None

    async def worker(self, link: _Link) -> None:
        while link.alive and not self.finished():
            shard = self.take(link)
            if shard is None:
                async with self.changed:
                    await self.changed.wait_for(
                        lambda: (
                            self.finished()
                            or not link.alive
                            or bool(link.queue)
                            or self._stealable(link) is not None
                        )
                    )
                continue
            link.busy_until = self.now() + link.model().cost(shard.length)
            try:
                bad, first, total = await self.fetch(link, shard)
                link.estimate = link.estimate.observe(shard.length, first, total)
            except _LinkFailed as e:
                span = range(shard.first_piece, shard.first_piece + shard.pieces)
                rest = [i for i in span if i in self.missing]
                await self.drop(link, str(e), self.cut(rest))
                return
            except NoSpace as e:  # the partial is gone: every worker stops
                self.failure = e
                async with self.changed:
                    self.changed.notify_all()
                return
            finally:
                link.busy_until = self.now()
            if bad:
                await self.refetch(link, bad)
            async with self.changed:
                self.changed.notify_all()

    def cut(self, pieces: Sequence[int]) -> tuple[Shard, ...]:
        return cut_shards(
            pieces,
            size=self.manifest.size,
            piece_size=self.manifest.piece_size,
            shard_pieces=max(1, len(pieces)),
        )

    async def refetch(self, link: _Link, bad: list[int]) -> None:
        self.refetched += len(bad)
        link.bad_shards += 1
        link.rejected += len(bad)
        log.warning(
            "pull %s: %d piece(s) from %s failed verification; fetching again",
            self.manifest.id,
            len(bad),
            link.name,
        )
        for i in bad:
            self.attempts[i] = self.attempts.get(i, 0) + 1
            if self.attempts[i] >= self.settings.max_piece_attempts:
                self.failure = PullFailed(f"{self.manifest.id}: piece {i} never verified")
                return
        if link.bad_shards >= self.settings.max_bad_shards and len(self.alive()) > 1:
            await self.drop(link, "sent data that failed verification", self.cut(bad))
        else:
            self.distribute(self.cut(bad), avoid=link.name)


async def _offers(
    session: aiohttp.ClientSession,
    headers: dict[str, str],
    sources: Sequence[Peer],
    kind: Kind,
    entry: EntryId,
) -> list[tuple[Peer, Manifest]]:
    """Each source's manifest of the entry, for the sources that give a valid one."""
    offers: list[tuple[Peer, Manifest]] = []
    for peer in sources:
        try:
            async with session.get(_url(peer, kind, entry, "manifest"), headers=headers) as resp:
                if resp.status != 200:
                    log.info("%s: no %s/%s (HTTP %d)", peer.name, kind.value, entry, resp.status)
                    continue
                got = parse_manifest(await resp.json())
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, InvalidInput) as e:
            log.info("%s: manifest of %s/%s unusable: %s", peer.name, kind.value, entry, e)
            continue
        if got.kind is kind and got.id == entry:
            offers.append((peer, got))
    return offers


def _same_pieces(a: Manifest, b: Manifest) -> bool:
    return (a.size, a.piece_size, a.pieces) == (b.size, b.piece_size, b.pieces)


def candidates(
    offers: Sequence[tuple[Peer, Manifest]], digest: str
) -> list[tuple[Manifest, list[Peer]]]:
    """The manifests that claim content ``digest``, each with the sources that offered it, the
    one most sources offered first (the first offered on ties). Pure."""
    groups: dict[Manifest, list[Peer]] = {}
    for peer, manifest in offers:
        if manifest.sha256 != digest:
            log.warning(
                "%s: its %s/%s has sha256 %s, not %s: not used",
                peer.name,
                manifest.kind.value,
                manifest.id,
                manifest.sha256,
                digest,
            )
            continue
        groups.setdefault(manifest, []).append(peer)
    return sorted(groups.items(), key=lambda group: -len(group[1]))


async def _trusted(
    session: aiohttp.ClientSession,
    headers: dict[str, str],
    holders: Sequence[Peer],
    origin: Peer | None,
    kind: Kind,
    entry: EntryId,
    digest: str | None,
) -> list[tuple[Manifest, list[Peer]]]:
    """The manifests to pull by, in order, each with the holders to pull it from."""
    what = f"{kind.value}/{entry}"
    if digest is None:  # the origin's manifest is the trusted one
        assert origin is not None
        offered = await _offers(session, headers, [origin], kind, entry)
        if not offered:
            raise PullFailed(f"the origin has no {what} (it is what vouches for the content)")
        trusted = offered[0][1]
        usable = []
        for peer, manifest in await _offers(session, headers, holders, kind, entry):
            if _same_pieces(manifest, trusted):
                usable.append(peer)
            else:
                log.warning("%s: its %s differs from the origin's: not used", peer.name, what)
        return [(trusted, usable)]
    found = candidates(await _offers(session, headers, holders, kind, entry), digest)
    if not found and origin is not None:
        found = [
            (m, [])
            for m, _ in candidates(await _offers(session, headers, [origin], kind, entry), digest)
        ]
    if not found:
        raise PullFailed(f"no source has {what} with sha256 {digest}")
    return found


async def pull(
    *,
    store: CacheStore,
    kind: Kind,
    entry: EntryId,
    peers: PeerSource,
    headers: dict[str, str] | Callable[[], dict[str, str]],
    origin: str | None = None,
    settings: PullSettings | None = None,
    planner: Planner = assign,
    ref: str | None = None,
    digest: str | None = None,
) -> PullResult:
    """Pull ``kind/entry`` into ``store`` from the peers holding it (the origin if none).

    Peers are not trusted for content: ``digest`` (the content's sha256, hex) pins what may be
    published; without it the ``origin``'s manifest is trusted instead, and with neither the
    pull is refused. ``headers`` (the agent's credential) may be a function, called for every
    request, so that a long pull presents the token the kubelet last rotated in. Raises
    :class:`PullFailed`, or :class:`NoSpace` when the cache's disk cannot take the entry and keep
    its reserve (or the manifest claims more than the cache could ever hold)."""
    settings = settings or PullSettings()
    problems = settings.validate()
    if digest is not None:
        digest = digest.lower()
        if not valid_digest(digest):
            problems.append(f"digest {digest!r} is not a sha256 (64 hex digits)")
    elif origin is None:
        problems.append(
            f"pulling {kind.value}/{entry} from peers needs the content's sha256 (or an origin "
            "whose manifest is trusted): peers are not trusted for content"
        )
    if problems:
        raise InvalidInput(problems)
    fixed = headers
    current: Callable[[], dict[str, str]] = fixed if callable(fixed) else lambda: fixed
    started = time.monotonic()
    holders = await peers.holders(kind, entry, ref=ref)
    origin_peer = Peer(ORIGIN, origin.rstrip("/")) if origin else None
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.stall_timeout_s
    )
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=4)
    # The bytes as stored: a server's FileResponse would otherwise send a sibling entry named
    # ``<id>.gz`` (or ``.br``) in place of ``<id>`` to a client that accepts that encoding.
    identity = {"Accept-Encoding": "identity"}
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, headers=identity, auto_decompress=False
    ) as session:
        found = await _trusted(session, current(), holders, origin_peer, kind, entry, digest)
        forged: list[str] = []
        no_space: NoSpace | None = None
        untrusted: list[str] = []
        for manifest, sources in found:
            try:
                partial = await asyncio.to_thread(store.begin_pull, manifest)
            except NoSpace as e:  # perhaps a manifest that claims an absurd size: try the next
                no_space = e
                continue
            try:
                return await _run(
                    session,
                    current,
                    partial,
                    sources,
                    origin_peer,
                    settings,
                    planner,
                    started,
                    untrusted,
                )
            except ContentMismatch as e:
                names = ", ".join(p.name for p in sources) or "none"
                log.warning("pull %s: %s (offered by %s)", entry, e, names)
                forged.append(f"{e} (offered by {names})")
                untrusted += [p.name for p in sources]
            finally:
                await asyncio.to_thread(partial.close)
    if no_space is not None and not forged:
        raise no_space
    raise PullFailed("; ".join(forged + ([str(no_space)] if no_space else [])))


async def _run(
    session: aiohttp.ClientSession,
    headers: Callable[[], dict[str, str]],
    partial: PartialPull,
    sources: list[Peer],
    origin: Peer | None,
    settings: PullSettings,
    planner: Planner,
    started: float,
    untrusted: Sequence[str] = (),
) -> PullResult:
    manifest = partial.manifest
    use_origin = origin if all(p.name != ORIGIN for p in sources) else None
    state = _Pull(session, headers, partial, settings, use_origin)
    resumed = len(partial.done)
    if resumed:
        log.info("pull %s: resuming with %d verified piece(s)", manifest.id, resumed)
    # Each link probes with its own run of missing pieces from the end (about probe_bytes),
    # when the entry is large enough to spare them.
    per_probe = max(1, settings.probe_bytes // manifest.piece_size)
    spare: tuple[Shard, ...] = ()
    if len(state.missing) >= 4 * per_probe * len(sources):
        tail = sorted(state.missing)[-per_probe * len(sources) :]
        spare = cut_shards(
            tail, size=manifest.size, piece_size=manifest.piece_size, shard_pieces=per_probe
        )
    probes = await asyncio.gather(
        *(state.probe(p, spare[i] if i < len(spare) else None) for i, p in enumerate(sources)),
        return_exceptions=True,
    )
    for peer, probed in zip(sources, probes, strict=True):
        if isinstance(probed, _Link):
            state.links[peer.name] = probed
        elif isinstance(probed, _LinkFailed):
            log.warning("pull %s: %s unusable: %s", manifest.id, peer.name, probed)
            state.dropped.append(peer.name)
        else:
            raise probed
    if not state.links and state.missing:
        if state.origin is None:
            raise PullFailed(f"{manifest.id}: no usable source")
        try:
            state.links[ORIGIN] = await state.probe(state.origin)
        except _LinkFailed as e:
            raise PullFailed(f"{manifest.id}: no usable peer, and the origin failed: {e}") from e
    missing_bytes = sum(manifest.piece_span(i)[1] for i in state.missing)
    models = [link.model() for link in state.links.values()]
    if settings.shard_bytes is not None:
        shard_bytes = max(manifest.piece_size, settings.shard_bytes)
    elif models:
        shard_bytes = choose_shard_size(
            missing_bytes,
            models,
            piece_size=manifest.piece_size,
            overhead=settings.overhead,
            shards_per_link=settings.shards_per_link,
        ).shard_bytes
    else:
        shard_bytes = manifest.piece_size
    shards = cut_shards(
        state.missing,
        size=manifest.size,
        piece_size=manifest.piece_size,
        shard_pieces=max(1, shard_bytes // manifest.piece_size),
    )
    plan = planner(shards, models) if models and shards else None
    if plan is not None:
        for name, queue in plan.queues.items():
            state.links[name].queue.extend(queue)
        log.info(
            "pull %s: %d bytes in %d shards of %d over %d link(s), predicted %.2fs",
            manifest.id,
            missing_bytes,
            len(shards),
            shard_bytes,
            len(models),
            plan.makespan_s,
        )
    t_transfer = time.monotonic()
    state.t0 = t_transfer
    async with asyncio.TaskGroup() as group:
        state.group = group
        for link in list(state.links.values()):
            group.create_task(state.worker(link))
    if state.failure is not None:
        raise state.failure
    if state.missing:
        raise PullFailed(f"{manifest.id}: {len(state.missing)} piece(s) could not be fetched")
    transfer_s = state.last_piece_at - t_transfer
    published = await asyncio.to_thread(partial.commit)
    return PullResult(
        manifest=published,
        seconds=time.monotonic() - started,
        transfer_s=max(0.0, transfer_s),
        predicted_s=plan.makespan_s if plan is not None else 0.0,
        shard_bytes=shard_bytes,
        bytes_by_source={name: link.sent for name, link in state.links.items()},
        resumed_pieces=resumed,
        refetched_pieces=state.refetched,
        dropped=(*untrusted, *state.dropped),
        rejected={name: link.rejected for name, link in state.links.items() if link.rejected},
        plan={name: len(q) for name, q in (plan.queues.items() if plan else ())},
        estimates={name: link.estimate for name, link in state.links.items()},
    )


def bearer(token: bytes | str) -> dict[str, str]:
    value = token.decode() if isinstance(token, bytes) else token
    return {"Authorization": f"Bearer {value.strip()}"}


def describe(result: PullResult) -> dict[str, Any]:
    """A JSON-friendly summary (the command's output)."""
    return {
        "id": result.manifest.id,
        "kind": result.manifest.kind.value,
        "bytes": result.manifest.size,
        "seconds": round(result.seconds, 3),
        "transferSeconds": round(result.transfer_s, 3),
        "predictedSeconds": round(result.predicted_s, 3),
        "shardBytes": result.shard_bytes,
        "bytesBySource": result.bytes_by_source,
        "resumedPieces": result.resumed_pieces,
        "refetchedPieces": result.refetched_pieces,
        "dropped": list(result.dropped),
        "sha256": result.manifest.sha256,
    }
