"""A real extender HTTP server on a free loopback port, over an in-memory store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from common import builders
from common.model import Priority, Tier
from extender.cluster.store import MemoryStore
from extender.scheduler.extenderserver import Running, serve
from extender.scheduler.settings import ExtenderSettings


@dataclass
class Server:
    running: Running
    store: MemoryStore
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.running.url

    async def post_raw(self, verb: str, data: bytes | str) -> tuple[int, Any]:
        async with self.session.post(
            f"{self.url}/{verb}", data=data, headers={"Content-Type": "application/json"}
        ) as resp:
            return resp.status, await resp.json(content_type=None)

    async def post(self, verb: str, body: object) -> tuple[int, Any]:
        async with self.session.post(f"{self.url}/{verb}", json=body) as resp:
            return resp.status, await resp.json(content_type=None)


def small_cluster() -> list[dict[str, Any]]:
    d = builders.devices
    return [
        builders.namespace("default"),  # granted online jobs: hp-a may run as high priority
        builders.gpu_node("node-a", checkpoints=["ck"]),
        builders.gpu_node("node-b", d("node-b", 8, owner="job-b")),
        builders.gpu_node("node-c", d("node-c", 4) + d("node-c", 4, healthy=False, start=4)),
        builders.gpu_node("node-s", d("node-s", 8, standby=True)),
        builders.gpu_node("node-la", d("node-la", 8, tier=Tier.LA)),
        builders.pod(
            "hp-a",
            4,
            uid="uid-hp-a",
            priority=Priority.HIGH,
            owner="job-a",
            tier=Tier.HA,
            pod_priority=1000,
            checkpoint="ck",
        ),
        builders.pod("borrower", 8, uid="uid-borrower", pod_priority=10),
    ]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    store = MemoryStore(small_cluster())
    settings = ExtenderSettings(host="127.0.0.1", port=0)
    async with serve(store=store, settings=settings) as running, aiohttp.ClientSession() as s:
        yield Server(running, store, s)
