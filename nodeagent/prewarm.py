"""The node agent's side of prewarming: carry out this node's ``GpuNode.spec.prewarm``.

The prewarm controller (:mod:`extender.prewarm.controller`) writes a directive per GpuLease whose
scale-up this node prepares for: images to pull through the node's CRI runtime, checkpoints to
fetch from peers into the node's cache, not before ``notBefore``. The agent watches its own
GpuNode, and once an item's time has come fetches it (at most ``concurrency`` at a time, a
failed item retried ``retries`` times), and reports every item in ``status.prewarm.items``:
``Pending`` (waiting, queued or fetching), ``Done`` or ``Failed``, with the reason, the seconds
it took and when it finished. The cache inventory published on the GpuNode then lists what was
fetched: checkpoints through the cache store, images pulled through CRI through
:meth:`Prewarmer.inventory`, so the controller sees a warm node.

Idempotent: an item already present (ImageStatus, the cache's manifest) is Done at once; a
restarted agent takes back the Done items it reported for the same directive. Errors are
reported on the item, never raised. Every runtime, cache and API call is asynchronous (the
puller hashes and writes in threads), so the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from common import contract
from common.checkpointref import parse_checkpoint_ref
from common.errors import NotFound, TideleaseError
from common.kubeclient import KubeClient
from common.prewarmwire import (
    Directive,
    ItemKind,
    ItemState,
    ItemStatus,
    parse_directives,
    parse_items,
)
from common.timefmt import microtime
from nodeagent.cri.runtime import ImageInfo

if TYPE_CHECKING:
    from nodeagent.cache.cachestore import CacheStore
    from nodeagent.pulling.command import AgentCache
    from nodeagent.pulling.peers import PeerSource
    from nodeagent.pulling.puller import PullSettings

log = logging.getLogger(__name__)

_GPN = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
Key = tuple[str, ItemKind, str]  # lease, kind, name


@dataclass(frozen=True, slots=True)
class PrewarmAgentSettings:
    node: str
    concurrency: int = 2  # items fetched at once
    retries: int = 2  # a failed item is tried again this many times
    retry_s: float = 15.0
    recheck_s: float = 300.0  # images pulled are checked this often to be still present

    def validate(self) -> list[str]:
        problems = []
        if self.concurrency < 1:
            problems.append("prewarm concurrency must be at least 1")
        if self.retries < 0 or self.retry_s < 0 or self.recheck_s <= 0:
            problems.append("prewarm retries and retry_s must be >= 0, recheck_s positive")
        return problems


# --- what the agent uses ---


class ImageRuntime(Protocol):
    """The part of :class:`~nodeagent.cri.runtime.Runtime` prewarming uses."""

    async def image_status(self, image: str) -> ImageInfo | None: ...

    async def pull_image(self, image: str) -> str: ...


class Checkpoints(Protocol):
    def has(self, checkpoint: str) -> bool: ...

    async def fetch(self, checkpoint: str) -> str:
        """Fetch into the node's cache; a summary for the report. Raises TideleaseError."""
        ...


