"""Node agent and extender together on a real API server: an XID on one device stops the
extender offering it within 10 s; it is offered again after recovery; a silent agent's node is
not offered at all."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from common import builders
from common.errors import Conflict
from common.kubeclient import KubeClient
from extender.cluster.kubestore import KubeStore
from extender.scheduler.driver import SchedulerDriver
from extender.scheduler.extenderserver import serve
from extender.scheduler.filtering import AGENT_SILENT
from extender.scheduler.settings import ExtenderSettings
from nodeagent.agent import AgentSettings, run_agent
from nodeagent.health import HealthSettings
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, full_gpu
from nodeagent.publishing import KubePublisher
from tests.apiserver.conftest import ApiServer

pytestmark = pytest.mark.apiserver

QUIET_S = 3.0
AGENT_TIMEOUT_S = 2.0


@dataclass
class Rig:
    node: str
    fake: FakeNvml
    driver: SchedulerDriver
    agent: asyncio.Task[None]

    async def fits(self, gpus: int) -> tuple[bool, str]:
        pod = builders.pod(f"probe-{uuid.uuid4().hex[:6]}", gpus)
        reply = await self.driver.filter(pod, [self.node])
        reasons = {**reply["FailedNodes"], **reply["FailedAndUnresolvableNodes"]}
        return self.node in (reply["NodeNames"] or []), reasons.get(self.node, "")

    async def until(self, gpus: int, want: bool, within_s: float) -> tuple[float, str]:
        """Seconds until the extender's answer for a pod of `gpus` GPUs is `want`."""
        start = time.monotonic()
        while True:
            got, reason = await self.fits(gpus)
            if got == want:
                return time.monotonic() - start, reason
            assert time.monotonic() - start < within_s, f"still {got} after {within_s} s: {reason}"
            await asyncio.sleep(0.1)


@pytest.fixture
async def rig(apiserver: ApiServer) -> AsyncIterator[Rig]:
    node = f"kwok-{uuid.uuid4().hex[:6]}"
    kube = await KubeClient.connect(apiserver.kubeconfig)
    with contextlib.suppress(Conflict):  # exists from an earlier test
        await kube.json(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": "tidelease-system"}}
        )
    fake = FakeNvml([full_gpu(i) for i in range(4)])
    settings = AgentSettings(
        node=node, health=HealthSettings(quiet_period_s=QUIET_S), cycle_s=0.5, heartbeat_s=0.5
    )
    agent = asyncio.create_task(
        run_agent(
            reader=NvmlReader(fake),
            publisher=KubePublisher(kube, node=node, namespace="tidelease-system"),
            settings=settings,
        )
    )
    store = await KubeStore.connect(apiserver.kubeconfig)
    ext = ExtenderSettings(host="127.0.0.1", port=0, agent_timeout_s=AGENT_TIMEOUT_S)
    try:
        async with serve(store=store, settings=ext) as running, aiohttp.ClientSession() as s:
            rig = Rig(node, fake, SchedulerDriver(s, running.url), agent)
            await rig.until(4, True, within_s=20)
            yield rig
    finally:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
        await store.close()
        await kube.close()


async def test_xid_stops_the_offer_within_10_s_and_recovery_restores_it(rig: Rig) -> None:
    rig.fake.inject_xid(2, 48)
    took, reason = await rig.until(4, False, within_s=10)
    assert took < 10
    assert "unhealthy" in reason
    assert (await rig.fits(3))[0]  # the three healthy devices are still offered
    back, _ = await rig.until(4, True, within_s=QUIET_S + 10)
    print(f"XID to not offered: {took:.2f} s; offered again after {back:.2f} s")


async def test_application_xid_changes_nothing(rig: Rig) -> None:
    """XID 13 (an application's fault) on device 1, then a marker: XID 48 on device 2, queued
    after it on the same event set. Once the extender no longer offers device 2, the agent has
    read both events and published what it made of them: device 1 must still be offered (three
    of the four fit), not merely "nothing changed yet"."""
    rig.fake.inject_xid(1, 13)
    rig.fake.inject_xid(2, 48)
    _, reason = await rig.until(4, False, within_s=10)
    assert "unhealthy" in reason
    assert (await rig.fits(3))[0], "device 1 taken out for an application's XID"


async def test_silent_agent_node_is_not_offered(rig: Rig) -> None:
    rig.agent.cancel()
    await asyncio.gather(rig.agent, return_exceptions=True)
    _, reason = await rig.until(1, False, within_s=AGENT_TIMEOUT_S + 10)
    assert reason == AGENT_SILENT
