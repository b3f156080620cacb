"""Extender latency and throughput for one pod against 1,250 nodes x 8 GPUs (nodeCacheCapable).

Starts ``tidelease extender --snapshot`` on a generated cluster, pinned to one core, and drives
it from this process (pinned to another core where there is one) with the exact request bodies
kube-scheduler sends. The baseline, measured in the same run, is a bare aiohttp server on the
same core that decodes the same body and echoes the node names: the floor of HTTP plus JSON.

    python -m benchmarks.bench_extender [--nodes 1250] [--requests 2000] [--smoke]

Prints p50/p99 latency per verb (sequential calls) and calls per second (8 in flight), and the
ratio to the baseline. Targets (issue 2): p99 <= 5 ms per verb, >= 1,000 filter calls/s.
``--smoke``: 50 nodes and 50 calls per figure, to check that the benchmark still works.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from common import builders
from common.model import Allocation, GpuUuid, Holder, NodeName, PodUid, Priority, Tier
from common.objects import gpu_allocation_object

TYPES = ["H20", "H20", "H20", "A100"]
JOBS = ["recsys", "ads", "search", "feeds"]


def cluster(n_nodes: int, seed: int = 7) -> list[dict[str, Any]]:
    """A varied cluster: tiers, owner tags, standby, failures and partial allocations."""
    rng = random.Random(seed)
    # Namespace default, granted online jobs (docs/tenancy.md): the online pods are placed.
    objects: list[dict[str, Any]] = [builders.namespace("default")]
    for i in range(n_nodes):
        name = f"gpu-{i:05d}"
        gpu_type = rng.choice(TYPES)
        tier = rng.choices([Tier.HA, Tier.MA, Tier.LA], [0.7, 0.2, 0.1])[0]
        owner = rng.choice(JOBS) if rng.random() < 0.3 else None
        standby = owner is None and rng.random() < 0.05
        devs = builders.devices(name, 8, gpu_type=gpu_type, tier=tier, owner=owner, standby=standby)
        if rng.random() < 0.03:
            bad = rng.randrange(8)
            devs[bad] = builders.devices(
                name, 1, gpu_type=gpu_type, tier=tier, healthy=False, start=bad
            )[0]
        images = ["registry.example/recsys:v7"] if rng.random() < 0.2 else []
        objects.append(builders.gpu_node(name, devs, images=images))
        used = rng.choice([0, 0, 2, 4, 6, 8])
        if used:
            alloc = Allocation(
                Holder(
                    PodUid(f"uid-busy-{i}"),
                    "default",
                    f"busy-{i}",
                    Priority.LOW,
                    rng.choice([0, 100]),
                ),
                tuple(GpuUuid(d.uuid) for d in devs[:used]),
                "2026-01-01T00:00:00+00:00",
            )
            objects.append(gpu_allocation_object(NodeName(name), [alloc]))
            objects.append(
                builders.pod(
                    f"busy-{i}", used, uid=f"uid-busy-{i}", node_name=name, phase="Running"
                )
            )
    return objects


BASELINE = textwrap.dedent(
    """
    import json, sys
    from aiohttp import web
    async def echo(request):
        body = json.loads(await request.read())
        reply = {"Nodes": None, "NodeNames": body["NodeNames"], "FailedNodes": {},
                 "FailedAndUnresolvableNodes": {}, "Error": ""}
        return web.Response(body=json.dumps(reply, separators=(",", ":")).encode(),
                            content_type="application/json")
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/filter", echo)
    app.router.add_post("/prioritize", echo)
    app.router.add_get("/readyz", lambda r: web.Response(text="ok"))
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], port: int, core: int | None, log: Path) -> subprocess.Popen[bytes]:
    """``cmd`` running and ready, its output in ``log`` (shown when it does not start)."""
    if core is not None:
        cmd = ["taskset", "-c", str(core), *cmd]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    proc.wait()
    tail = log.read_text(errors="replace")[-4000:]
    raise SystemExit(f"server did not start: {cmd}\n{tail}")


def pods() -> dict[str, dict[str, Any]]:
    return {
        "online (high, HA, owner, checkpoint)": builders.pod(
            "recsys-9",
            4,
            priority=Priority.HIGH,
            owner="recsys",
            tier=Tier.HA,
            gpu_type="H20",
            checkpoint="ck-1",
            image="registry.example/recsys:v7",
            pod_priority=100000,
        ),
        "borrower (low, any)": builders.pod("finetune-9", 2, pod_priority=1000),
    }


