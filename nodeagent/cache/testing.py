"""Test and benchmark support: a link emulator in front of a real cache server, and factories.

:class:`LinkEmulator` is a loopback TCP proxy that makes a link of a given rate and request
latency out of loopback: bytes from the client are held back by ``latency_s`` (so every request
pays it), bytes back to the client pass a token bucket shared by all of the link's connections
(so parallel requests share the link's rate, as on a real wire). ``kill()`` drops the link at
once, mid-transfer, like a node that dies. The server behind it is the production code path
(``serving.cache_app``, sendfile and all).

Identity fakes: :class:`FakeTokenReviews` answers TokenReviews as the API server does (a token
is valid only for the audiences it was issued for, and names its ServiceAccount and, when bound
to a pod, its node), so the real :class:`~nodeagent.cache.peerauth.TokenReviewVerifier` runs
against it; its factories issue the tokens of an agent on a node, a workload's, an agent's not
bound to a pod, one for another audience. :class:`KnownTokens` is a verifier that admits the
token in a file as one peer's, for the transfer tests and benchmarks, which are not about
identity.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from common.errors import Unavailable
from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.credentials import TokenFile
from nodeagent.cache.identity import (
    DEFAULT_AUDIENCE,
    NODE_NAME_EXTRA,
    POD_NAME_EXTRA,
    NodeName,
    PeerIdentity,
    PeerVerdict,
    bearer_token,
    service_account_user,
)
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.peerauth import PeerVerifier
from nodeagent.cache.peerserver import cache_app

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


AGENT_USER = service_account_user("tidelease-system", "tidelease-agent")


@dataclass(frozen=True, slots=True)
class _Issued:
    user: str
    audiences: tuple[str, ...]
    node: str | None
    pod: str | None


class FakeTokenReviews:
    """The API server's TokenReview endpoint, faithful in what the cache relies on: a token is
    authenticated only for the audiences it was issued for (``spec.audiences``; none asked
    means the API server's own, ``https://kubernetes.default.svc``), and a token bound to a pod
    carries its node and pod names in ``extra``. ``down`` makes every call fail as an
    unreachable API server does."""

    API_AUDIENCE = "https://kubernetes.default.svc"

    def __init__(self) -> None:
        self._issued: dict[str, _Issued] = {}
        self.reviews = 0
        self.down = False

    def issue(
        self,
        user: str,
        *,
        audiences: tuple[str, ...] = (DEFAULT_AUDIENCE,),
        node: str | None = None,
        pod: str | None = None,
    ) -> str:
        """A new token (shaped like a JWT) for ``user``."""
        claims = {"sub": user, "aud": list(audiences), "jti": secrets.token_hex(8)}
        body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        token = f"eyJhbGciOiJSUzI1NiJ9.{body}.{secrets.token_urlsafe(32)}"
        self._issued[token] = _Issued(user, audiences, node, pod)
        return token

    # Named factories.
    def agent(self, node: str, *, audience: str = DEFAULT_AUDIENCE) -> str:
        """The token a node's agent mounts: its ServiceAccount, bound to its pod on ``node``."""
        return self.issue(
            AGENT_USER, audiences=(audience,), node=node, pod=f"tidelease-agent-{node}"
        )

    def workload(self, node: str, *, audience: str = DEFAULT_AUDIENCE) -> str:
        """A workload pod's token on ``node``: bound to a node, but not the agents' account."""
        return self.issue(
            service_account_user("team-a", "default"),
            audiences=(audience,),
            node=node,
            pod="trainer-0",
        )

    def unbound_agent(self) -> str:
        """``kubectl create token tidelease-agent --audience ...``: no pod, so no node."""
        return self.issue(AGENT_USER)

    def revoke(self, token: str) -> None:
        """The pod the token was bound to is gone: the token no longer authenticates."""
        self._issued.pop(token, None)

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if self.down:
            raise Unavailable("connection refused")
        assert (method, path) == ("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
        self.reviews += 1
        spec = kwargs["body"]["spec"]
        wanted = spec.get("audiences") or [self.API_AUDIENCE]
        issued = self._issued.get(spec["token"])
        review: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview"}
        if issued is None:
            review["status"] = {"authenticated": False, "error": "invalid bearer token"}
            return review
        both = [a for a in wanted if a in issued.audiences]
        if not both:
            review["status"] = {
                "authenticated": False,
                "error": f"token audiences {list(issued.audiences)} is invalid for the target "
                f"audiences {wanted}",
            }
            return review
        extra: dict[str, list[str]] = {}
        if issued.node is not None:
            extra[NODE_NAME_EXTRA] = [issued.node]
        if issued.pod is not None:
            extra[POD_NAME_EXTRA] = [issued.pod]
        user: dict[str, Any] = {
            "username": issued.user,
            "uid": "0000",
            "groups": ["system:serviceaccounts", "system:authenticated"],
        }
        if extra:
            user["extra"] = extra
        review["status"] = {"authenticated": True, "user": user, "audiences": both}
        return review


class KnownTokens:
    """A verifier that admits the token in ``path`` (re-read as it changes) as the agent of
    ``node``, and nobody else."""

    def __init__(self, path: Path, node: str = "peer-test") -> None:
        self._file = TokenFile(path)
        self.identity = PeerIdentity(NodeName(node), AGENT_USER)

    async def verify(self, authorization: str | None) -> PeerVerdict:
        token = bearer_token(authorization)
        known = self._file.token()
        if token is None or not known or not secrets.compare_digest(token.encode(), known):
            return PeerVerdict(401, "not a known token")
        return PeerVerdict(200, "ok", self.identity)


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
    peers: Path | PeerVerifier,
    *,
    rate: float | None = None,
    latency_s: float = 0.0,
) -> PeerNode:
    """Serve ``store`` on a free loopback port, behind a link emulator when ``rate`` is set, to
    the peers ``peers`` verifies (a path: :class:`KnownTokens` of that file)."""
    verifier = KnownTokens(peers) if isinstance(peers, Path) else peers
    runner = web.AppRunner(cache_app(store, verifier), access_log=None)
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
