"""Hostile load against each HTTP server, each a real process on loopback (issue 16).

The extender (``tidelease extender --snapshot``, 120 GPU nodes, probes on their own port) and
the peer cache server (``run_cache_server`` in a process of its own: the agent command needs an
API server) are attacked within bounds of count and time, and measured from outside through
``/proc/<pid>/status``: resident memory (VmRSS) and its peak (VmHWM, reset before each attack
through ``/proc/<pid>/clear_refs`` where the kernel allows it).

Extender, against the Deployment's memory limit (the chart's ``extender.resources``: past it
the kernel kills the container, so staying under it is the behaviour promised, not a figure):

* oversized bodies (9 MiB declared, chunked, gzip-compressed; just under the 8 MiB cap made of
  ``{},`` in NodeNames and in Nodes.items): 413 or a 400 protocol error, never a 500; the peak
  stays under the limit;
* 250 bodies just under the cap at once, never finished: only the body budget's worth is read
  (the rest 503), small requests still served, the unfinished dropped (408) after BODY_READ_S;
* 100,000 levels of ``[`` (and of ``{"a":``): a 400 naming the nesting, never a 500;
* 3,000 idle connections to the verbs port: past ``max_connections`` they are refused (503),
  /healthz on the probes port keeps answering, never as many probes in a row past the chart's
  liveness timeout as its failureThreshold (the kubelet would not restart the extender; the
  latencies are printed, a figure, not a bound), /filter answers once they are gone;
* 20,000 distinct request shapes through /filter: memory grows by a bounded amount (the shape
  memo is an LRU).

Peer cache server: 2,000 idle connections (past its cap of 128: 503), requests without a token
or with a wrong one (401), /healthz answering again once the guard has dropped the idle ones
(the cache serves /healthz on its one port), bounded memory.

``pytest -s`` prints the figures (one ``hostile-load:`` line each).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import resource
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from common import builders
from common.model import Priority, Tier
from extender.cluster.state import MEMO_SHAPES
from extender.scheduler.handlers import BODY_BUDGET_BYTES, BODY_READ_S, MAX_BODY_BYTES
from extender.scheduler.settings import ExtenderSettings
from nodeagent.cache.peerserver import CACHE_LIMITS
from tests.chart import Probe, containers, find, probe_of, render
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "manifests" / "charts" / "tidelease" / "values.yaml"
MIB = 1 << 20
NODES = 120
IDLE_EXTENDER = 3_000
IDLE_CACHE = 2_000
SHAPES = 20_000
FILLED_AT = 6_000  # shapes asked by then: the shape memo is full
VERB_CAP = ExtenderSettings().max_connections


def memory_limit(component: str) -> int:
    """The memory limit the chart gives ``component``'s container, in bytes."""
    values = yaml.safe_load(VALUES.read_text())
    text = str(values[component]["resources"]["limits"]["memory"])
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def figure(text: str) -> None:
    print(f"hostile-load: {text}", flush=True)


# --- a process, measured from outside ---


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str  # the port attacked
    probe_url: str  # where /healthz is

    def status(self) -> dict[str, int]:
        """VmRSS and VmHWM in bytes; fails when the process has exited."""
        assert self.proc.poll() is None, f"the server exited with {self.proc.returncode}"
        out = {}
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        for key in ("VmRSS", "VmHWM"):
            match = re.search(rf"^{key}:\s+(\d+) kB$", text, re.MULTILINE)
            assert match, text
            out[key] = int(match.group(1)) * 1024
        return out

    def rss(self) -> int:
        return self.status()["VmRSS"]

    def peak(self) -> int:
        return self.status()["VmHWM"]

    def reset_peak(self) -> None:
        """Peak := now (``echo 5 > clear_refs``, Linux 4.0+); where refused, the peak stays the
        process's whole-life peak, which bounds the attack's from above."""
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_answers(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), 1) as s:
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become ready")


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


# --- the extender ---


