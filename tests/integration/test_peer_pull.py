"""The puller against real cache servers on loopback, behind emulated links: several peers,
a peer killed mid-pull, a tampered peer, an interrupted pull resumed, the origin fallback, the
final name never showing a partial file, and peers that poison bytes or forge manifests."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from common.errors import InvalidInput
from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.manifest import Manifest
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.testing import (
    PeerNode,
    clone_entry,
    random_file,
    start_peer,
    write_token,
)
from nodeagent.pulling.assignment import Assignment, LinkModel, Shard, assign
from nodeagent.pulling.peers import Peer, StaticPeers
from nodeagent.pulling.puller import PullFailed, PullSettings, bearer, pull

MIB = 1 << 20
PIECE = 256 << 10
CKPT = EntryId("job-a.step-1200")


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.token_file = tmp / "token"
        self.headers = bearer(write_token(self.token_file))
        self.peers: list[PeerNode] = []
        self.source = random_file(tmp / "source.bin", 24 * MIB + 12345)
        self.seed = self.store("seed")
        self.manifest = self.seed.add_file(Kind.CHECKPOINT, CKPT, self.source)
        self.digest = hashlib.sha256(self.source.read_bytes()).hexdigest()

    def store(self, name: str, max_bytes: int = 1 << 34) -> CacheStore:
        return CacheStore(self.tmp / name, max_bytes=max_bytes, piece_size=PIECE)

    async def peer(
        self, name: str, rate: float, latency_s: float = 0.002, *, copy: bool = False
    ) -> PeerNode:
        store = self.store(name)
        if copy:
            store.add_file(Kind.CHECKPOINT, CKPT, self.source)
        else:
            clone_entry(self.seed, Kind.CHECKPOINT, CKPT, store)
        node = await start_peer(store, self.token_file, rate=rate, latency_s=latency_s)
        self.peers.append(node)
        return node

    def sources(self, nodes: Sequence[PeerNode]) -> StaticPeers:
        return StaticPeers(Peer(f"peer{i}", n.url) for i, n in enumerate(nodes))

    def pulled_digest(self, store: CacheStore) -> str:
        path = store.data_path(Kind.CHECKPOINT, CKPT)
        assert path is not None
        return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        for p in r.peers:
            await p.stop()


async def test_pull_from_three_peers_uses_all_and_verifies(rig: Rig) -> None:
    nodes = [await rig.peer(f"p{i}", rate=r * MIB) for i, r in enumerate([20, 40, 80])]
    dest = rig.store("dest")
    # 1 MiB shards: 24 of them, enough for the slowest link to be worth a share.
    result = await pull(
        store=dest,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources(nodes),
        headers=rig.headers,
        digest=rig.digest,
        settings=PullSettings(shard_bytes=MIB),
    )
    assert rig.pulled_digest(dest) == rig.digest
    assert dest.inventory()["checkpoints"] == [CKPT]
    assert all(b > 0 for b in result.bytes_by_source.values()), result.bytes_by_source
    assert sum(result.bytes_by_source.values()) == rig.manifest.size
    # The fastest link carries the most.
    assert result.bytes_by_source["peer2"] > result.bytes_by_source["peer0"]
    assert not list(dest.data_dir(Kind.CHECKPOINT).glob(".partial-*"))


async def test_peer_killed_mid_pull_completes_from_others(rig: Rig) -> None:
    nodes = [await rig.peer(f"p{i}", rate=r * MIB) for i, r in enumerate([30, 30, 30])]
    dest = rig.store("dest")
    task = asyncio.create_task(
        pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources(nodes),
            headers=rig.headers,
            digest=rig.digest,
            settings=PullSettings(shard_bytes=2 * MIB),
        )
    )
    await asyncio.sleep(0.15)  # probes done, transfers under way
    assert not task.done()
    assert nodes[0].link is not None
    await nodes[0].link.kill()
    await nodes[0].runner.cleanup()
    result = await asyncio.wait_for(task, 60)
    assert result.dropped == ("peer0",)
    assert rig.pulled_digest(dest) == rig.digest
    assert result.bytes_by_source["peer1"] + result.bytes_by_source["peer2"] > 0.6 * (
        rig.manifest.size
    )


async def test_tampered_shard_detected_and_fetched_again(rig: Rig) -> None:
    good = await rig.peer("good", rate=40 * MIB)
    bad = await rig.peer("bad", rate=40 * MIB, copy=True)
    path = bad.store.data_path(Kind.CHECKPOINT, CKPT)
    assert path is not None
    # Flip bytes in every third piece, behind the manifest's back.
    for offset in range(7, rig.manifest.size, 3 * PIECE):
        overwrite(path, offset, b"\xffX\x00")
    dest = rig.store("dest")
    result = await pull(
        store=dest,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources([good, bad]),
        headers=rig.headers,
        digest=rig.digest,
        settings=PullSettings(shard_bytes=MIB),
    )
    assert result.refetched_pieces >= 1
    assert rig.pulled_digest(dest) == rig.digest


async def test_tampered_only_source_fails_without_publishing(rig: Rig) -> None:
    bad = await rig.peer("bad", rate=200 * MIB, copy=True)
    path = bad.store.data_path(Kind.CHECKPOINT, CKPT)
    assert path is not None
    overwrite(path, MIB, b"tampered")
    dest = rig.store("dest")
    with pytest.raises(PullFailed, match="never verified"):
        await pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources([bad]),
            headers=rig.headers,
            digest=rig.digest,
        )
    assert dest.data_path(Kind.CHECKPOINT, CKPT) is None
    assert not (dest.data_dir(Kind.CHECKPOINT) / CKPT).exists()


async def test_interrupted_pull_resumes_with_verified_pieces(rig: Rig) -> None:
    nodes = [await rig.peer(f"p{i}", rate=20 * MIB) for i in range(2)]
    dest = rig.store("dest")
    settings = PullSettings(shard_bytes=MIB)
    task = asyncio.create_task(
        pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources(nodes),
            headers=rig.headers,
            digest=rig.digest,
            settings=settings,
        )
    )
    log = dest.data_dir(Kind.CHECKPOINT) / f".partial-{CKPT}.log"
    # Cancel once some pieces are verified, however slow the machine: the pull
    # itself takes at least 0.6 s at the peers' 40 MiB/s together.
    deadline = asyncio.get_running_loop().time() + 20
    while not (log.exists() and log.read_text().split()):
        assert not task.done(), "the pull ended before any piece was logged"
        assert asyncio.get_running_loop().time() < deadline, "no piece verified in 20 s"
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (dest.data_dir(Kind.CHECKPOINT) / CKPT).exists()
    kept = [int(i) for i in log.read_text().split()]
    assert kept
    kept_bytes = sum(rig.manifest.piece_span(i)[1] for i in kept)
    # A new store over the same directory: as after an agent restart.
    again = rig.store("dest")
    result = await pull(
        store=again,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources(nodes),
        headers=rig.headers,
        digest=rig.digest,
        settings=settings,
    )
    assert result.resumed_pieces == len(kept)
    assert sum(result.bytes_by_source.values()) == rig.manifest.size - kept_bytes
    assert rig.pulled_digest(again) == rig.digest


async def test_falls_back_to_origin_when_no_peer_holds_it(rig: Rig) -> None:
    origin = await rig.peer("origin", rate=100 * MIB)
    empty = await start_peer(rig.store("empty"), rig.token_file, rate=100 * MIB)
    rig.peers.append(empty)
    dest = rig.store("dest")
    result = await pull(
        store=dest,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=StaticPeers([Peer("empty", empty.url)]),  # says it has it, answers 404
        headers=rig.headers,
        origin=origin.url,  # no digest: the origin's manifest is the trusted one
    )
    assert result.bytes_by_source == {"origin": rig.manifest.size}
    assert rig.pulled_digest(dest) == rig.digest


async def test_all_peers_die_then_origin_finishes(rig: Rig) -> None:
    origin = await rig.peer("origin", rate=60 * MIB)
    only = await rig.peer("only", rate=30 * MIB)
    dest = rig.store("dest")
    task = asyncio.create_task(
        pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources([only]),
            headers=rig.headers,
            origin=origin.url,  # trusted; the peer offers the same pieces, so it is used
            settings=PullSettings(shard_bytes=MIB),
        )
    )
    await asyncio.sleep(0.2)
    assert only.link is not None
    await only.link.kill()
    await only.runner.cleanup()
    result = await asyncio.wait_for(task, 60)
    assert result.dropped == ("peer0",)
    assert result.bytes_by_source["origin"] > 0
    assert rig.pulled_digest(dest) == rig.digest


async def test_final_name_never_shows_a_partial_file(rig: Rig) -> None:
    nodes = [await rig.peer(f"p{i}", rate=60 * MIB) for i in range(2)]
    dest = rig.store("dest")
    final = dest.data_dir(Kind.CHECKPOINT) / CKPT
    manifest = dest.root / "checkpoints" / "manifests" / f"{CKPT}.json"
    seen: list[str] = []
    stop = threading.Event()

    def look() -> bool:
        """One look at the final name; True once the complete file is there."""
        try:
            st = os.stat(final)
        except FileNotFoundError:
            if manifest.exists():
                seen.append("manifest without data")
            return False
        if st.st_size != rig.manifest.size:
            seen.append(f"size {st.st_size}")
            return False
        digest = hashlib.sha256(final.read_bytes()).hexdigest()
        seen.append("complete" if digest == rig.digest else "wrong content")
        return True

    def watch() -> None:
        while not stop.is_set():
            if look():
                return
        # One more look after the pull returned: on a loaded machine this thread may not have
        # run at all meanwhile, and must then see the published file rather than nothing.
        look()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        await pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources(nodes),
            headers=rig.headers,
            digest=rig.digest,
            settings=PullSettings(shard_bytes=MIB),
        )
    finally:
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.to_thread(watcher.join)
    assert seen == ["complete"]


async def test_even_split_planner_is_pluggable(rig: Rig) -> None:
    nodes = [await rig.peer(f"p{i}", rate=r * MIB) for i, r in enumerate([20, 80])]
    dest = rig.store("dest")

    def even(shards: Sequence[Shard], links: Sequence[LinkModel]) -> Assignment:
        plan = assign(shards, links)
        queues = {link.name: tuple(shards[i :: len(links)]) for i, link in enumerate(links)}
        return Assignment(queues, plan.finish_s, plan.makespan_s)

    planner: Callable[[Sequence[Shard], Sequence[LinkModel]], Assignment] = even
    result = await pull(
        store=dest,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources(nodes),
        headers=rig.headers,
        digest=rig.digest,
        planner=planner,
        settings=PullSettings(steal=False, shard_bytes=MIB),
    )
    assert result.bytes_by_source["peer0"] == pytest.approx(
        result.bytes_by_source["peer1"], rel=0.1
    )
    assert rig.pulled_digest(dest) == rig.digest


def test_manifest_type_is_frozen() -> None:
    assert Manifest.__dataclass_params__.frozen  # type: ignore[attr-defined]


async def test_no_usable_peer_and_an_unreachable_origin_is_a_pull_failure(rig: Rig) -> None:
    """The holders give the manifest but none can send data, and the origin does not answer:
    the pull fails with :class:`PullFailed` (what callers handle), not the puller's internal
    link error."""
    broken = await rig.peer("broken", rate=100 * MIB, copy=True)
    path = broken.store.data_path(Kind.CHECKPOINT, CKPT)
    assert path is not None
    os.truncate(path, 0)  # the manifest is still served; every range is refused
    gone = await rig.peer("gone", rate=100 * MIB)
    await gone.stop()
    rig.peers.remove(gone)
    dest = rig.store("dest")
    with pytest.raises(PullFailed, match="origin"):
        await pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources([broken]),
            headers=rig.headers,
            digest=rig.digest,
            origin=gone.url,
        )
    assert dest.data_path(Kind.CHECKPOINT, CKPT) is None


async def test_an_entry_named_like_a_compressed_sibling_does_not_stand_in(rig: Rig) -> None:
    """The server's FileResponse serves ``<file>.gz`` in place of ``<file>`` to a client that
    accepts gzip, and a cache may well hold a checkpoint ``x`` and another ``x.gz``. The puller
    asks for the bytes as they are (``Accept-Encoding: identity``), so it gets ``x``."""
    peer = await rig.peer("p0", rate=100 * MIB)
    sibling = random_file(rig.tmp / "other.bin", 3 * MIB)
    peer.store.add_file(Kind.CHECKPOINT, EntryId(f"{CKPT}.gz"), sibling)
    dest = rig.store("dest")
    result = await pull(
        store=dest,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources([peer]),
        headers=rig.headers,
        digest=rig.digest,
    )
    assert result.dropped == ()
    assert rig.pulled_digest(dest) == rig.digest


async def forger(rig: Rig, name: str, *, claim: str | None) -> PeerNode:
    """A peer whose entry is other bytes, under a manifest of those bytes' pieces that claims
    content ``claim`` (the real digest: a forged manifest; None: honest about other bytes)."""
    store = rig.store(name)
    other = random_file(rig.tmp / f"{name}.bin", 4 * MIB)
    real = store.add_file(Kind.CHECKPOINT, CKPT, other)
    forged = dataclasses.replace(real, sha256=claim)
    tmp = store.temp_path(Kind.CHECKPOINT, CKPT)
    shutil.copyfile(other, tmp)
    store.adopt(forged, tmp)
    node = await start_peer(store, rig.token_file, rate=200 * MIB)
    rig.peers.append(node)
    return node


async def test_a_forged_manifest_is_not_committed_and_an_honest_peer_completes(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The forger is asked first and its manifest claims the right digest, so its pieces verify;
    the whole file does not: it is dropped, and the pull starts again from the honest peer."""
    bad = await forger(rig, "forger", claim=rig.digest)
    good = await rig.peer("good", rate=200 * MIB)
    dest = rig.store("dest")
    result = await pull(
        store=dest,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources([bad, good]),
        headers=rig.headers,
        digest=rig.digest,
    )
    assert "forged manifest" in caplog.text
    assert rig.pulled_digest(dest) == rig.digest
    assert result.manifest == rig.manifest
    assert result.dropped == ("peer0",)
    assert result.bytes_by_source == {"peer1": rig.manifest.size}
    assert sorted(p.name for p in dest.data_dir(Kind.CHECKPOINT).iterdir()) == [CKPT]


