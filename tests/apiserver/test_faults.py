"""Faults of the real control plane, as the extender sees them: etcd paused (the API server up,
its /readyz failing, the watches still connected), and the API server restarted (its port
closed, the watches cut). /readyz turns unready within stale_after_s, a bind meanwhile answers
with the protocol's Error before kube-scheduler's timeout, and the extender is ready again, its
watches resumed, soon after the API server is back. The times are printed (pytest -s)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from common import builders, contract
from common.kubeclient import WATCH_BACKOFF_MAX_S, KubeClient
from extender.cluster.kubestore import KubeStore
from extender.scheduler.extenderserver import serve
from extender.scheduler.settings import ExtenderSettings
from tests.apiserver.conftest import ApiServer, one_pid

pytestmark = pytest.mark.apiserver

STALE_AFTER_S = 3.0
BIND_TIMEOUT_S = 4.0


def etcd_pid(apiserver: ApiServer) -> int:
    return one_pid(f"--data-dir={apiserver.dir}/etcd", f"etcd of {apiserver.dir}")


async def _bind_nobody(s: aiohttp.ClientSession, url: str) -> tuple[float, dict[str, str]]:
    start = time.monotonic()
    pod = builders.pod("nobody", 1)
    body = {
        "PodName": "nobody",
        "PodNamespace": "default",
        "PodUID": pod["metadata"]["uid"],
        "Node": "n",
    }
    async with s.post(f"{url}/bind", json=body) as r:
        reply: dict[str, str] = await r.json()
    return time.monotonic() - start, reply


async def until(probe: object, want: int, session: aiohttp.ClientSession, url: str) -> float:
    """Seconds until GET url answers ``want`` (polled every 0.1 s, at most 30 s)."""
    start = time.monotonic()
    while True:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == want:
                    return time.monotonic() - start
        except (aiohttp.ClientError, TimeoutError):
            pass
        assert time.monotonic() - start < 30, f"{url} not {want} after 30 s ({probe})"
        await asyncio.sleep(0.1)


async def test_etcd_paused_turns_the_extender_unready_and_binds_answer_in_time(
    apiserver: ApiServer,
) -> None:
    store = await KubeStore.connect(Path(apiserver.kubeconfig))
    settings = ExtenderSettings(
        host="127.0.0.1", port=0, stale_after_s=STALE_AFTER_S, bind_timeout_s=BIND_TIMEOUT_S
    )
    pid = etcd_pid(apiserver)
    try:
        async with serve(store=store, settings=settings) as running, aiohttp.ClientSession() as s:
            ready = f"{running.url}/readyz"
            await until("ready at first", 200, s, ready)
            os.kill(pid, signal.SIGSTOP)
            try:
                unready_s = await until("etcd paused", 503, s, ready)
                bind_s, reply = await _bind_nobody(s, running.url)
            finally:
                os.kill(pid, signal.SIGCONT)
            ready_s = await until("etcd back", 200, s, ready)
    finally:
        os.kill(pid, signal.SIGCONT)
        await store.close()
    print(
        f"\netcd paused: unready after {unready_s:.1f} s (threshold {STALE_AFTER_S:g} s); "
        f"a bind answered in {bind_s:.1f} s: {reply['Error']!r}; "
        f"ready again {ready_s:.1f} s after etcd resumed"
    )
    assert unready_s < STALE_AFTER_S + 3 + 2  # the threshold, a probe's timeout, a poll
    assert bind_s < 10  # kube-scheduler's httpTimeout in the chart
    assert reply["Error"]
    assert ready_s < 10


RECOVERY_BOUND_S = 15.0  # a probe interval and a watch backoff (<= WATCH_BACKOFF_MAX_S) fit


async def test_api_server_restarted_turns_the_extender_unready_and_it_recovers_in_time(
    apiserver: ApiServer,
) -> None:
    store = await KubeStore.connect(Path(apiserver.kubeconfig))
    settings = ExtenderSettings(
        host="127.0.0.1", port=0, stale_after_s=STALE_AFTER_S, bind_timeout_s=BIND_TIMEOUT_S
    )
    node = f"restart-{os.getpid()}-{int(time.time())}"
    argv: list[str] | None = None
    try:
        async with serve(store=store, settings=settings) as running, aiohttp.ClientSession() as s:
            ready = f"{running.url}/readyz"
            await until("ready at first", 200, s, ready)
            # Seconds from SIGTERM to an unready extender: its listener may close at once, or
            # only when the process dies.
            argv = apiserver.apiserver_argv()
            how, unready_s = await asyncio.gather(
                apiserver.stop_apiserver(), until("API server stopped", 503, s, ready)
            )
            try:
                bind_s, reply = await _bind_nobody(s, running.url)
            finally:
                apiserver.start_apiserver(argv)
            await apiserver.wait_ready()
            recovery_s = await until("API server back", 200, s, ready)
            # Ready means the view is current again: a GpuNode made after the restart reaches
            # the extender through its resumed watch.
            kube = await KubeClient.connect(Path(apiserver.kubeconfig))
            try:
                start = time.monotonic()
                gpn = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
                await kube.json(
                    "POST", gpn, body=builders.gpu_node(node, builders.devices(node, 2))
                )
                while running.app.cluster.get(node) is None:
                    assert time.monotonic() - start < RECOVERY_BOUND_S, "watch did not resume"
                    await asyncio.sleep(0.1)
                watch_s = time.monotonic() - start
                await kube.json("DELETE", f"{gpn}/{node}")
            finally:
                await kube.close()
    finally:
        if argv is not None and not apiserver.restarted:
            with contextlib.suppress(AssertionError):  # not stopped after all
                await apiserver.stop_apiserver()
            apiserver.start_apiserver(argv)  # never leave the session's API server down
            await apiserver.wait_ready()
        await store.close()
    print(
        f"\nAPI server restarted ({how}): unready after {unready_s:.1f} s (threshold"
        f" {STALE_AFTER_S:g} s); a bind answered in {bind_s:.1f} s: {reply['Error']!r}; ready"
        f" again {recovery_s:.1f} s after the API server's own /readyz (watch backoff at most"
        f" {WATCH_BACKOFF_MAX_S:g} s); a new GpuNode seen {watch_s:.1f} s after it was made"
    )
    assert unready_s < STALE_AFTER_S + 3 + 2  # the threshold, a probe's timeout, a poll
    assert bind_s < BIND_TIMEOUT_S + 2  # the bind timeout, not kube-scheduler's 10 s
    assert reply["Error"]
    assert recovery_s < RECOVERY_BOUND_S
    assert watch_s < RECOVERY_BOUND_S
