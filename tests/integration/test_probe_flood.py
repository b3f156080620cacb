"""The kubelet's probes are answered whatever other clients do (issue 31): each probes-and-metrics
listener (the extender's, the controllers', the orchestrator's), a real server in a process of
its own on loopback, is flooded with 64 and 1,000 idle keep-alive connections (one request
answered, then nothing) and with 64 and 1,000 silent ones (opened, nothing sent), held open
(tests/flooding.py), while a probe loop (a new connection per probe, a 1 s timeout, as the
kubelet probes) asks /healthz. Every probe must get 200. Before, 64 such connections made
every probe a 503 (``PROBE_LIMITS`` refused past its cap); now the listener closes the
connection quiet the longest to admit a new one (common/httpserving.py).

``pytest -s`` prints the figures (one ``probe-flood:`` line per listener and flood: probe
latency p50/p99, and what the server's guard did).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.httpserving import PROBE_LIMITS, raise_fd_limit
from tests.flooding import FLOODS, flooding, pct, probe
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PROBES = 40  # per flood

# Each server as its command runs it: the component's own probes app, runner and listener.
LAUNCH = {
    "extender": """
        from extender.cluster.store import MemoryStore
        from extender.scheduler.extenderserver import serve
        from extender.scheduler.settings import ExtenderSettings

        async def main(port):
            settings = ExtenderSettings(
                host="127.0.0.1", port=0, probe_host="127.0.0.1", probe_port=port
            )
            async with serve(store=MemoryStore([]), settings=settings):
                print("ready", flush=True)
                await asyncio.Event().wait()
    """,
    "controllers": """
        from extender.cluster.store import MemoryStore
        from extender.controllers import Enabled, controllers
        from extender.scheduler.settings import ExtenderSettings

        async def main(port):
            settings = ExtenderSettings(probe_host="127.0.0.1", probe_port=port)
            async with controllers(
                store=MemoryStore([]), world=None, kube=None, settings=settings,
                enabled=Enabled(),
            ):
                print("ready", flush=True)
                await asyncio.Event().wait()
    """,
    "orchestrator": """
        from prometheus_client import CollectorRegistry
        from extender.orchestration.command import _serve

        async def main(port):
            ready = asyncio.Event()
            ready.set()
            await _serve(port, ready, CollectorRegistry(), None, host="127.0.0.1")
            print("ready", flush=True)
            await asyncio.Event().wait()
    """,
}


@pytest.fixture(scope="module", params=sorted(LAUNCH))
def listener(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    name = request.param
    port = free_port()
    code = "import asyncio, sys\n" + textwrap.dedent(LAUNCH[name])
    code += "\nasyncio.run(main(int(sys.argv[1])))\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == b"ready", f"{name} did not start ({proc.poll()})"
        yield name, port
        assert proc.poll() is None, f"the {name} process died"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def test_probes_are_answered_through_every_flood(listener: tuple[str, int]) -> None:
    name, port = listener
    raise_fd_limit(4096)
    baseline = [await probe("127.0.0.1", port) for _ in range(PROBES)]
    print(
        f"probe-flood: {name} no flood: p50 {pct(baseline, 0.5):.1f} ms, "
        f"p99 {pct(baseline, 0.99):.1f} ms",
        flush=True,
    )
    for kind, count in FLOODS:
        async with flooding([("127.0.0.1", port)], kind, count) as flood:
            latencies = []
            for _ in range(PROBES):
                latencies.append(await probe("127.0.0.1", port))
                await asyncio.sleep(0.01)
        print(
            f"probe-flood: {name} {count} {kind} connections held (opened in "
            f"{flood.opened_s:.2f} s, cap {PROBE_LIMITS.max_connections}): "
            f"{len(latencies)}/{PROBES} probes 200, "
            f"p50 {pct(latencies, 0.5):.1f} ms, p99 {pct(latencies, 0.99):.1f} ms",
            flush=True,
        )
        assert len(latencies) == PROBES