def cluster_objects() -> list[dict[str, Any]]:
    """NODES GPU nodes of eight devices, of a few kinds (types, tiers, standby, a failed GPU),
    so that a request is judged against several node states."""
    d = builders.devices
    out = []
    for i in range(NODES):
        name = f"gpu-node-{i}"
        kind = i % 4
        if kind == 0:
            devs = d(name)
        elif kind == 1:
            devs = d(name, 4) + d(name, 4, tier=Tier.MA, start=4)
        elif kind == 2:
            devs = d(name, 4, standby=True) + d(name, 3, tier=Tier.LA, start=4)
            devs += d(name, 1, healthy=False, start=7)
        else:
            devs = d(name, gpu_type="A100", tier=Tier.MA)
        out.append(builders.gpu_node(name, devs))
    out.append(builders.namespace("default"))  # granted: its high-priority pods run
    return out


NODE_NAMES = [f"gpu-node-{i}" for i in range(NODES)]


@pytest.fixture
def extender(tmp_path: Path) -> Iterator[Server]:
    """A fresh extender for each attack: its figures are its own."""
    snap = tmp_path / "cluster.json"
    snap.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_objects()}))
    errors = tmp_path / "extender.err"
    for attempt in range(3):  # a port taken between free_port() and the bind: new ports
        port, probe_port = free_port(), free_port()
        with errors.open("w") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "common.cli",
                    "extender",
                    "--snapshot",
                    str(snap),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--probe-host",
                    "127.0.0.1",
                    "--probe-port",
                    str(probe_port),
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        server = Server(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}")
        try:
            wait_answers(server.probe_url, proc)
            break
        except AssertionError:
            server.stop()
            said = errors.read_text(errors="replace")
            if attempt == 2 or "address already in use" not in said.lower():
                raise AssertionError(f"the extender did not start:\n{said[-2000:]}") from None
    try:
        figure(f"extender RSS at start {mib(server.rss())} ({NODES} GPU nodes)")
        yield server
        assert proc.poll() is None, "the extender died"
    finally:
        server.stop()


def shaped_pod(i: int) -> dict[str, Any]:
    """The i-th of SHAPES pods of distinct request shapes (owner, GPU count, tier, type,
    priority and pod priority: each a part of the filter memo's key)."""
    tier = (None, Tier.LA, Tier.MA, Tier.HA)[i % 4]
    return builders.pod(
        f"p-{i}",
        1 + i % 8,
        uid=f"uid-{i}",
        priority=Priority.HIGH if i % 2 else Priority.LOW,
        owner=f"job-{i}",
        tier=tier,
        gpu_type=("H20", "A100", None)[i % 3],
        pod_priority=i,
        extra_annotations={"example.com/note": f"shape {i}"},
    )


def filter_body(pod: dict[str, Any]) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": NODE_NAMES}).encode()


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes
) -> tuple[int, dict[str, Any] | None]:
    async with session.post(
        url, data=body, headers={"Content-Type": "application/json"}
    ) as response:
        text = await response.read()
        try:
            reply = json.loads(text)
        except ValueError:
            reply = None
        return response.status, reply


async def raw_exchange(url: str, head: bytes, body: bytes) -> tuple[int, bytes]:
    """Send a request's head and body on a raw socket (``Connection: close``); the reply's
    status and body. The server may answer before it has read the whole body and close: what it
    answered is what counts."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        try:
            writer.write(body)
            await writer.drain()
        except ConnectionError:
            pass
        reply = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def post_head(verb: str, length: int | None) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (
        f"POST /{verb} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\n{framing}\r\n\r\n"
    ).encode()


def liveness_probe(deployment: str, container: str) -> Probe:
    return probe_of(containers(find(render(), "Deployment", deployment))[container], "liveness")


def longest_failing_run(latencies: list[float], probe: Probe) -> int:
    """The most probes in a row that took longer than the probe's timeout."""
    longest = run = 0
    for seconds in latencies:
        run = run + 1 if seconds > probe.timeout_s else 0
        longest = max(longest, run)
    return longest