async def test_a_forged_manifest_alone_fails_the_pull_and_leaves_nothing(rig: Rig) -> None:
    bad = await forger(rig, "forger", claim=rig.digest)
    dest = rig.store("dest")
    with pytest.raises(PullFailed, match="forged manifest"):
        await pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources([bad]),
            headers=rig.headers,
            digest=rig.digest,
        )
    assert dest.data_path(Kind.CHECKPOINT, CKPT) is None
    assert list(dest.data_dir(Kind.CHECKPOINT).iterdir()) == []
    assert dest.inventory()["checkpoints"] == []


async def test_a_manifest_of_other_content_is_not_used(rig: Rig) -> None:
    other = await forger(rig, "other", claim=None)  # its own, true digest: not the one asked
    good = await rig.peer("good", rate=200 * MIB)
    dest = rig.store("dest")
    with pytest.raises(PullFailed, match=f"no source has checkpoints/{CKPT} with sha256"):
        await pull(
            store=dest,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources([other]),
            headers=rig.headers,
            digest=rig.digest,
        )
    result = await pull(
        store=dest,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources([other, good]),
        headers=rig.headers,
        digest=rig.digest,
    )
    assert result.bytes_by_source == {"peer1": rig.manifest.size}
    assert rig.pulled_digest(dest) == rig.digest


