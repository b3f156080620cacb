"""Listening with bounds, for every HTTP server of the project (extender, probes, peer cache,
orchestrator metrics).

aiohttp bounds a request's line, headers and body, and closes a connection idle for its
keep-alive time, but it accepts any number of connections. ``listen`` puts a guard in front of
each connection:

- **a connection cap**: past ``max_connections`` open connections on one listener, a new one is
  answered ``503`` with ``Connection: close`` and closed, so that thousands of idle clients cost
  at most the cap in file descriptors and the next listener (the probes' port) still answers;
- **room made, on probe listeners** (``Limits.evict_idle``, ``PROBE_LIMITS``): at the cap, the
  connection that has been quiet the longest (nothing received for the longest time, and no
  request in progress) is closed to admit the new one instead of refusing it. A client that
  opens a connection and sends its request at once, as the kubelet's probes and Prometheus do,
  is always served: idle keep-alive connections and silent ones (opened, nothing sent) held by
  anyone else cannot starve it, however many. Probe listeners also drop a connection that has
  not sent its request head within 2 s and one idle for ``PROBE_KEEPALIVE_S`` between requests
  (``probe_runner``). What this cannot stop is a client opening new connections faster than
  the listener serves (more than the cap between a probe's accept and its request's arrival
  pushes the probe out): the NetworkPolicies (docs/install.md, "Network") keep other clients
  off these ports in the first place;
- **a first-request deadline**: a connection whose first request's headers are not complete
  within ``first_request_s`` is closed; ``runner`` sets aiohttp's keep-alive timer, which then
  bounds the idle time between requests, to ``KEEPALIVE_S`` (aiohttp's default is an hour);
- **TLS** when given a ``ServerTLS``: TLS 1.2 or later, a client certificate from the given CA
  required, the handshake bounded by ``handshake_s``, and the certificate, key and CA read again
  when their files change (a Secret volume's update), without a restart. A verified client
  certificate must also be a client certificate only (clientAuth, not serverAuth) and, when
  ``ServerTLS.client_names`` are given, name one of them (its subject CN); any other connection
  is closed right after the handshake, before a byte of HTTP (``ListenerStats.unadmitted``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from common import certificates
from common.errors import InvalidInput

log = logging.getLogger(__name__)

_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 21\r\n\r\ntoo many connections\n"
)
_HEADERS_END = b"\r\n\r\n"
KEEPALIVE_S = 75.0
# Probe listeners: the kubelet opens a connection per probe; Prometheus scrapes every 15-60 s
# and reconnects when its connection was closed. Idle connections go soon.
PROBE_KEEPALIVE_S = 5.0


def runner(
    app: web.Application, *, shutdown_timeout: float = 60.0, keepalive_s: float | None = None
) -> web.AppRunner:
    """The runner of every server here: no access log, idle connections closed after
    ``keepalive_s`` (``KEEPALIVE_S`` if not given), in-flight requests given
    ``shutdown_timeout`` at cleanup."""
    return web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=KEEPALIVE_S if keepalive_s is None else keepalive_s,
        shutdown_timeout=shutdown_timeout,
    )


def probe_runner(app: web.Application, *, shutdown_timeout: float = 60.0) -> web.AppRunner:
    """The runner of a probes-and-metrics server (/healthz, /readyz, /metrics): idle
    connections closed after ``PROBE_KEEPALIVE_S``; listen with ``PROBE_LIMITS``."""
    return runner(app, shutdown_timeout=shutdown_timeout, keepalive_s=PROBE_KEEPALIVE_S)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of one listener."""

    max_connections: int = 256
    first_request_s: float = 10.0
    handshake_s: float = 5.0
    # At the cap, close the connection quiet the longest to admit the new one (refuse the new
    # one only when every open connection has a request in progress).
    evict_idle: bool = False


# Every probes-and-metrics listener (extender, controllers, orchestrator): the kubelet's probe
# always gets in (module docstring).
PROBE_LIMITS = Limits(max_connections=64, first_request_s=2.0, evict_idle=True)