async def healthz_latencies(url: str, n: int) -> list[float]:
    """``n`` sequential GET /healthz on one fresh connection each (as the kubelet probes);
    seconds each. A refused or failed probe fails the test."""
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        for _ in range(n):
            start = time.perf_counter()
            async with s.get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as r:
                assert r.status == 200, r.status
                await r.read()
            out.append(time.perf_counter() - start)
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def test_oversized_bodies(extender: Server) -> None:
    limit = memory_limit("extender")
    before = extender.rss()
    extender.reset_peak()
    big = b'{"Pod":{},"NodeNames":["' + b"x" * (9 * MIB) + b'"]}'
    # Declared: refused on the Content-Length; chunked: refused once 8 MiB are read.
    status, _ = await raw_exchange(extender.url, post_head("filter", len(big)), big)
    assert status == 413
    chunks = b"".join(b"%x\r\n%s\r\n" % (MIB, big[i : i + MIB]) for i in range(0, len(big), MIB))
    status, _ = await raw_exchange(extender.url, post_head("filter", None), chunks + b"0\r\n\r\n")
    assert status == 413
    # Compressed: 48 MiB once inflated, refused once 8 MiB are.
    bomb = gzip.compress(b'{"Pod":{},"NodeNames":[' + b"{}," * (16 * MIB) + b"{}]}", 9)
    head = post_head("filter", len(bomb)).replace(
        b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n"
    )
    status, _ = await raw_exchange(extender.url, head, bomb)
    assert status == 413
    # Just under the cap: millions of empty objects where the protocol wants names or nodes.
    pod = json.dumps(builders.pod("p", 1)).encode()
    for field, end in ((b'"NodeNames":[', b"]}"), (b'"Nodes":{"items":[', b"]}}")):
        start = b'{"Pod":' + pod + b"," + field
        n = (MAX_BODY_BYTES - len(start) - len(end) - 2) // 3
        body = start + b"{}," * n + b"{}" + end
        assert MAX_BODY_BYTES - 3 <= len(body) <= MAX_BODY_BYTES
        status, reply = await raw_exchange(extender.url, post_head("filter", len(body)), body)
        assert status == 400, (field, status, reply)
        assert json.loads(reply)["Error"].startswith("tidelease: "), reply
    peak = extender.peak()
    figure(
        f"extender oversized bodies: RSS before {mib(before)}, peak {mib(peak)}, "
        f"after {mib(extender.rss())} (limit {mib(limit)})"
    )
    assert peak < limit
    assert await healthz_latencies(extender.probe_url, 1)


async def test_many_large_bodies_at_once(extender: Server) -> None:
    """250 clients each start a body just under the cap: only what the body budget allows is
    read (the rest is answered 503 at once, on the head); those send all but the last byte and
    wait. Small requests are still served meanwhile, and the bodies never finished are dropped
    after BODY_READ_S."""
    limit = memory_limit("extender")
    clients = VERB_CAP - 6
    body = b'{"Pod":{},"NodeNames":["' + b"x" * (MAX_BODY_BYTES - 40) + b'"]}'
    admitted = BODY_BUDGET_BYTES // len(body)
    host, port = extender.url.removeprefix("http://").split(":")
    before = extender.rss()
    extender.reset_peak()
    start = time.monotonic()
    streams = []
    for _ in range(clients):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(post_head("filter", len(body)) + body[:MIB])
        streams.append((reader, writer))

    async def status(reader: asyncio.StreamReader) -> int:
        line = await asyncio.wait_for(reader.readline(), BODY_READ_S + 20)
        return int(line.split()[1]) if line else 0

    tasks = [asyncio.create_task(status(reader)) for reader, _ in streams]
    try:
        await asyncio.sleep(1.0)
        refused = sum(1 for t in tasks if t.done() and t.result() == 503)
        for task, (_, writer) in zip(tasks, streams, strict=True):
            if not task.done():
                writer.write(body[MIB:-1])
        await asyncio.sleep(1.0)
        held_peak = extender.peak()
        # Meanwhile kube-scheduler's usual calls (small bodies) are served ...
        async with aiohttp.ClientSession() as session:
            status_small, reply = await post(
                session, f"{extender.url}/filter", filter_body(builders.pod("small", 1))
            )
        assert status_small == 200, reply
        latencies = await healthz_latencies(extender.probe_url, 20)
        # ... and the bodies never finished are given up on.
        statuses = await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
    finally:
        for _, writer in streams:
            writer.close()
    assert refused == clients - admitted, (refused, admitted)
    assert sorted(statuses) == [408] * admitted + [503] * (clients - admitted)
    peak = extender.peak()
    figure(
        f"extender {clients} bodies of {mib(len(body))} at once, never finished: {admitted} read "
        f"(budget {mib(BODY_BUDGET_BYTES)}), {refused} refused (503), the {admitted} dropped "
        f"(408) after {elapsed:.1f} s; RSS before {mib(before)}, peak while held "
        f"{mib(held_peak)}, peak {mib(peak)} (limit {mib(limit)}); /healthz meanwhile p50 "
        f"{p(latencies, 0.5) * 1e3:.2f} ms"
    )
    # Without the budget: every body read at once, clients x 8 MiB (about 2 GiB).
    assert peak - before < 3 * BODY_BUDGET_BYTES
    assert peak < limit