async def measure(
    url: str, bodies: list[bytes], verb: str, n: int, inflight: int
) -> dict[str, float]:
    """Latency of n sequential calls and the rate of n calls with `inflight` at once; the
    bodies are sent in turn."""
    headers = {"Content-Type": "application/json"}
    sent = 0
    conn = aiohttp.TCPConnector(limit=inflight)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def one() -> float:
            nonlocal sent
            body = bodies[sent % len(bodies)]
            sent += 1
            t = time.perf_counter()
            async with session.post(f"{url}/{verb}", data=body, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            return time.perf_counter() - t

        for _ in range(50):  # warm-up
            await one()
        latencies = [await one() for _ in range(n)]
        start_t = time.perf_counter()
        done = 0

        async def worker() -> None:
            nonlocal done
            while done < n:
                done += 1
                await one()

        await asyncio.gather(*(worker() for _ in range(inflight)))
        rate = n / (time.perf_counter() - start_t)
    latencies.sort()
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "per_s": rate,
    }


def body_of(pod: dict[str, Any], names: list[str], variant: int | None = None) -> bytes:
    """The filter/prioritize body; a variant differs in what both verbs' answers depend on
    (pod priority for filter, checkpoint for prioritize)."""
    if variant is not None:
        meta = pod["metadata"]
        annotations = {**meta["annotations"], "tidelease.io/checkpoint": f"ck-{variant}"}
        pod = {
            **pod,
            "metadata": {**meta, "annotations": annotations},
            "spec": {**pod["spec"], "priority": variant},
        }
    return json.dumps(
        {"Pod": pod, "Nodes": None, "NodeNames": names}, separators=(",", ":")
    ).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it still runs")
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given
        parser.set_defaults(nodes=50, requests=50)
        args = parser.parse_args()

    cores = sorted(os.sched_getaffinity(0))
    server_core = cores[0] if len(cores) > 1 else None
    if len(cores) > 1:
        os.sched_setaffinity(0, {cores[1]})
    names = [f"gpu-{i:05d}" for i in range(args.nodes)]
    with tempfile.TemporaryDirectory() as tmp:
        snap = Path(tmp) / "cluster.json"
        snap.write_text(
            json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster(args.nodes)})
        )
        ext_port, base_port = free_port(), free_port()
        ext = start(
            [
                sys.executable,
                "-m",
                "common.cli",
                "--log-level",
                "ERROR",
                "extender",
                "--snapshot",
                str(snap),
                "--host",
                "127.0.0.1",
                "--port",
                str(ext_port),
            ],
            ext_port,
            server_core,
            Path(tmp) / "extender.log",
        )
        try:
            base = start(
                [sys.executable, "-c", BASELINE, str(base_port)],
                base_port,
                server_core,
                Path(tmp) / "baseline.log",
            )
        except BaseException:
            ext.terminate()
            ext.wait(timeout=10)
            raise
        try:
            print(
                f"cluster: {args.nodes} nodes x 8 GPUs; server pinned to core {server_core}, "
                f"client to core {cores[1] if len(cores) > 1 else 'any'}; "
                f"{args.requests} calls per figure"
            )
            print(
                f"{'pod':40} {'verb':16} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9} "
                f"{'base p50':>9} {'base/s':>8} {'x base p50':>10}"
            )
            for label, pod in pods().items():
                # warm: the same pod again (kube-scheduler retries, pods of one job);
                # cold: every call a new request shape, so no answer is reused across calls.
                warm = [body_of(pod, names)]
                cold = [body_of(pod, names, variant=v) for v in range(2 * args.requests + 60)]
                for verb in ("filter", "prioritize"):
                    for mode, bodies in (("warm", warm), ("cold", cold)):
                        r = asyncio.run(
                            measure(f"http://127.0.0.1:{ext_port}", bodies, verb, args.requests, 8)
                        )
                        b = asyncio.run(
                            measure(f"http://127.0.0.1:{base_port}", bodies, verb, args.requests, 8)
                        )
                        print(
                            f"{label:40} {verb + ' ' + mode:16} {r['p50_ms']:8.2f} "
                            f"{r['p99_ms']:8.2f} {r['per_s']:9.0f} {b['p50_ms']:9.2f} "
                            f"{b['per_s']:8.0f} {r['p50_ms'] / b['p50_ms']:10.2f}"
                        )
        finally:
            for proc in (ext, base):
                proc.terminate()
                proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