class PeerCheckpoints:
    """Checkpoints pulled from the peers that publish them (docs/peer-cache.md) into the
    node's cache store, presenting the agent's projected token for the cache's audience
    (re-read for every request: the kubelet rotates it)."""

    def __init__(
        self,
        store: CacheStore,
        peers: PeerSource,
        headers: Callable[[], dict[str, str]],
        *,
        origin: str | None = None,
        settings: PullSettings | None = None,
    ) -> None:
        self.store, self.peers, self.headers = store, peers, headers
        self.origin, self.settings = origin, settings
        # One pull per checkpoint, however many directives want it (the store admits one pull
        # of an entry at a time): later callers wait for it. Cancelled once no one waits.
        self._pulls: dict[str, tuple[asyncio.Task[str], list[int]]] = {}

    def has(self, checkpoint: str) -> bool:
        from nodeagent.cache.naming import Kind, parse_id

        ref = parse_checkpoint_ref(checkpoint)
        entry = parse_id(ref.id) if ref is not None else None
        return entry is not None and self.store.has(Kind.CHECKPOINT, entry)

    async def fetch(self, checkpoint: str) -> str:
        shared = self._pulls.get(checkpoint)
        if shared is None:
            task = asyncio.create_task(self._pull(checkpoint), name=f"pull {checkpoint}")
            shared = self._pulls[checkpoint] = (task, [0])
            task.add_done_callback(lambda t: self._forget(checkpoint, t))
        task, waiters = shared
        waiters[0] += 1
        try:
            return await asyncio.shield(task)
        finally:
            waiters[0] -= 1
            if waiters[0] == 0 and not task.done():
                task.cancel()  # every directive that wanted it is gone

    def _forget(self, checkpoint: str, task: asyncio.Task[str]) -> None:
        self._pulls.pop(checkpoint, None)
        if not task.cancelled():
            task.exception()  # retrieved: its waiters may all have left before it failed

    async def _pull(self, checkpoint: str) -> str:
        from common.errors import InvalidInput
        from nodeagent.cache.naming import Kind, parse_id
        from nodeagent.pulling.puller import pull

        ref = parse_checkpoint_ref(checkpoint)
        entry = parse_id(ref.id) if ref is not None else None
        if ref is None or entry is None:
            raise InvalidInput(f"{checkpoint!r} is not a valid checkpoint id (ID or ID@sha256:HEX)")
        # Pinned by the pod's annotation (ID@sha256:...), or else trusted from the origin:
        # peers alone are not trusted for content, and the pull says so.
        result = await pull(
            store=self.store,
            kind=Kind.CHECKPOINT,
            entry=entry,
            peers=self.peers,
            headers=self.headers,  # called per request: the token the kubelet last rotated in
            origin=self.origin,
            settings=self.settings,
            digest=ref.sha256,
        )
        sources = ", ".join(f"{k} {v}" for k, v in sorted(result.bytes_by_source.items()))
        return f"fetched {result.manifest.size} bytes in {result.seconds:.2f} s ({sources})"


class PrewarmNode(Protocol):
    """The node's GpuNode: its directives (and the items it reported), and the report."""

    def watch(self) -> AsyncIterator[tuple[tuple[Directive, ...], tuple[ItemStatus, ...]]]:
        """The directives and reported items on every change, until cancelled."""
        ...

    async def report(self, prewarm: dict[str, Any]) -> None:
        """Write ``status.prewarm``."""
        ...


class KubePrewarmNode:
    def __init__(self, kube: KubeClient, node: str) -> None:
        self._kube, self._node = kube, node

    async def watch(self) -> AsyncIterator[tuple[tuple[Directive, ...], tuple[ItemStatus, ...]]]:
        query = {"fieldSelector": f"metadata.name={self._node}"}
        async for event, obj in self._kube.list_watch(_GPN, query):
            if event == "SYNCED":
                continue
            if event == "DELETED":
                yield (), ()
                continue
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            yield parse_directives(spec.get("prewarm")), parse_items(status.get("prewarm"))

    async def report(self, prewarm: dict[str, Any]) -> None:
        await self._kube.json(
            "PATCH",
            f"{_GPN}/{self._node}/status",
            body={"status": {"prewarm": prewarm}},
            content_type="application/merge-patch+json",
        )


# --- the work ---