async def test_deeply_nested_bodies(extender: Server) -> None:
    depth = 100_000
    bodies = {
        "lists": b"[" * depth + b"]" * depth,
        "objects": b'{"a":' * depth + b"1" + b"}" * depth,
        "in Pod": b'{"Pod":' + b"[" * depth + b"]" * depth + b',"NodeNames":[]}',
        "unclosed": b'{"Pod":{"spec":' + b"[" * depth,
    }
    async with aiohttp.ClientSession() as session:
        for what, body in bodies.items():
            for verb in ("filter", "prioritize", "preempt", "bind"):
                status, reply = await post(session, f"{extender.url}/{verb}", body)
                assert status == 400, (what, verb, status, reply)
                assert reply is not None
                assert reply["Error"].startswith("tidelease: request body is not valid JSON"), (
                    what,
                    verb,
                    reply,
                )
    assert await healthz_latencies(extender.probe_url, 1)
    figure(f"extender nested bodies ({depth:,} levels): 400 each, RSS {mib(extender.rss())}")


@dataclass
class Held:
    socks: list[socket.socket]
    refused: int  # answered 503 and closed by the server
    connect_s: float


def raise_own_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.fail(f"the open-files hard limit {hard} is under the {wanted} this test needs")
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def open_idle(url: str, n: int) -> Held:
    """Open ``n`` connections that never send a byte, in batches (the listen backlog is
    bounded); then sort them: those the server refused (it wrote 503 and closed) from those it
    holds."""
    host, port = url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    start = time.perf_counter()

    async def one() -> None:
        s = socket.socket()
        s.setblocking(False)
        socks.append(s)
        await asyncio.wait_for(loop.sock_connect(s, (host, int(port))), 10)

    for i in range(0, n, 100):
        await asyncio.gather(*(one() for _ in range(min(100, n - i))))
    connect_s = time.perf_counter() - start
    await asyncio.sleep(0.5)  # the server's accepts and refusals
    held, refused = [], 0
    for s in socks:
        try:
            data = s.recv(256)
        except BlockingIOError:
            held.append(s)
            continue
        assert data.startswith(b"HTTP/1.1 503") or data == b"", data
        refused += 1
        s.close()
    return Held(held, refused, connect_s)


