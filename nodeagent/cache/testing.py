"""Test and benchmark support: a link emulator in front of a real cache server, and factories.

:class:`LinkEmulator` is a loopback TCP proxy that makes a link of a given rate and request
latency out of loopback: bytes from the client are held back by ``latency_s`` (so every request
pays it), bytes back to the client pass a token bucket shared by all of the link's connections
(so parallel requests share the link's rate, as on a real wire). ``kill()`` drops the link at
once, mid-transfer, like a node that dies. The server behind it is the production code path
(``serving.cache_app``, sendfile and all).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from nodeagent.cache.credentials import TokenFile
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.serving import cache_app
from nodeagent.cache.store import CacheStore

_CHUNK = 256 << 10


class TokenBucket:
    """Virtual-clock token bucket: a send of n bytes may start once the link has carried all
    earlier bytes at ``rate``, less a small burst allowance."""

    def __init__(self, rate: float, burst_s: float = 0.002) -> None:
        self.rate = rate
        self.burst_s = burst_s
        self._free_at = 0.0

    async def take(self, n: int) -> None:
        now = time.monotonic()
        start = max(now, self._free_at)
        self._free_at = start + n / self.rate
        wait = self._free_at - now - self.burst_s
        if wait > 0:
            await asyncio.sleep(wait)


@dataclass
class LinkEmulator:
    upstream_port: int
    rate: float  # bytes per second, server to client
    latency_s: float = 0.0  # added to every client-to-server byte (so to every request)
    host: str = "127.0.0.1"
    port: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _bucket: TokenBucket | None = None

    async def start(self) -> int:
        self._bucket = TokenBucket(self.rate)
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        task = asyncio.current_task()
        up = asyncio.create_task(self._client_to_server(reader, up_writer))
        down = asyncio.create_task(self._server_to_client(up_reader, writer))
        for t in (up, down):
            self._tasks.add(t)
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (up, down):
                t.cancel()
                self._tasks.discard(t)
            for w in (writer, up_writer):
                w.close()
                self._writers.discard(w)
            del task

    async def _client_to_server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not data:
                    writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while True:
                data = await reader.read(_CHUNK)
                queue.put_nowait((time.monotonic() + self.latency_s, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()

    async def _server_to_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        assert self._bucket is not None
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                return
            await self._bucket.take(len(data))
            writer.write(data)
            await writer.drain()

    async def kill(self) -> None:
        """Drop the link now: stop listening and reset every connection."""
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    close = kill


@dataclass
class PeerNode:
    """A cache server on loopback behind a link emulator."""

    store: CacheStore
    runner: web.AppRunner
    server_port: int
    link: LinkEmulator | None

    @property
    def url(self) -> str:
        return self.link.url if self.link is not None else f"http://127.0.0.1:{self.server_port}"

    async def stop(self) -> None:
        if self.link is not None:
            await self.link.kill()
        await self.runner.cleanup()


async def start_peer(
    store: CacheStore,
    token_file: Path,
    *,
    rate: float | None = None,
    latency_s: float = 0.0,
) -> PeerNode:
    """Serve ``store`` on a free loopback port, behind a link emulator when ``rate`` is set."""
    runner = web.AppRunner(cache_app(store, TokenFile(token_file)), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    link = None
    if rate is not None:
        link = LinkEmulator(port, rate=rate, latency_s=latency_s)
        await link.start()
    return PeerNode(store, runner, port, link)


def write_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


def random_file(path: Path, size: int, *, sparse: bool = False) -> Path:
    """A file of ``size`` random bytes (or a sparse file of zeros)."""
    with open(path, "wb") as f:
        if sparse:
            f.truncate(size)
            return path
        left = size
        while left:
            n = min(left, 8 << 20)
            f.write(os.urandom(n))
            left -= n
    return path


def clone_entry(source: CacheStore, kind: Kind, entry: EntryId, dest: CacheStore) -> None:
    """Give ``dest`` the same entry as ``source`` (hard-linked when possible), for peers that
    hold the same checkpoint without copying it."""
    manifest = source.manifest(kind, entry)
    src = source.data_path(kind, entry)
    if manifest is None or src is None:
        raise KeyError(f"{kind.value}/{entry}")
    tmp = dest.temp_path(kind, entry)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    dest.adopt(manifest, tmp)