@dataclass
class _Item:
    status: ItemStatus
    not_before: float
    attempts: int = 0
    next_try: float = 0.0
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Prewarmer:
    def __init__(
        self,
        *,
        settings: PrewarmAgentSettings,
        images: ImageRuntime | None,
        checkpoints: Checkpoints | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.images, self.checkpoints = settings, images, checkpoints
        self.clock = clock
        self._items: dict[Key, _Item] = {}
        self._present: frozenset[str] = frozenset()  # images pulled (or found) through CRI
        self._sem = asyncio.Semaphore(settings.concurrency)
        self.wake = asyncio.Event()
        self.dirty = False

    # --- views for the agent ---

    def status(self) -> dict[str, Any]:
        """``status.prewarm`` as it is now."""
        items = sorted(self._items.values(), key=lambda i: i.status.key)
        return {"items": [i.status.to_json() for i in items]}

    def inventory(self, base: Callable[[], dict[str, Any]] | None) -> Callable[[], dict[str, Any]]:
        """The agent's cache inventory with the images pulled through CRI added."""

        def merged() -> dict[str, Any]:
            out = base() if base is not None else {"images": [], "checkpoints": []}
            extra = self._present - set(out.get("images") or [])
            if extra:
                out = {**out, "images": sorted({*(out.get("images") or []), *extra})}
            return out

        return merged

    # --- directives in ---

    def update(self, directives: Sequence[Directive], stored: Sequence[ItemStatus] = ()) -> None:
        """Take the node's directives; ``stored``: the items reported before (a restarted
        agent keeps those Done for the same directive)."""
        reported = {i.key: i for i in stored}
        wanted: dict[Key, tuple[Directive, ItemKind, str]] = {}
        for d in directives:
            for image in d.images:
                wanted[(d.lease, "image", image)] = (d, "image", image)
            for ckpt in d.checkpoints:
                wanted[(d.lease, "checkpoint", ckpt)] = (d, "checkpoint", ckpt)
        for key in list(self._items):
            item = self._items[key]
            same = key in wanted and _same(item.status.deadline, wanted[key][0].deadline)
            if not same:
                if item.task is not None:
                    item.task.cancel()
                del self._items[key]
                self.dirty = True
        for key, (d, kind, name) in wanted.items():
            if key in self._items:
                self._items[key].not_before = d.not_before
                continue
            before = reported.get(key)
            if before is not None and before.state == "Done" and _same(before.deadline, d.deadline):
                self._items[key] = _Item(before, d.not_before)
                if kind == "image":
                    self._present |= {name}
                continue
            self._items[key] = _Item(
                ItemStatus(
                    d.lease, kind, name, "Pending", "waiting for notBefore", None, None, d.deadline
                ),
                d.not_before,
            )
            self.dirty = True
        self.wake.set()

    # --- the loop's steps ---

    def start_due(self) -> float | None:
        """Start the items whose time has come; the next time one will be due, if any."""
        now = self.clock()
        nxt: float | None = None
        for key, item in self._items.items():
            if item.status.state != "Pending" or item.task is not None:
                continue
            due = max(item.not_before, item.next_try)
            if due > now:
                nxt = due if nxt is None else min(nxt, due)
                continue
            item.status = replace(item.status, reason="queued")
            item.task = asyncio.create_task(self._work(key), name=f"prewarm {key[1]} {key[2]}")
            self.dirty = True
        return nxt

    async def _work(self, key: Key) -> None:
        item = self._items[key]
        lease, kind, name = key
        try:
            async with self._sem:
                self._set(key, reason="fetching")
                started = self.clock()
                try:
                    reason = await (self._image(name) if kind == "image" else self._ckpt(name))
                except TideleaseError as e:
                    self._failed(key, str(e))
                    return
                except Exception as e:  # a bug: reported on the item, logged with its traceback
                    log.exception("node %s: prewarm %s %s failed", self.settings.node, kind, name)
                    self._failed(key, f"unexpected error: {e!r}")
                    return
                finished = self.clock()
                self._set(key, state="Done", reason=reason, seconds=finished - started, at=finished)
                log.info(
                    "node %s: prewarm %s %s for lease %s done in %.2f s (%s), %.0f s before the "
                    "scale-up",
                    self.settings.node,
                    kind,
                    name,
                    lease,
                    finished - started,
                    reason,
                    (item.status.deadline or finished) - finished,
                )
        finally:
            if self._items.get(key) is item:
                item.task = None
            self.wake.set()

    def _set(
        self,
        key: Key,
        *,
        state: ItemState | None = None,
        reason: str,
        seconds: float | None = None,
        at: float | None = None,
    ) -> None:
        item = self._items.get(key)
        if item is None:
            return
        item.status = replace(
            item.status,
            state=state or item.status.state,
            reason=reason,
            seconds=seconds,
            finished_at=at,
        )
        self.dirty = True
        self.wake.set()

    def _failed(self, key: Key, reason: str) -> None:
        item = self._items.get(key)
        if item is None:
            return
        item.attempts += 1
        now = self.clock()
        if item.attempts <= self.settings.retries:
            item.next_try = now + self.settings.retry_s
            self._set(
                key,
                reason=f"attempt {item.attempts} failed: {reason}; retrying in "
                f"{self.settings.retry_s:.0f} s",
            )
            return
        log.warning(
            "node %s: prewarm %s %s for lease %s failed: %s",
            self.settings.node,
            key[1],
            key[2],
            key[0],
            reason,
        )
        self._set(key, state="Failed", reason=reason, at=now)

    async def _image(self, image: str) -> str:
        if self.images is None:
            raise TideleaseError("no CRI runtime on this node's agent (--cri-endpoint)")
        if await self.images.image_status(image) is not None:
            self._present |= {image}
            return "already present"
        ref = await self.images.pull_image(image)
        if await self.images.image_status(image) is None:
            raise TideleaseError(f"pulled {ref}, but the runtime does not list {image}")
        self._present |= {image}
        return f"pulled {ref}"

    async def _ckpt(self, checkpoint: str) -> str:
        if self.checkpoints is None:
            raise TideleaseError("no peer cache on this node's agent (--cache-dir)")
        if self.checkpoints.has(checkpoint):
            return "already in the cache"
        return await self.checkpoints.fetch(checkpoint)

    async def recheck_images(self) -> None:
        """Drop images the runtime no longer has (its garbage collection) from the inventory."""
        if self.images is None:
            return
        for image in sorted(self._present):
            try:
                gone = await self.images.image_status(image) is None
            except TideleaseError:
                continue
            if gone:
                self._present -= {image}


async def run_prewarm(
    *, node: PrewarmNode, prewarmer: Prewarmer, ready: asyncio.Event | None = None
) -> None:
    """Follow the node's directives and report, until cancelled."""

    async def follow() -> None:
        async for directives, stored in node.watch():
            prewarmer.update(directives, stored)

    follower = asyncio.create_task(follow(), name="prewarm-directives")
    next_recheck = prewarmer.clock() + prewarmer.settings.recheck_s
    try:
        while True:
            if follower.done():
                follower.result()
            prewarmer.wake.clear()
            due = prewarmer.start_due()
            if prewarmer.dirty:
                prewarmer.dirty = False
                try:
                    await node.report(prewarmer.status())
                except NotFound:
                    prewarmer.dirty = True  # no GpuNode yet: the agent creates it
                except TideleaseError as e:
                    log.warning(
                        "GpuNode %s: reporting prewarm status failed (retrying): %s",
                        prewarmer.settings.node,
                        e,
                    )
                    prewarmer.dirty = True
            if ready is not None:
                ready.set()
            now = prewarmer.clock()
            if now >= next_recheck:
                await prewarmer.recheck_images()
                next_recheck = now + prewarmer.settings.recheck_s
            wait = min(next_recheck - now, 2.0 if prewarmer.dirty else 30.0)
            if due is not None:
                wait = min(wait, max(0.0, due - now))
            await _wait(prewarmer.wake, follower, max(0.01, wait))
    finally:
        follower.cancel()
        tasks = [i.task for i in prewarmer._items.values() if i.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(follower, *tasks, return_exceptions=True)


def _same(a: float | None, b: float | None) -> bool:
    """Times equal as written on the GpuNode (to the microsecond)."""
    return a is not None and b is not None and microtime(a) == microtime(b)


async def _wait(event: asyncio.Event, task: asyncio.Task[None], within_s: float) -> None:
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter, task}, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def open_prewarmer(
    *,
    node: str,
    kube: KubeClient,
    runtime: ImageRuntime | None,
    cache: AgentCache | None,
    token_file: Path | None,
) -> Prewarmer | None:
    """The agent's prewarmer, when it has a CRI runtime or a peer cache (else None)."""
    if runtime is None and cache is None:
        return None
    checkpoints = None
    if cache is not None:
        from nodeagent.cache.credentials import TokenFile
        from nodeagent.pulling.peers import GpuNodePeers

        token = TokenFile(token_file) if token_file is not None else None
        checkpoints = PeerCheckpoints(
            cache.store,
            GpuNodePeers(kube, self_node=node),
            token.header if token is not None else dict,
        )
    return Prewarmer(
        settings=PrewarmAgentSettings(node=node), images=runtime, checkpoints=checkpoints
    )