async def test_a_peer_poisoning_one_piece_is_counted_and_the_honest_peer_completes(
    rig: Rig,
) -> None:
    good = await rig.peer("good", rate=40 * MIB)
    bad = await rig.peer("bad", rate=40 * MIB, copy=True)
    path = bad.store.data_path(Kind.CHECKPOINT, CKPT)
    assert path is not None
    overwrite(path, rig.manifest.size - 100, b"poison")  # one piece, the last
    dest = rig.store("dest")

    def all_to_the_poisoner(shards: Sequence[Shard], links: Sequence[LinkModel]) -> Assignment:
        plan = assign(shards, links)
        return Assignment({"peer0": (), "peer1": tuple(shards)}, plan.finish_s, plan.makespan_s)

    result = await pull(
        store=dest,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources([good, bad]),
        headers=rig.headers,
        digest=rig.digest,
        planner=all_to_the_poisoner,
        settings=PullSettings(shard_bytes=MIB, steal=False),
    )
    assert result.rejected == {"peer1": 1}  # counted against the peer that sent it
    assert result.refetched_pieces == 1
    assert (
        result.bytes_by_source["peer0"] == rig.manifest.piece_span(len(rig.manifest.pieces) - 1)[1]
    )
    assert rig.pulled_digest(dest) == rig.digest


async def test_a_pull_trusting_peers_alone_is_refused(rig: Rig) -> None:
    peer = await rig.peer("p0", rate=200 * MIB)
    with pytest.raises(InvalidInput, match="peers are not trusted for content"):
        await pull(
            store=rig.store("dest"),
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=rig.sources([peer]),
            headers=rig.headers,
        )
