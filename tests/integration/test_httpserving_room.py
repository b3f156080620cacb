"""common.httpserving, ``Limits.evict_idle`` (the probe listeners): at the cap the connection
quiet the longest is closed to admit the new one; one with a request in progress is not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from common.httpserving import GuardedSite, Limits, listen
from tests.polling import eventually

ROOMY = Limits(max_connections=3, evict_idle=True)


@asynccontextmanager
async def served(gate: asyncio.Event) -> AsyncIterator[GuardedSite]:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello")

    async def slow(_: web.Request) -> web.Response:
        await gate.wait()
        return web.Response(text="slow")

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        yield await listen(runner, "127.0.0.1", 0, limits=ROOMY)
    finally:
        gate.set()
        await runner.cleanup()


def port_of(site: GuardedSite) -> int:
    return int(site._runner.addresses[0][1])


async def opened(site: GuardedSite, n: int) -> None:
    async def check() -> bool:
        return site.stats.open == n

    await eventually(check, within_s=5, every_s=0.02)


async def get(port: int, path: str = "/") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


async def test_the_quietest_connection_makes_room_for_a_new_one() -> None:
    async with served(asyncio.Event()) as site:
        port = port_of(site)
        silent_a = await asyncio.open_connection("127.0.0.1", port)
        await opened(site, 1)
        silent_b = await asyncio.open_connection("127.0.0.1", port)
        await opened(site, 2)
        talker = await asyncio.open_connection("127.0.0.1", port)
        await opened(site, 3)

        # The oldest, silent since it opened, goes for a newcomer, which is served.
        assert (await get(port)).startswith(b"HTTP/1.1 200")
        assert await closed_by_server(silent_a[0])
        assert site.stats.evicted == 1
        assert site.stats.refused == 0

        # Heard from just now: no longer the quietest; silent_b goes first.
        talker[1].write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await talker[0].readuntil(b"hello")).startswith(b"HTTP/1.1 200")
        await opened(site, 2)  # the newcomer's connection: closed after its answer
        filler = await asyncio.open_connection("127.0.0.1", port)
        await opened(site, 3)
        assert (await get(port)).startswith(b"HTTP/1.1 200")
        assert await closed_by_server(silent_b[0])
        talker[1].write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(talker[0].read(), 5)).startswith(b"HTTP/1.1 200")
        for _, writer in (silent_a, silent_b, talker, filler):
            writer.close()


async def test_connections_with_a_request_in_progress_are_not_evicted() -> None:
    gate = asyncio.Event()
    async with served(gate) as site:
        port = port_of(site)
        slow = [asyncio.create_task(get(port, "/slow")) for _ in range(3)]
        await opened(site, 3)
        await asyncio.sleep(0.1)  # their requests are in the handler
        refused = await get(port)
        assert refused.startswith(b"HTTP/1.1 503"), refused
        assert site.stats.evicted == 0
        gate.set()
        for answer in await asyncio.gather(*slow):
            assert answer.startswith(b"HTTP/1.1 200")
