"""common.httpserving: the connection cap, the first-request deadline and HTTPS with client
certificates (rotated without a restart), on real loopback sockets."""

from __future__ import annotations

import asyncio
import re
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from common.errors import InvalidInput
from common.httpserving import GuardedSite, Limits, ServerTLS, TLSContext, listen
from tests.certs import Pair, issue, make_ca
from tests.polling import eventually


async def wait_until(condition: Callable[[], bool]) -> None:
    async def probe() -> bool:
        return condition()

    await eventually(probe, within_s=5, every_s=0.02)


async def _hello(_: web.Request) -> web.Response:
    return web.Response(text="hello")


@asynccontextmanager
async def served(limits: Limits, tls: TLSContext | None = None) -> AsyncIterator[GuardedSite]:
    app = web.Application()
    app.router.add_get("/", _hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        yield await listen(runner, "127.0.0.1", 0, limits=limits, tls=tls)
    finally:
        await runner.cleanup()


def port_of(site: GuardedSite) -> int:
    return int(site._runner.addresses[0][1])


async def get(port: int) -> bytes:
    """One request on a connection of its own; the whole answer as bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def test_past_the_cap_a_connection_gets_503_and_the_others_still_work() -> None:
    async with served(Limits(max_connections=5)) as site:
        port = port_of(site)
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        await wait_until(lambda: site.stats.open == 5)

        refused = await get(port)
        assert refused.startswith(b"HTTP/1.1 503"), refused
        assert b"too many connections" in refused
        assert site.stats.refused == 1

        # One idle connection is used: it is served, as the cap counts connections, not requests.
        reader, writer = idle[0]
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 200")
        assert answer.endswith(b"hello")

        for _, w in idle:
            w.close()
        await wait_until(lambda: site.stats.open == 0)
        assert (await get(port)).startswith(b"HTTP/1.1 200")


async def test_a_connection_without_a_complete_request_head_is_closed_at_the_deadline() -> None:
    async with served(Limits(first_request_s=0.3)) as site:
        port = port_of(site)
        silent = await asyncio.open_connection("127.0.0.1", port)
        slow = await asyncio.open_connection("127.0.0.1", port)
        slow[1].write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never ends its headers

        for reader, writer in (silent, slow):
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
            writer.close()
        assert site.stats.timed_out == 2
        await wait_until(lambda: site.stats.open == 0)


async def test_a_request_head_in_pieces_within_the_deadline_is_served_after_it() -> None:
    async with served(Limits(first_request_s=0.5)) as site:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(site))
        for piece in (b"GET / HTTP/1.1\r", b"\nHost: x\r\nConnection: keep-alive\r\n\r", b"\n"):
            writer.write(piece)
            await asyncio.sleep(0.05)
        assert (await reader.readuntil(b"hello")).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(0.8)  # past the first-request deadline, kept alive
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200")
        writer.close()
        assert site.stats.timed_out == 0


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Pair]:
    ca = make_ca(tmp_path / "ca", "tidelease-extender-ca")
    other = make_ca(tmp_path / "other", "someone-else")
    return {
        "ca": ca,
        "server": issue(ca, tmp_path / "issued", "tidelease-extender"),
        "client": issue(ca, tmp_path / "issued", "kube-scheduler", client=True),
        "stranger": issue(other, tmp_path / "other", "stranger", client=True),
    }


def client_context(ca: Path, client: Pair | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


async def https_get(port: int, context: ssl.SSLContext) -> tuple[int, str, dict[str, str]]:
    """Status, body and the server certificate's subject, over a fresh connection."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost"
    )
    try:
        peer = writer.get_extra_info("peercert")
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    if not answer:  # TLS 1.3: a refused client certificate shows on the first read
        raise ConnectionResetError("closed without an answer")
    head, _, body = answer.partition(b"\r\n\r\n")
    subject = {k: v for ((k, v),) in peer["subject"]}
    return int(head.split()[1]), body.decode(), subject


def live_files(tmp_path: Path, pki: dict[str, Pair]) -> ServerTLS:
    """The server's files where a Secret volume would put them (copies, to be rotated)."""
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki["server"].cert, live / "tls.crt")
    shutil.copy(pki["server"].key, live / "tls.key")
    shutil.copy(pki["ca"].cert, live / "ca.crt")
    return ServerTLS(live / "tls.crt", live / "tls.key", live / "ca.crt")


async def test_https_requires_a_client_certificate_from_the_ca(
    tmp_path: Path, pki: dict[str, Pair]
) -> None:
    tls = TLSContext(live_files(tmp_path, pki))
    async with served(Limits(), tls) as site:
        port = port_of(site)
        status, body, subject = await https_get(port, client_context(pki["ca"].cert, pki["client"]))
        assert (status, body, subject["commonName"]) == (200, "hello", "tidelease-extender")

        for who in (None, pki["stranger"]):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await https_get(port, client_context(pki["ca"].cert, who))

        # Plain HTTP on the HTTPS port gets nothing served.
        assert b"hello" not in await get(port)


