"""KubeClient's session looks nothing up per request: kubernetes_asyncio's own trusts the
environment, and aiohttp then reads ~/.netrc in a worker thread for every request (a thread
hop on each bind). The proxy the environment names is still used, found once at connect."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from common.errors import Unavailable
from common.kubeclient import KubeClient
from tests.certs import Pair, issue, make_ca
from tests.kubeconfigs import write_kubeconfig
from tests.polling import eventually


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


class SilentTLSServer:
    """A TLS endpoint that reads a request and never answers it, nor a TLS close: an API server
    that hangs (etcd paused), or dies mid-request. Records, per connection, whether the client
    has let go of it (its TCP close or reset)."""

    def __init__(self, pair: Pair) -> None:
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(pair.cert, pair.key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.accepted = 0
        self.released = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            thread = threading.Thread(target=self._hold, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _hold(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        with self._ctx.wrap_socket(conn, server_side=True) as tls:
            head = b""
            while b"\r\n\r\n" not in head:
                head += tls.recv(4096)
            # From here on the raw bytes, unanswered: the client's close_notify is swallowed,
            # so only its TCP close (or an abort) ends the connection.
            with socket.socket(fileno=os.dup(tls.fileno())) as raw:
                raw.settimeout(0.2)
                while not self._stop.is_set():
                    try:
                        if not raw.recv(4096):
                            break
                    except TimeoutError:
                        continue
                    except OSError:  # reset
                        break
                else:
                    return
            self.released += 1

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()


async def test_close_lets_go_of_connections_whose_tls_close_the_server_never_answers(
    tmp_path: Path,
) -> None:
    """A request that timed out against a hung API server leaves its connection in a TLS close
    the server never answers. close() must end it then and there: left to itself, the close
    waits 30 s for the server, and a process (or test) that stops before then leaks the socket
    (Python < 3.12.8; aiohttp's cleanup of closed TLS transports is what ends them there)."""
    ca = make_ca(tmp_path / "pki", "ca")
    server = SilentTLSServer(issue(ca, tmp_path / "pki", "apiserver"))
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", f"https://127.0.0.1:{server.port}", "t", ca.cert
    )
    try:
        kube = await KubeClient.connect(kubeconfig)
        try:
            for _ in range(3):
                with pytest.raises(Unavailable):
                    await kube.json("GET", "/readyz", request_timeout=0.3)
        finally:
            await kube.close()
        assert server.accepted == 3

        async def let_go() -> bool:
            return server.released == server.accepted

        # Not the 30 s a TLS close waits for its answer.
        await eventually(let_go, within_s=3, every_s=0.05)
    finally:
        server.close()