async def test_thousands_of_idle_connections(extender: Server) -> None:
    raise_own_fd_limit(IDLE_EXTENDER + 1024)
    limit = memory_limit("extender")
    before = extender.rss()
    extender.reset_peak()
    quiet = await healthz_latencies(extender.probe_url, 50)
    # /healthz probed throughout the storm of connections ...
    during_task = asyncio.create_task(healthz_latencies(extender.probe_url, 100))
    held = await open_idle(extender.url, IDLE_EXTENDER)
    during = await during_task
    try:
        assert len(held.socks) == VERB_CAP, (len(held.socks), held.refused)
        assert held.refused == IDLE_EXTENDER - VERB_CAP
        # ... and while the cap is held by idle clients.
        holding = await healthz_latencies(extender.probe_url, 200)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{extender.url}/filter", data=b"{}") as r,
        ):
            assert r.status == 503  # the verbs' port is full: a clear refusal
        peak = extender.peak()
    finally:
        for s in held.socks:
            s.close()
    await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as session:
        status, reply = await post(
            session, f"{extender.url}/filter", filter_body(builders.pod("after", 1))
        )
    assert status == 200, (status, reply)
    assert reply is not None
    assert reply["NodeNames"], reply
    figure(
        f"extender {IDLE_EXTENDER:,} idle connections: {len(held.socks)} held, {held.refused:,} "
        f"refused (503), opened in {held.connect_s:.2f} s; RSS before {mib(before)}, peak "
        f"{mib(peak)}, after {mib(extender.rss())}"
    )
    for what, values in (("quiet", quiet), ("during the storm", during), ("held", holding)):
        figure(
            f"extender /healthz latency, {what}: p50 {p(values, 0.5) * 1e3:.2f} ms, "
            f"p99 {p(values, 0.99) * 1e3:.2f} ms, max {max(values) * 1e3:.2f} ms "
            f"({len(values)} probes)"
        )
    assert peak < limit
    # What the chart promises of the storm: the kubelet would not have restarted the extender.
    # Its liveness probe fails only after failure_threshold probes in a row go unanswered
    # within its timeout; how fast /healthz answers is the figure printed above, not a bound.
    probe = liveness_probe("tidelease-extender", "extender")
    for what, values in (("during the storm", during), ("held", holding)):
        assert longest_failing_run(values, probe) < probe.failure_threshold, (what, probe)


async def test_twenty_thousand_request_shapes(extender: Server) -> None:
    limit = memory_limit("extender")
    before = extender.rss()
    extender.reset_peak()
    sample: dict[int, int] = {}
    start = time.perf_counter()
    queue = iter(range(SHAPES))
    bad: list[tuple[int, int, Any]] = []
    passed: dict[int, int] = {}

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in queue:
            status, reply = await post(
                session, f"{extender.url}/filter", filter_body(shaped_pod(i))
            )
            if status != 200 or reply is None or reply.get("Error"):
                bad.append((i, status, reply))
            else:
                passed[i] = len(reply["NodeNames"] or ())
            if i % 1_000 == 0:
                sample[i] = extender.rss()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(4)))
    elapsed = time.perf_counter() - start
    assert not bad, bad[:3]
    after = extender.rss()
    peak = extender.peak()
    latencies = await healthz_latencies(extender.probe_url, 20)
    figure(
        f"extender {SHAPES:,} request shapes through /filter ({NODES} nodes) in {elapsed:.1f} s: "
        f"RSS before {mib(before)}, after {mib(after)} (+{mib(after - before)}), peak "
        f"{mib(peak)}; /healthz after p50 {statistics.median(latencies) * 1e3:.2f} ms"
    )
    fits = sum(1 for n in passed.values() if n)
    figure(f"extender shapes: {fits:,} fit some node, {SHAPES - fits:,} none")
    figure(
        "extender RSS by shapes asked: "
        + ", ".join(f"{i:,}: {mib(v)}" for i, v in sorted(sample.items()) if i % 4_000 == 0)
    )
    assert peak < limit
    # Once the shape memo is full (MEMO_SHAPES), memory stays flat: without its bound it grows
    # by about 2 KB a shape here (44 MiB over the 20,000), 13 KB at 1,250 nodes.
    full = sample[FILLED_AT]
    assert after - full < 8 * MIB, (mib(full), mib(after))
    assert after - before < 32 * MIB
    assert 2 * MEMO_SHAPES <= FILLED_AT  # the memo was full there


# --- the peer cache server ---

