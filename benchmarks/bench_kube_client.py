"""The bind path's HTTP client: binds per second and CPU per bind of KubeClient's session
against kubernetes_asyncio's own (which trusts the environment, so aiohttp reads ~/.netrc in a
worker thread for every request), measured in one run, phases alternated.

The API server is a loopback aiohttp endpoint in a process of its own that answers every POST
as kube-apiserver answers a Binding (201, a Status): what is measured is the client's cost.
``--parallel`` binds are in flight at once, as kube-scheduler's binding goroutines keep them.

    python -m benchmarks.bench_kube_client [--binds 4000] [--parallel 16] [--rounds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.kubeclient import KubeClient

SERVER = """
import sys
from aiohttp import web

async def bind(request):
    await request.read()
    return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)

app = web.Application()
app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", bind)

async def main():
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(runner.addresses[0][1], flush=True)
    import asyncio
    await asyncio.Event().wait()

import asyncio
asyncio.run(main())
"""

BINDING = {
    "apiVersion": "v1",
    "kind": "Binding",
    "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
    "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
}


async def phase(
    kubeconfig: Path, *, env_lookups: bool, binds: int, parallel: int
) -> tuple[float, float]:
    """(binds per second, CPU ms per bind) for one client."""
    kube = await KubeClient.connect(kubeconfig, env_lookups=env_lookups)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(binds):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await kube.json("POST", f"/api/v1/namespaces/ns/pods/p{i}/binding", body=BINDING)

    try:
        await kube.json("POST", "/api/v1/namespaces/ns/pods/warm/binding", body=BINDING)
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(parallel)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await kube.close()
    return binds / wall, cpu / binds * 1e3


async def run(args: argparse.Namespace, kubeconfig: Path) -> None:
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)  # alternate who goes first
        for env_lookups in order:
            results[env_lookups].append(
                await phase(
                    kubeconfig, env_lookups=env_lookups, binds=args.binds, parallel=args.parallel
                )
            )
    print(f"{args.binds} binds x {args.rounds} rounds, {args.parallel} in flight, loopback")
    print(f"{'client':<50}{'binds/s':>10}{'CPU ms/bind':>14}")
    medians = {}
    for env_lookups, label in (
        (True, "kubernetes_asyncio's session (netrc per request)"),
        (False, "KubeClient's session (no lookups)"),
    ):
        rate = statistics.median(x[0] for x in results[env_lookups])
        cpu = statistics.median(x[1] for x in results[env_lookups])
        medians[env_lookups] = (rate, cpu)
        print(f"{label:<50}{rate:>10.0f}{cpu:>14.3f}")
    (base_rate, base_cpu), (rate, cpu) = medians[True], medians[False]
    print(
        f"ratio (KubeClient / baseline): binds/s {rate / base_rate:.2f}x, CPU {cpu / base_cpu:.2f}x"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binds", type=int, default=4000)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it still runs")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(binds=200, rounds=2)
        args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = Path(tmp) / "kubeconfig"
            kubeconfig.write_text(
                "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
                f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
                "users: [{name: u, user: {token: t}}]\n"
                "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
            )
            asyncio.run(run(args, kubeconfig))
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