@dataclass(slots=True)
class ListenerStats:
    """What a listener's guard has seen; for tests, logs and metrics."""

    open: int = 0
    refused: int = 0  # over the cap
    timed_out: int = 0  # no complete first request in time
    unadmitted: int = 0  # a verified client certificate of the wrong identity (TLSContext.admit)
    evicted: int = 0  # closed, quiet the longest, to admit a new one (Limits.evict_idle)


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """A server certificate and key, the CA whose client certificates are accepted, and the
    subject CNs admitted among them (empty: any, still for client authentication only)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path
    client_names: tuple[str, ...] = ()

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
    # When what was last loaded ends (Unix seconds), for the expiry metrics: the serving
    # certificate, the client CA (the earliest in the file); and the client certificate last
    # admitted (kube-scheduler's copy on its host, which only its admin renews).
    serving_not_after: float = field(init=False, default=0.0)
    client_ca_not_after: float = field(init=False, default=0.0)
    client_not_after: float | None = field(init=False, default=None)
    _verdict: tuple[bytes, str | None] = field(init=False, default=(b"", None))

    def __post_init__(self) -> None:
        self.context = self._fresh()
        try:
            self._load()
        except (OSError, ssl.SSLError, InvalidInput) as e:
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
        serving = certificates.facts(self.tls.cert_file.read_bytes())
        cas = certificates.all_facts(self.tls.client_ca_file.read_bytes())
        self._load_into(self.context)
        self._seen = seen
        self.serving_not_after = serving.not_after.timestamp()
        self.client_ca_not_after = min(c.not_after.timestamp() for c in cas) if cas else 0.0

    def reload_if_changed(self) -> bool:
        try:
            if _fingerprint(self.tls.files()) == self._seen:
                return False
            self._load()
        except (OSError, ssl.SSLError, InvalidInput) as e:
            log.warning("TLS files changed but cannot be loaded (kept the previous ones): %s", e)
            return False
        self.reloads += 1
        log.info("TLS certificate, key and client CA loaded again from %s", self.tls.cert_file)
        return True

    async def follow(self, interval_s: float = 10.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.reload_if_changed()

    def admit(self, transport: asyncio.BaseTransport) -> str | None:
        """Why the client of a TLS connection just made is not admitted, or None
        (certificates.client_refusal). The verdict on the last certificate seen is kept:
        kube-scheduler presents the same one on every connection."""
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return "no client certificate"
        if der != self._verdict[0]:
            refusal = certificates.client_refusal(der, self.tls.client_names)
            self._verdict = (der, refusal)
            if refusal is None:
                self.client_not_after = certificates.der_not_after(der)
        return self._verdict[1]


class _Guard(asyncio.Protocol):
    """Stands between the transport and aiohttp's protocol: counts, refuses over the cap (or
    makes room, ``Limits.evict_idle``), closes a connection that has not sent a complete
    request head in time."""

    def __init__(self, listener: _Listener) -> None:
        self._listener = listener
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._tail = b""
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        listener = self._listener
        refusal = listener.admit(transport) if listener.admit is not None else None
        if refusal is not None:
            listener.stats.unadmitted += 1
            log.warning("TLS client not admitted: %s", refusal)
            transport.abort()
            return
        if listener.stats.open >= listener.limits.max_connections and not (
            listener.limits.evict_idle and listener.make_room()
        ):
            listener.stats.refused += 1
            transport.write(_REFUSAL)
            transport.close()
            return
        listener.stats.open += 1
        listener.open[self] = None
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

    def busy(self) -> bool:
        """A request in progress (aiohttp's handler says so; without that, never)."""
        return bool(getattr(self._inner, "_request_in_progress", False))

    def evict(self) -> None:
        """Closed to make room: no longer counted, aborted (no lingering close)."""
        self._uncount()
        self._listener.stats.evicted += 1
        if self._transport is not None:
            self._transport.abort()

    def _uncount(self) -> None:
        if self in self._listener.open:
            del self._listener.open[self]
            self._listener.stats.open -= 1

    def data_received(self, data: bytes) -> None:
        if self in self._listener.open:
            self._listener.open.move_to_end(self)  # heard from: the quietest are first
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
            self._uncount()
            self._inner.connection_lost(exc)
            self._inner = None


@dataclass(slots=True)
class _Listener:
    factory: web.Server
    limits: Limits
    stats: ListenerStats
    # The counted connections, the one heard from longest ago first.
    open: OrderedDict[_Guard, None] = field(default_factory=OrderedDict)
    # Whom a TLS listener admits (TLSContext.admit); None: plain HTTP.
    admit: Callable[[asyncio.BaseTransport], str | None] | None = None

    def __call__(self) -> _Guard:
        return _Guard(self)

    def make_room(self) -> bool:
        """Evict the connection quiet the longest that has no request in progress; False when
        every one has."""
        for guard in self.open:
            if not guard.busy():
                guard.evict()
                return True
        return False


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
        admit = self._tls.admit if self._tls is not None else None
        listener = _Listener(server, self._limits, self.stats, admit=admit)
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
