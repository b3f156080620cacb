"""KubeClient.list_watch against an API server that cuts a watch off mid-event: the watch is
relisted and goes on, it never ends in silence (its consumer would stop learning of changes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from common.kubeclient import KubeClient
from tests.kubeconfigs import write_kubeconfig


def lease(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


class FlakyApiServer:
    """Lists one object; the first watch sends half an event and hangs up; later watches send
    a MODIFIED event and stay open."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            self.lists += 1
            return web.json_response(
                {"metadata": {"resourceVersion": "1"}, "items": [lease("a", "1")]}
            )
        self.watches += 1
        resp = web.StreamResponse()
        await resp.prepare(request)
        if self.watches == 1:
            await resp.write(b'{"type": "MODIFIED", "object": {"metadata": {"na')
            return resp
        event = {"type": "MODIFIED", "object": lease("a", "2")}
        await resp.write(json.dumps(event).encode() + b"\n")
        await asyncio.sleep(1)
        return resp


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[tuple[KubeClient, FlakyApiServer]]:
    server = FlakyApiServer()
    app = web.Application()
    app.router.add_get("/apis/tidelease.io/v1alpha1/gpuleases", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}", "t")
    client = await KubeClient.connect(kubeconfig)
    try:
        yield client, server
    finally:
        await client.close()
        await runner.cleanup()


async def test_a_watch_cut_off_mid_event_is_relisted_and_goes_on(
    kube: tuple[KubeClient, FlakyApiServer],
) -> None:
    client, server = kube
    seen: list[tuple[str, str]] = []

    async def consume() -> None:
        async for event, obj in client.list_watch("/apis/tidelease.io/v1alpha1/gpuleases"):
            version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            seen.append((event, version))
            if event == "MODIFIED":
                return

    await asyncio.wait_for(consume(), 10)
    assert seen == [
        ("ADDED", "1"),
        ("SYNCED", ""),
        ("ADDED", "1"),
        ("SYNCED", ""),
        ("MODIFIED", "2"),
    ]
    assert (server.lists, server.watches) == (2, 2)
