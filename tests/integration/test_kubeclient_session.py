"""KubeClient's session looks nothing up per request: kubernetes_asyncio's own trusts the
environment, and aiohttp then reads ~/.netrc in a worker thread for every request (a thread
hop on each bind). The proxy the environment names is still used, found once at connect."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from common.kubeclient import KubeClient
from tests.kubeconfigs import write_kubeconfig


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Path, list[str], int]]:
    """A loopback endpoint, and a kubeconfig for it; the list records each request's host
    and path."""
    seen: list[str] = []

    async def ok(request: web.Request) -> web.Response:
        seen.append(f"{request.host}{request.path}")
        return web.json_response({"kind": "Status", "status": "Success"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}", "t")
    try:
        yield kubeconfig, seen, port
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("env_lookups", "lookups"), [(False, 0), (True, 20)])
async def test_no_netrc_lookup_in_a_thread_per_request(
    server: tuple[Path, list[str], int],
    monkeypatch: pytest.MonkeyPatch,
    env_lookups: bool,
    lookups: int,
) -> None:
    kubeconfig, seen, _ = server
    threads: list[str] = []
    real = aiohttp.ClientSession._get_netrc_auth

    def counted(self: aiohttp.ClientSession, host: str) -> aiohttp.BasicAuth | None:
        threads.append(threading.current_thread().name)
        return real(self, host)

    monkeypatch.setattr(aiohttp.ClientSession, "_get_netrc_auth", counted)
    kube = await KubeClient.connect(kubeconfig, env_lookups=env_lookups)
    try:
        for _ in range(20):
            await kube.json("POST", "/api/v1/namespaces/ns/pods/p/binding", body={})
    finally:
        await kube.close()
    assert len(seen) == 20
    assert len(threads) == lookups  # kubernetes_asyncio's own session: one thread hop each
    assert threading.main_thread().name not in threads


async def test_the_environments_proxy_is_still_used(
    server: tuple[Path, list[str], int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY names the loopback endpoint itself: a request for an API server whose name
    does not resolve reaches it, as a proxy's (its Host the API server's)."""
    _, seen, port = server
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "")
    other = write_kubeconfig(tmp_path / "other", "http://api.invalid:6443", "t")
    kube = await KubeClient.connect(other)
    try:
        await kube.json("GET", "/api/v1/namespaces")
    finally:
        await kube.close()
    assert seen == ["api.invalid/api/v1/namespaces"]  # the Host header as aiohttp sends it
