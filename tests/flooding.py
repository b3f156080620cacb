"""Connection floods against a probes-and-metrics listener (issue 31), shared by the loopback test
(tests/integration/test_probe_flood.py) and the real node's (tests/e2e/test_helm_install.py).

``idle`` connections ask /healthz once with keep-alive and read the answer's head, then say
nothing; ``silent`` ones are opened and send nothing. Either is held open until the flood ends;
the server may close any of them to make room, which is what it should do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

# The floods the issue names: 64 and 1,000 connections of each kind.
FLOODS: tuple[tuple[str, int], ...] = (
    ("idle", 64),
    ("idle", 1_000),
    ("silent", 64),
    ("silent", 1_000),
)
PROBE_TIMEOUT_S = 1.0  # the kubelet's default timeoutSeconds
OPENING = 200  # connections being opened at once


async def probe(host: str, port: int, path: str = "/healthz") -> float:
    """One kubelet-style probe: a new connection, GET ``path``, the whole answer within
    PROBE_TIMEOUT_S; seconds taken. Anything but 200 in time fails."""
    start = time.perf_counter()
    async with asyncio.timeout(PROBE_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            reply = await reader.read()
        finally:
            writer.close()
    assert reply.startswith(b"HTTP/1.1 200"), (host, port, reply[:80])
    return time.perf_counter() - start


async def _hold(host: str, port: int, kind: str, held: list[asyncio.StreamWriter]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    held.append(writer)
    if kind == "idle":
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
            async with asyncio.timeout(2):
                await reader.readuntil(b"\r\n\r\n")


@dataclass
class Flood:
    kind: str
    count: int  # per target
    opened_s: float = 0.0  # seconds it took to open them all


@contextlib.asynccontextmanager
async def flooding(
    targets: Sequence[tuple[str, int]], kind: str, count: int
) -> AsyncIterator[Flood]:
    """``count`` connections of ``kind`` to each of ``targets`` (host, port), held open inside
    the block."""
    held: list[asyncio.StreamWriter] = []
    limit = asyncio.Semaphore(OPENING)

    async def one(host: str, port: int) -> None:
        async with limit:
            await _hold(host, port, kind, held)

    flood = Flood(kind, count)
    start = time.perf_counter()
    try:
        await asyncio.gather(*(one(h, p) for h, p in targets for _ in range(count)))
        flood.opened_s = time.perf_counter() - start
        yield flood
    finally:
        for writer in held:
            writer.close()


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (seconds) in milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000