# The agent command needs an API server; the cache server runs alone as the agent runs it.
CACHE_MAIN = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from nodeagent.cache.peerserver import ServeSettings, run_cache_server
    from nodeagent.cache.cachestore import CacheStore
    from nodeagent.cache.testing import KnownTokens

    async def main() -> None:
        bound: list[int] = []
        ready = asyncio.Event()
        settings = ServeSettings(host="127.0.0.1", port=0)
        verifier = KnownTokens(Path(sys.argv[2]))
        store = CacheStore(Path(sys.argv[1]), max_bytes=1 << 30)
        task = asyncio.create_task(
            run_cache_server(
                store=store, settings=settings, verifier=verifier, ready=ready, bound=bound
            )
        )
        await ready.wait()
        print(bound[0], flush=True)
        await task

    asyncio.run(main())
    """
)


@pytest.fixture
def cache_server(tmp_path: Path) -> Iterator[tuple[Server, str]]:
    from nodeagent.cache.testing import write_token

    token = write_token(tmp_path / "token")
    (tmp_path / "cache").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", CACHE_MAIN, str(tmp_path / "cache"), str(tmp_path / "token")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip().isdigit(), line
        url = f"http://127.0.0.1:{int(line)}"
        server = Server(proc, url, url)
        figure(f"cache server RSS at start {mib(server.rss())}")
        yield server, token
        assert proc.poll() is None, "the cache server died"
    finally:
        server.stop()
        if proc.stdout:
            proc.stdout.close()


async def get_status(url: str, headers: dict[str, str] | None = None) -> int:
    timeout = aiohttp.ClientTimeout(total=5)
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        session.get(url, headers=headers) as r,
    ):
        await r.read()
        return r.status


async def test_cache_server_under_hostile_load(cache_server: tuple[Server, str]) -> None:
    server, token = cache_server
    limit = memory_limit("agent")
    raise_own_fd_limit(IDLE_CACHE + 1024)
    before = server.rss()
    server.reset_peak()
    inventory = f"{server.url}/v1/inventory"
    # Credentials: none, or wrong ones, 401 each; the right one, 200.
    wrong = [
        {},
        {"Authorization": f"Bearer {token[:-1]}"},
        {"Authorization": f"Bearer {token}x"},
        {"Authorization": f"Basic {token}"},
        {"Authorization": token},
        {"Authorization": "Bearer " + "A" * 8000},
    ]
    for headers in wrong * 50:
        assert await get_status(inventory, headers) == 401, headers
    assert await get_status(inventory, {"Authorization": f"Bearer {token}"}) == 200
    # Idle connections: the cap held, the rest refused.
    held = await open_idle(server.url, IDLE_CACHE)
    try:
        assert len(held.socks) == CACHE_LIMITS.max_connections, (len(held.socks), held.refused)
        assert held.refused == IDLE_CACHE - CACHE_LIMITS.max_connections
        # /healthz shares the port: refused while the cap is held, answered again once the
        # guard has dropped the idle connections (first_request_s), though their clients keep
        # them open.
        assert await get_status(f"{server.url}/healthz") == 503
        start = time.monotonic()
        while await get_status(f"{server.url}/healthz") != 200:
            assert time.monotonic() - start < CACHE_LIMITS.first_request_s + 5
            await asyncio.sleep(0.2)
        recovered_s = time.monotonic() - start
        latencies = await healthz_latencies(server.url, 100)
        assert await get_status(inventory, {"Authorization": f"Bearer {token}"}) == 200
    finally:
        for s in held.socks:
            s.close()
    peak = server.peak()
    figure(
        f"cache server: {len(wrong) * 50} requests without a valid token, 401 each; "
        f"{IDLE_CACHE:,} idle connections: {len(held.socks)} held, {held.refused:,} refused "
        f"(503); /healthz 503 while the cap is held, 200 again after {recovered_s:.1f} s (idle "
        f"ones dropped), then p50 {p(latencies, 0.5) * 1e3:.2f} ms, p99 "
        f"{p(latencies, 0.99) * 1e3:.2f} ms; RSS before {mib(before)}, peak {mib(peak)}, after "
        f"{mib(server.rss())} (agent limit {mib(limit)})"
    )
    assert peak < limit
    assert peak - before < 32 * MIB
