"""The real node's peers, as its agent's prewarm sees them: a checkpoint cache of the runner's own.

kwok nodes have no agent and so no cache. For the real node's online job to prewarm from peers
as on a real cluster, the runner serves a peer for them: the cache server the agents run
(:mod:`nodeagent.cache.peerserver`, with its TokenReview check of the caller: the real node's
agent presents its account's token for the cache's audience, bound to its Node), on 127.0.0.1
behind a link emulator of :data:`RATE` bytes a second (a network between nodes),
published on kwok node ``node``'s GpuNode ``status.cache`` as that node's agent would publish
its own (and again every :data:`REPUBLISH_S`: a node deleted by a fault comes back without it).

The online job "trains": :meth:`PeerCache.checkpoint` writes a new checkpoint of
:data:`CHECKPOINT_BYTES` random bytes into the peer and answers its reference, pinned to its
sha256 (``ID@sha256:HEX``), for the job's pod template; the prewarm controller then asks the
real node to fetch it ahead of the job's next scale-up (docs/peer-cache.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from common import contract
from common.kubeclient import KubeClient
from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.identity import service_account_user
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.peerauth import TokenReviewVerifier
from nodeagent.cache.testing import PeerNode, random_file, start_peer
from tests.e2e.kube import ApiError, Kube

RATE = 32 << 20  # bytes a second from the peer to the node: an eighth of a second a checkpoint
CHECKPOINT_BYTES = 4 << 20
REPUBLISH_S = 10.0
AUDIENCE = "tidelease-peer-cache"


class PeerCache:
    """A peer cache on loopback, published as kwok node ``node``'s, in a thread of its own."""

    def __init__(
        self, work: Path, kubeconfig: Path, kube: Kube, *, node: str, namespace: str
    ) -> None:
        self.work, self.kubeconfig, self.kube = work, kubeconfig, kube
        self.node, self.namespace = node, namespace
        self.store = CacheStore(work / "store", max_bytes=1 << 30, reserve_bytes=0)
        self.checkpoints: list[str] = []  # ids held, oldest first
        self.publishes = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="soak-peer")
        self._thread.daemon = True
        self._peer: PeerNode | None = None
        self._kube: KubeClient | None = None
        self._stop = threading.Event()
        self._publisher = threading.Thread(target=self._republish, name="soak-peer-publish")
        self._publisher.daemon = True

    @property
    def url(self) -> str:
        assert self._peer is not None
        return self._peer.url

    def start(self) -> None:
        self._thread.start()
        self._call(self._start())
        self.publish()
        self._publisher.start()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self._call(self._close(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def checkpoint(self, job: str, step: int) -> str:
        """A new checkpoint of ``job`` at ``step`` in the peer; its pinned reference."""
        entry = EntryId(f"{job}.step-{step}")
        source = random_file(self.work / f"{entry}.bin", CHECKPOINT_BYTES)
        try:
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
            self._call(asyncio.to_thread(self.store.add_file, Kind.CHECKPOINT, entry, source))
        finally:
            source.unlink()
        self.checkpoints.append(entry)
        self.publish()
        return f"{entry}@sha256:{digest}"

    def publish(self) -> None:
        """The peer's endpoint and checkpoints on its node's GpuNode (gone: the next round)."""
        path = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}/{self.node}/status"
        cache = {"endpoint": self.url, "checkpoints": sorted(self.checkpoints), "images": []}
        try:
            self.kube.request(
                "PATCH",
                path,
                {"status": {"cache": cache}},
                content_type="application/merge-patch+json",
                timeout=5,
            )
            self.publishes += 1
        except (ApiError, OSError):  # the API server away, the node deleted: next round
            pass

    def _republish(self) -> None:
        while not self._stop.wait(REPUBLISH_S):
            self.publish()

    def _call(self, coro: Any, timeout: float = 60) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    async def _start(self) -> None:
        self._kube = await KubeClient.connect(self.kubeconfig)
        user = service_account_user(self.namespace, "tidelease-agent")
        verifier = TokenReviewVerifier(self._kube, audience=AUDIENCE, user=user)
        self._peer = await start_peer(self.store, verifier, rate=RATE)

    async def _close(self) -> None:
        if self._peer is not None:
            await self._peer.stop()
        if self._kube is not None:
            await self._kube.close()