async def test_rotated_files_are_served_to_new_connections_without_a_restart(
    tmp_path: Path, pki: dict[str, Pair]
) -> None:
    files = live_files(tmp_path, pki)
    tls = TLSContext(files)
    client = client_context(pki["ca"].cert, pki["client"])
    async with served(Limits(), tls) as site:
        port = port_of(site)
        assert (await https_get(port, client))[2]["commonName"] == "tidelease-extender"
        assert not tls.reload_if_changed()  # nothing changed

        # A half-written rotation (a key that does not match) keeps the previous credentials.
        renewed = issue(pki["ca"], tmp_path / "renewed", "tidelease-extender-renewed")
        shutil.copy(renewed.cert, files.cert_file)
        assert not tls.reload_if_changed()
        assert (await https_get(port, client))[2]["commonName"] == "tidelease-extender"

        shutil.copy(renewed.key, files.key_file)
        assert tls.reload_if_changed()
        assert (await https_get(port, client))[2]["commonName"] == "tidelease-extender-renewed"
        assert tls.reloads == 1


async def test_follow_reloads_the_files_in_the_background(
    tmp_path: Path, pki: dict[str, Pair]
) -> None:
    files = live_files(tmp_path, pki)
    tls = TLSContext(files)
    follower = asyncio.create_task(tls.follow(interval_s=0.05))
    try:
        renewed = issue(pki["ca"], tmp_path / "renewed", "renewed")
        # A Secret volume swaps a directory symlink: the paths stay, the files behind change.
        staged = tmp_path / "staged"
        staged.mkdir()
        shutil.copy(renewed.cert, staged / "tls.crt")
        shutil.copy(renewed.key, staged / "tls.key")
        shutil.copy(pki["ca"].cert, staged / "ca.crt")
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (files.cert_file.parent / name).unlink()
            (files.cert_file.parent / name).symlink_to(staged / name)
        await wait_until(lambda: tls.reloads == 1)
    finally:
        follower.cancel()


def test_unreadable_tls_files_are_one_clear_error(tmp_path: Path, pki: dict[str, Pair]) -> None:
    files = ServerTLS(pki["server"].cert, tmp_path / "missing.key", pki["ca"].cert)
    with pytest.raises(InvalidInput, match=r"missing\.key"):
        TLSContext(files)


async def test_a_port_in_use_is_one_clear_error() -> None:
    async with served(Limits()) as site:
        runner = web.AppRunner(web.Application())
        await runner.setup()
        try:
            taken = re.escape(f"cannot listen on 127.0.0.1:{port_of(site)}")
            with pytest.raises(InvalidInput, match=taken):
                await listen(runner, "127.0.0.1", port_of(site))
        finally:
            await runner.cleanup()


async def test_the_shared_runner_closes_a_connection_idle_after_its_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every server's runner (httpserving.runner) closes a kept-alive connection once it has
    been idle KEEPALIVE_S after a request (aiohttp's own default: an hour)."""
    import common.httpserving as httpserving

    monkeypatch.setattr(httpserving, "KEEPALIVE_S", 0.3)
    app = web.Application()
    app.router.add_get("/", _hello)
    shared = httpserving.runner(app)
    await shared.setup()
    try:
        site = await listen(shared, "127.0.0.1", 0, limits=Limits(first_request_s=0.3))
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(site))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        assert (await reader.readuntil(b"hello")).startswith(b"HTTP/1.1 200")
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert asyncio.get_running_loop().time() - started < 3
        writer.close()
        await wait_until(lambda: site.stats.open == 0)
    finally:
        await shared.cleanup()


async def test_no_session_tickets_are_sent(tmp_path: Path, pki: dict[str, Pair]) -> None:
    """kube-scheduler never resumes a TLS session (its client keeps no session cache), so the
    server sends no TLS 1.3 tickets: they cost work and bytes on each of its many handshakes."""
    tls = TLSContext(live_files(tmp_path, pki))
    async with served(Limits(), tls) as site:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1",
            port_of(site),
            ssl=client_context(pki["ca"].cert, pki["client"]),
            server_hostname="localhost",
        )
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            ssl_object = writer.get_extra_info("ssl_object")
            assert answer.startswith(b"HTTP/1.1 200")
            assert ssl_object.version() == "TLSv1.3"
            assert ssl_object.session is not None
            assert not ssl_object.session.has_ticket
        finally:
            writer.close()
