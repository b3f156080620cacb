"""A FakePrometheus (extender.planner.testing) served on a loopback port, read through the real
PrometheusSource: what the planner's and the queues' tests read their metrics from."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from extender.planner.sources import PrometheusSource
from extender.planner.testing import FakePrometheus


@dataclass
class Served:
    prometheus: FakePrometheus
    source: PrometheusSource
    url: str


@contextlib.asynccontextmanager
async def served(prometheus: FakePrometheus) -> AsyncIterator[Served]:
    runner = web.AppRunner(prometheus.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    source = PrometheusSource(url, timeout_s=10.0)
    try:
        yield Served(prometheus, source, url)
    finally:
        await source.close()
        await runner.cleanup()
