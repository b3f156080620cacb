"""Listening with bounds, for every HTTP server of the project (extender, probes, peer cache,
orchestrator metrics).

aiohttp bounds a request's line, headers and body, and closes a connection idle for its
keep-alive time, but it accepts any number of connections. ``listen`` puts a guard in front of
each connection:

- **a connection cap**: past ``max_connections`` open connections on one listener, a new one is
  answered ``503`` with ``Connection: close`` and closed, so that thousands of idle clients cost
  at most the cap in file descriptors and the next listener (the probes' port) still answers;
- **a first-request deadline**: a connection whose first request's headers are not complete
  within ``first_request_s`` is closed; ``runner`` sets aiohttp's keep-alive timer, which then
  bounds the idle time between requests, to ``KEEPALIVE_S`` (aiohttp's default is an hour);
- **TLS** when given a ``ServerTLS``: TLS 1.2 or later, a client certificate from the given CA
  required, the handshake bounded by ``handshake_s``, and the certificate, key and CA read again
  when their files change (a Secret volume's update), without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from common.errors import InvalidInput

log = logging.getLogger(__name__)

_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 21\r\n\r\ntoo many connections\n"
)
_HEADERS_END = b"\r\n\r\n"
KEEPALIVE_S = 75.0


def runner(app: web.Application, *, shutdown_timeout: float = 60.0) -> web.AppRunner:
    """The runner of every server here: no access log, idle connections closed after
    ``KEEPALIVE_S``, in-flight requests given ``shutdown_timeout`` at cleanup."""
    return web.AppRunner(
        app, access_log=None, keepalive_timeout=KEEPALIVE_S, shutdown_timeout=shutdown_timeout
    )


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of one listener."""

    max_connections: int = 256
    first_request_s: float = 10.0
    handshake_s: float = 5.0


@dataclass(slots=True)
class ListenerStats:
    """What a listener's guard has seen; for tests, logs and metrics."""

    open: int = 0
    refused: int = 0  # over the cap
    timed_out: int = 0  # no complete first request in time


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """A server certificate and key, and the CA whose client certificates are accepted."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path

    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file, self.client_ca_file)


def _fingerprint(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...]:
    """What changes when a file is replaced or rewritten (Secret volumes swap a symlink)."""
    out = []
    for path in paths:
        st = os.stat(path)  # follows the symlink: the file now behind it
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


@dataclass(slots=True)
class TLSContext:
    """An SSLContext that follows its files. New connections use what was last loaded; a load
    that fails (a half-written rotation) keeps the previous credentials and is tried again."""

    tls: ServerTLS
    context: ssl.SSLContext = field(init=False)
    _seen: tuple[tuple[int, int, int], ...] = field(init=False, default=())
    reloads: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.context = self._fresh()
        try:
            self._load()
        except (OSError, ssl.SSLError) as e:
            raise InvalidInput(f"TLS files {', '.join(map(str, self.tls.files()))}: {e}") from e

    @staticmethod
    def _fresh() -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        # No TLS 1.3 session tickets: kube-scheduler's client (Go, no session cache) never
        # resumes, so the two tickets sent after every handshake were work and bytes for nothing.
        context.num_tickets = 0
        return context

    def _load_into(self, context: ssl.SSLContext) -> None:
        context.load_verify_locations(cafile=str(self.tls.client_ca_file))
        context.load_cert_chain(str(self.tls.cert_file), str(self.tls.key_file))

    def _load(self) -> None:
        seen = _fingerprint(self.tls.files())
        # Tried on a scratch context first: a failed load_cert_chain can leave a context with
        # the new certificate and the old key. Then loaded into the live context, so that
        # connections accepted from now on get the new chain. A CA is added to those trusted;
        # one no longer in the file stays trusted until the process restarts (OpenSSL cannot
        # remove a CA from a store).
        self._load_into(self._fresh())
        self._load_into(self.context)
        self._seen = seen

    def reload_if_changed(self) -> bool:
        try:
            if _fingerprint(self.tls.files()) == self._seen:
                return False
            self._load()
        except (OSError, ssl.SSLError) as e:
            log.warning("TLS files changed but cannot be loaded (kept the previous ones): %s", e)
            return False
        self.reloads += 1
        log.info("TLS certificate, key and client CA loaded again from %s", self.tls.cert_file)
        return True

    async def follow(self, interval_s: float = 10.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.reload_if_changed()


class _Guard(asyncio.Protocol):
    """Stands between the transport and aiohttp's protocol: counts, refuses over the cap,
    closes a connection that has not sent a complete request head in time."""

    def __init__(self, listener: _Listener) -> None:
        self._listener = listener
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._tail = b""
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        listener = self._listener
        if listener.stats.open >= listener.limits.max_connections:
            listener.stats.refused += 1
            transport.write(_REFUSAL)
            transport.close()
            return
        listener.stats.open += 1
        self._transport = transport
        self._deadline = asyncio.get_running_loop().call_later(
            listener.limits.first_request_s, self._too_slow
        )
        self._inner = listener.factory()
        self._inner.connection_made(transport)

    def _too_slow(self) -> None:
        self._deadline = None
        if self._transport is not None and not self._transport.is_closing():
            self._listener.stats.timed_out += 1
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._deadline is not None:
            seen = self._tail + data
            if _HEADERS_END in seen:
                self._deadline.cancel()
                self._deadline = None
            else:
                self._tail = seen[-3:]
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._inner is not None:
            self._listener.stats.open -= 1
            self._inner.connection_lost(exc)
            self._inner = None


@dataclass(slots=True)
class _Listener:
    factory: web.Server
    limits: Limits
    stats: ListenerStats

    def __call__(self) -> _Guard:
        return _Guard(self)


class GuardedSite(web.BaseSite):
    """A TCP site whose connections pass through ``_Guard``."""

    __slots__ = ("_host", "_limits", "_port", "_tls", "stats")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limits: Limits,
        tls: TLSContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=tls.context if tls is not None else None)
        self._host = host
        self._port = port
        self._limits = limits
        self._tls = tls
        self.stats = ListenerStats()

    @property
    def name(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None, "the runner is set up first"
        listener = _Listener(server, self._limits, self.stats)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            listener,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self._limits.handshake_s if self._ssl_context else None,
            backlog=self._backlog,
            reuse_address=True,
        )


async def listen(
    runner: web.BaseRunner,
    host: str,
    port: int,
    *,
    limits: Limits = Limits(),
    tls: TLSContext | None = None,
) -> GuardedSite:
    """Listen on host:port behind the guard. A port in use or a host that does not resolve is a
    one-line InvalidInput (the command exits 2 saying so), not a traceback."""
    site = GuardedSite(runner, host, port, limits=limits, tls=tls)
    try:
        await site.start()
    except OSError as e:
        raise InvalidInput(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    return site


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-files limit towards ``wanted`` (at most the hard limit), so that the
    connection caps, not the descriptor table, are what refuses; returns the soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft
