"""The cache, served read-only to peer nodes over HTTP.

    GET /healthz                          no credential
    GET /v1/inventory                     {"checkpoints": [...ids], "images": [...refs]}
    GET /v1/{kind}/{id}/manifest          the entry's manifest (nodeagent.cache.manifest)
    GET /v1/{kind}/{id}/data              its bytes; one Range (bytes=a-b, a-, -n) or none

``kind`` is ``checkpoints`` or ``images``. Every /v1 request needs ``Authorization: Bearer
<token>``, the peer agent's projected ServiceAccount token for the cache's audience, verified by a
:class:`~nodeagent.cache.peerauth.PeerVerifier` (a TokenReview): no token or an invalid one is a
401, a valid token of anyone but a peer agent bound to a node a 403, both before the path is
looked at, so nothing (not even whether an entry exists) goes to anyone else. Each served
request is logged with the peer's identity (its node). Ids are validated by pattern and
the file is checked to be a regular file inside the cache before it is handed to
``web.FileResponse`` (sendfile). GET and HEAD only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter

from common.coercion import whole
from common.httpserving import Limits, listen
from common.httpserving import runner as make_runner
from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.identity import DEFAULT_AUDIENCE, PeerIdentity, service_account_user
from nodeagent.cache.naming import KINDS, EntryId, Kind, parse_id
from nodeagent.cache.peerauth import PeerVerifier
from nodeagent.cache.ranges import RangeRefused, parse_range

log = logging.getLogger(__name__)

STORE_KEY = web.AppKey("store", CacheStore)
VERIFIER_KEY = web.AppKey("verifier", PeerVerifier)
PEER_KEY = web.RequestKey("peer", PeerIdentity)  # set by _guard
# Peers pulling at once are few (a node's pull plan spreads over peers); idle ones are dropped.
CACHE_LIMITS = Limits(max_connections=128)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ServeSettings:
    host: str = "0.0.0.0"
    port: int = 8477
    # Peers present a token for this audience, of this user (the agents' ServiceAccount).
    audience: str = DEFAULT_AUDIENCE
    peer_user: str = service_account_user("tidelease-system", "tidelease-agent")

    def validate(self) -> list[str]:
        """Every problem at once; empty when the settings are usable."""
        problems = []
        if not whole(self.port):
            problems.append(f"cache port {self.port!r} is not a whole number")
        elif not 0 <= self.port <= 65535:
            problems.append(f"cache port {self.port} is not a TCP port")
        if not self.host:
            problems.append("cache host must not be empty")
        if not self.audience:
            problems.append("cache audience must not be empty")
        if not self.peer_user.startswith("system:serviceaccount:"):
            problems.append(f"cache peer user {self.peer_user!r} is not a ServiceAccount's")
        return problems


def _refuse(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


@web.middleware
async def _guard(request: web.Request, handler: _Handler) -> web.StreamResponse:
    if request.method not in (hdrs.METH_GET, hdrs.METH_HEAD):
        return _refuse(405, "read-only: GET and HEAD only")
    if request.path == "/healthz":
        return await handler(request)
    verdict = await request.app[VERIFIER_KEY].verify(request.headers.get(hdrs.AUTHORIZATION))
    if not verdict.allowed or verdict.identity is None:
        log.info(
            "cache: refused %s %s from %s: %s",
            request.method,
            request.path,
            request.remote,
            verdict.reason,
        )
        headers = {hdrs.WWW_AUTHENTICATE: 'Bearer realm="tidelease-cache"'}
        return web.json_response(
            {"error": verdict.reason},
            status=verdict.status,
            headers=headers if verdict.status == 401 else None,
        )
    request[PEER_KEY] = verdict.identity
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status >= 400:
            return _refuse(e.status, e.reason)
        raise


def _entry(request: web.Request) -> tuple[Kind, EntryId] | web.Response:
    kind = KINDS.get(request.match_info["kind"])
    entry = parse_id(request.match_info["entry"])
    if kind is None or entry is None:
        return _refuse(400, "bad kind or id")
    return kind, entry


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def _peer(request: web.Request) -> PeerIdentity:
    return request[PEER_KEY]


async def _inventory(request: web.Request) -> web.Response:
    log.info("cache: inventory to %s", _peer(request))
    return web.json_response(request.app[STORE_KEY].inventory())


async def _manifest(request: web.Request) -> web.Response:
    named = _entry(request)
    if isinstance(named, web.Response):
        return named
    store = request.app[STORE_KEY]
    manifest = store.manifest(*named)
    # Only for an entry whose data would be served (a regular file inside the cache).
    if manifest is None or await asyncio.to_thread(store.data_path, *named) is None:
        return _refuse(404, "no such entry")
    log.info("cache: manifest of %s/%s to %s", named[0].value, named[1], _peer(request))
    return web.json_response(manifest.to_json())


class _AsStored(web.FileResponse):
    """The file's own bytes. FileResponse would answer a client that accepts gzip or br with
    ``<file>.gz`` / ``.br`` when such a file exists, and ``x.gz`` may well be another entry: it
    is prepared against the request without Accept-Encoding."""

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self.prepared:
            return None
        headers = request.headers.copy()
        headers.popall(hdrs.ACCEPT_ENCODING, None)
        return await super().prepare(request.clone(headers=headers))


async def _data(request: web.Request) -> web.StreamResponse:
    named = _entry(request)
    if isinstance(named, web.Response):
        return named
    store = request.app[STORE_KEY]
    manifest = store.manifest(*named)
    path = await asyncio.to_thread(store.data_path, *named) if manifest else None
    if manifest is None or path is None:
        return _refuse(404, "no such entry")
    if hdrs.IF_RANGE in request.headers:
        return _refuse(400, "If-Range is not supported")
    wanted = parse_range(request.headers.get(hdrs.RANGE), manifest.size)
    if isinstance(wanted, RangeRefused):
        response = _refuse(wanted.status, wanted.reason)
        if wanted.status == 416:
            response.headers[hdrs.CONTENT_RANGE] = f"bytes */{manifest.size}"
        return response
    store.touch(*named)
    log.info(
        "cache: data of %s/%s (%s) to %s",
        named[0].value,
        named[1],
        request.headers.get(hdrs.RANGE, "whole"),
        _peer(request),
    )
    return _AsStored(path, headers={"Cache-Control": "no-store"})


def cache_app(store: CacheStore, verifier: PeerVerifier) -> web.Application:
    app = web.Application(middlewares=[_guard])
    app[STORE_KEY] = store
    app[VERIFIER_KEY] = verifier
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/v1/inventory", _inventory)
    app.router.add_get("/v1/{kind}/{entry}/manifest", _manifest)
    app.router.add_get("/v1/{kind}/{entry}/data", _data)
    return app


async def run_cache_server(
    *,
    store: CacheStore,
    settings: ServeSettings,
    verifier: PeerVerifier,
    ready: asyncio.Event | None = None,
    bound: list[int] | None = None,
) -> None:
    """Serve ``store`` to the peers ``verifier`` admits until cancelled. ``bound`` receives the
    port (useful with port 0)."""
    runner = make_runner(cache_app(store, verifier))
    await runner.setup()
    try:
        await listen(runner, settings.host, settings.port, limits=CACHE_LIMITS)
        port = runner.addresses[0][1] if runner.addresses else settings.port
        if bound is not None:
            bound.append(port)
        log.info("cache: serving %s on %s:%d", store.root, settings.host, port)
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
