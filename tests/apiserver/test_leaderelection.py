"""Leader election on a real API server: one leader at a time, and a takeover after expiry."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from common.errors import Conflict
from common.kubeclient import KubeClient
from common.leaderelection import LeaderElector
from tests.apiserver.conftest import ApiServer
from tests.polling import eventually

pytestmark = pytest.mark.apiserver


async def test_one_leader_and_takeover(apiserver: ApiServer) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    with contextlib.suppress(Conflict):
        await kube.json(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": "tidelease-system"}}
        )
    name = f"election-{uuid.uuid4().hex[:6]}"
    leading: dict[str, int] = {"a": 0, "b": 0}
    now_leading: set[str] = set()

    def elector(identity: str) -> LeaderElector:
        return LeaderElector(
            kube, namespace="tidelease-system", name=name, identity=identity, lease_s=2, renew_s=0.3
        )

    def work(identity: str):  # type: ignore[no-untyped-def]
        async def run() -> None:
            leading[identity] += 1
            now_leading.add(identity)
            try:
                await asyncio.Event().wait()
            finally:
                now_leading.discard(identity)

        return run

    a = asyncio.create_task(elector("a").run(work("a")))
    b = asyncio.create_task(elector("b").run(work("b")))
    try:

        async def someone() -> bool:
            return bool(now_leading)

        await eventually(someone, within_s=10)
        for _ in range(10):  # never two at once
            assert len(now_leading) == 1
            await asyncio.sleep(0.2)
        first = next(iter(now_leading))
        (a if first == "a" else b).cancel()  # the leader dies without releasing

        async def other_leads() -> bool:
            return now_leading == ({"b"} if first == "a" else {"a"})

        await eventually(other_leads, within_s=10)
    finally:
        for t in (a, b):
            t.cancel()
        await asyncio.gather(a, b, return_exceptions=True)
        await kube.close()
    assert leading["a"] >= 1
    assert leading["b"] >= 1
