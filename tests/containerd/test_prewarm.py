"""The node agent's prewarming on a real containerd and a loopback peer cache.

An image the runtime already holds (app:v1, imported by hack/containerd.sh) is Done through
ImageStatus; an image no registry serves fails fast and is reported Failed with the runtime's
reason; a checkpoint a peer serves is fetched into the agent's cache, reported Done and then
listed in the inventory the agent publishes. Nothing starts before notBefore; the same
directive again fetches nothing; a restarted agent keeps what it reported Done; a cleared
directive clears the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.errors import TideleaseError
from common.prewarmwire import Directive, ItemStatus
from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.testing import PeerNode, start_peer, write_token
from nodeagent.cri.client import GrpcRuntime
from nodeagent.prewarm import (
    PeerCheckpoints,
    PrewarmAgentSettings,
    Prewarmer,
    run_prewarm,
)
from nodeagent.pulling.peers import Peer, StaticPeers
from nodeagent.pulling.puller import bearer
from nodeagent.testing import MemoryPrewarmNode
from tests.containerd.conftest import ABSENT, APP_V1
from tests.polling import eventually

pytestmark = pytest.mark.containerd

CKPT = "recsys-ckpt-42"
LEASE = "ml/recsys"
CKPT_BYTES = 3 << 20
# Bytes known ahead, so that the directives can pin them as pod authors do: peers are not
# trusted for content (ID@sha256:..., common/checkpointref.py).
CKPT_DATA = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(CKPT_BYTES // 32))
CKPT_REF = f"{CKPT}@sha256:{hashlib.sha256(CKPT_DATA).hexdigest()}"


@dataclass
class Rig:
    node: MemoryPrewarmNode
    prewarmer: Prewarmer
    store: CacheStore
    peer: PeerNode
    checkpoints: PeerCheckpoints


@contextlib.asynccontextmanager
async def rig(runtime: GrpcRuntime | None, tmp_path: Path) -> AsyncIterator[Rig]:
    token_file = tmp_path / "token"
    token = write_token(token_file)
    peer_store = CacheStore(tmp_path / "peer", max_bytes=1 << 30)
    (tmp_path / "ckpt.bin").write_bytes(CKPT_DATA)
    peer_store.add_file(Kind.CHECKPOINT, EntryId(CKPT), tmp_path / "ckpt.bin")
    peer = await start_peer(peer_store, token_file)
    store = CacheStore(tmp_path / "agent", max_bytes=1 << 30)
    checkpoints = PeerCheckpoints(
        store, StaticPeers([Peer("peer-1", peer.url)]), lambda: bearer(token)
    )
    prewarmer = Prewarmer(
        settings=PrewarmAgentSettings(node="gpu-1", concurrency=2, retries=0),
        images=runtime,
        checkpoints=checkpoints,
    )
    node = MemoryPrewarmNode()
    task = asyncio.create_task(run_prewarm(node=node, prewarmer=prewarmer))
    try:
        yield Rig(node, prewarmer, store, peer, checkpoints)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await peer.stop()


def directive(images: tuple[str, ...], *, not_before: float, deadline: float) -> Directive:
    return Directive(LEASE, "Standby", images, (CKPT_REF,), not_before, deadline, 82.0)


async def settled(node: MemoryPrewarmNode, count: int) -> dict[tuple[str, str, str], ItemStatus]:
    async def done() -> dict[tuple[str, str, str], ItemStatus] | None:
        items = node.items
        finished = [i for i in items.values() if i.state != "Pending"]
        return items if len(items) == count and len(finished) == count else None

    return await eventually(done, within_s=40)


async def test_prewarm_pulls_images_through_cri_and_the_checkpoint_from_a_peer(
    runtime: GrpcRuntime, tmp_path: Path
) -> None:
    async with rig(runtime, tmp_path) as r:
        start = time.time()
        not_before = start + 1.0
        deadline = start + 120.0
        r.node.set([directive((APP_V1, ABSENT), not_before=not_before, deadline=deadline)])

        async def waiting() -> bool:
            items = r.node.items
            return len(items) == 3 and all(
                i.state == "Pending" and i.reason == "waiting for notBefore" for i in items.values()
            )

        await eventually(waiting, within_s=5)
        assert not r.store.has(Kind.CHECKPOINT, EntryId(CKPT))

        items = await settled(r.node, 3)
        image = items[(LEASE, "image", APP_V1)]
        assert image.state == "Done"
        assert image.reason == "already present"
        absent = items[(LEASE, "image", ABSENT)]
        assert absent.state == "Failed"
        assert absent.reason  # the runtime's reason for the failed pull
        assert "PullImage" in absent.reason or "pull" in absent.reason.lower()
        ckpt = items[(LEASE, "checkpoint", CKPT_REF)]
        assert ckpt.state == "Done", ckpt.reason
        assert ckpt.reason.startswith(f"fetched {CKPT_BYTES} bytes")
        assert ckpt.finished_at is not None
        assert ckpt.finished_at >= not_before
        assert ckpt.seconds is not None
        assert ckpt.seconds >= 0
        assert ckpt.lead_s == pytest.approx(deadline - ckpt.finished_at)
        # Fetched for real, and the inventory the agent publishes follows.
        assert r.store.has(Kind.CHECKPOINT, EntryId(CKPT))
        held = r.store.data_path(Kind.CHECKPOINT, EntryId(CKPT))
        assert held is not None
        assert held.stat().st_size == CKPT_BYTES
        inventory = r.prewarmer.inventory(r.store.inventory)()
        assert inventory["checkpoints"] == [CKPT]
        assert APP_V1 in inventory["images"]
        assert ABSENT not in inventory["images"]
        # The agent's own status publishes carry the same report.
        assert r.prewarmer.status() == r.node.reports[-1]

        # The same directive again: nothing is fetched again, nothing reported anew.
        reports = len(r.node.reports)
        r.node.set([directive((APP_V1, ABSENT), not_before=not_before, deadline=deadline)])
        await asyncio.sleep(0.5)
        assert len(r.node.reports) == reports

        # The scale-up happened: the controller cleared the directive; so is the report.
        r.node.set([])

        async def cleared() -> bool:
            return r.node.reports[-1] == {"items": []}

        await eventually(cleared, within_s=5)


async def test_a_restarted_agent_keeps_what_it_reported_done(
    runtime: GrpcRuntime, tmp_path: Path
) -> None:
    now = time.time()
    d = directive((APP_V1,), not_before=now - 5, deadline=now + 60)
    stored = (
        ItemStatus(LEASE, "checkpoint", CKPT_REF, "Done", "fetched", 2.0, now - 1, d.deadline),
        ItemStatus(LEASE, "image", APP_V1, "Failed", "was down", None, now - 1, d.deadline),
    )
    async with rig(runtime, tmp_path) as r:
        r.node.set([d], stored)
        items = await settled(r.node, 2)
        # Done is kept as reported (not fetched again: the agent's cache is empty); Failed is
        # tried again, and the image is there.
        assert items[(LEASE, "checkpoint", CKPT_REF)].to_json() == stored[0].to_json()
        assert not r.store.has(Kind.CHECKPOINT, EntryId(CKPT))
        assert items[(LEASE, "image", APP_V1)].state == "Done"


async def test_without_a_runtime_images_fail_and_checkpoints_still_come(tmp_path: Path) -> None:
    now = time.time()
    async with rig(None, tmp_path) as r:
        r.node.set([directive((APP_V1,), not_before=now, deadline=now + 60)])
        items = await settled(r.node, 2)
        assert items[(LEASE, "image", APP_V1)].state == "Failed"
        assert "--cri-endpoint" in items[(LEASE, "image", APP_V1)].reason
        assert items[(LEASE, "checkpoint", CKPT_REF)].state == "Done"


async def test_a_checkpoint_not_pinned_by_digest_is_not_taken_from_peers(tmp_path: Path) -> None:
    """Without ID@sha256:... (and no trusted origin), a peer's bytes cannot be checked: the
    item fails saying so, and nothing is stored."""
    now = time.time()
    async with rig(None, tmp_path) as r:
        r.node.set([Directive(LEASE, "Standby", (), (CKPT,), now, now + 60, 82.0)])
        items = await settled(r.node, 1)
        unpinned = items[(LEASE, "checkpoint", CKPT)]
        assert unpinned.state == "Failed"
        assert "not trusted for content" in unpinned.reason
        assert not r.store.has(Kind.CHECKPOINT, EntryId(CKPT))


async def test_two_leases_wanting_one_checkpoint_share_one_pull(tmp_path: Path) -> None:
    now = time.time()
    async with rig(None, tmp_path) as r:
        other = Directive("ml/ranking", "Standby", (), (CKPT_REF,), now, now + 60, 82.0)
        r.node.set([directive((), not_before=now, deadline=now + 60), other])
        items = await settled(r.node, 2)
        # retries=0: before, the second pull found the entry "already being pulled" and failed
        assert items[(LEASE, "checkpoint", CKPT_REF)].state == "Done"
        assert items[("ml/ranking", "checkpoint", CKPT_REF)].state == "Done"
        assert r.store.has(Kind.CHECKPOINT, EntryId(CKPT))


async def test_a_shared_pull_is_cancelled_once_no_directive_waits(tmp_path: Path) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    pulls: list[str] = []

    async def slow_pull(checkpoint: str) -> str:
        pulls.append(checkpoint)
        started.set()
        await release.wait()
        return "fetched"

    checkpoints = PeerCheckpoints(
        CacheStore(tmp_path / "agent", max_bytes=1 << 20), StaticPeers([]), dict
    )
    checkpoints._pull = slow_pull  # type: ignore[method-assign]
    first = asyncio.create_task(checkpoints.fetch(CKPT))
    second = asyncio.create_task(checkpoints.fetch(CKPT))
    await started.wait()
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    release.set()
    assert await second == "fetched"  # the other directive still got it
    assert pulls == [CKPT]  # one pull for both
    # Now one waiter that leaves: the pull is cancelled with it.
    release.clear()
    started.clear()
    lone = asyncio.create_task(checkpoints.fetch(CKPT))
    await started.wait()
    (shared, _) = checkpoints._pulls[CKPT]
    lone.cancel()
    await asyncio.gather(lone, return_exceptions=True)
    await asyncio.sleep(0)
    assert shared.cancelled()
    assert CKPT not in checkpoints._pulls


class SlowCheckpoints:
    """Checkpoints that take a while, counting how many are fetched at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.fetched: list[str] = []

    def has(self, checkpoint: str) -> bool:
        return checkpoint in self.fetched

    async def fetch(self, checkpoint: str) -> str:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.2)
            if checkpoint.startswith("bad"):
                raise TideleaseError("no source has it")
            self.fetched.append(checkpoint)
            return "fetched"
        finally:
            self.running -= 1


async def test_concurrency_is_bounded_and_failures_are_retried_then_reported() -> None:
    slow = SlowCheckpoints()
    prewarmer = Prewarmer(
        settings=PrewarmAgentSettings(node="gpu-1", concurrency=2, retries=1, retry_s=0.1),
        images=None,
        checkpoints=slow,
    )
    node = MemoryPrewarmNode()
    task = asyncio.create_task(run_prewarm(node=node, prewarmer=prewarmer))
    try:
        now = time.time()
        names = ("c1", "c2", "c3", "c4", "bad-1")
        node.set([Directive(LEASE, "Lent", (), names, now, now + 60, 10.0)])
        items = await settled(node, 5)
        assert slow.most == 2
        assert sorted(slow.fetched) == ["c1", "c2", "c3", "c4"]
        bad = items[(LEASE, "checkpoint", "bad-1")]
        assert bad.state == "Failed"
        assert bad.reason == "no source has it"
        retried = [r for r in node.reports for i in r["items"] if "attempt 1 failed" in i["reason"]]
        assert retried
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
