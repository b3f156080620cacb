"""``tidelease orchestrator``: the orchestrator as a process of its own, leader-elected among its
replicas, with /healthz, /readyz and /metrics. docs/orchestration.md describes it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

from common.coercion import as_count, as_port
from common.errors import InvalidInput

log = logging.getLogger(__name__)


def add_orchestrator_command(sub: Any) -> None:
    p = sub.add_parser(
        "orchestrator",
        help="issue framework commands once their pods are ready (docs/orchestration.md)",
    )
    p.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    p.add_argument(
        "--namespace",
        action="append",
        help="orchestrate the jobs of this namespace only; repeatable (default: all namespaces)",
    )
    p.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "tidelease-system"),
        help="namespace of the leader-election Lease (default: $POD_NAMESPACE or tidelease-system)",
    )
    # Numbers are read as text and checked together in run_command (common/coercion.py):
    # argparse's own types would stop at the first bad one.
    p.add_argument("--max-parallel", default=64, help="commands in flight at once (default 64)")
    p.add_argument(
        "--dry-run", action="store_true", help="log the commands instead of executing them"
    )
    p.add_argument(
        "--metrics-port",
        default=0,
        help="serve /healthz, /readyz and /metrics on this port (default: off)",
    )
    p.add_argument(
        "--metrics-auth",
        action="store_true",
        help="/metrics only for bearer tokens the API server allows to get /metrics",
    )
    p.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    from extender.orchestration.controller import OrchestratorSettings

    identity = os.environ.get("POD_NAME") or socket.gethostname()
    problems: list[str] = []
    max_parallel = as_count("--max-parallel", args.max_parallel, problems, minimum=1)
    args.metrics_port = as_port("--metrics-port", args.metrics_port, problems)
    if not args.lease_namespace:
        problems.append("--lease-namespace must not be empty")
    settings = OrchestratorSettings(
        namespaces=tuple(args.namespace or ()),
        identity=f"{identity}-{os.getpid()}",
        max_parallel=max_parallel if max_parallel is not None else 1,
    )
    problems += settings.validate()
    if problems:
        raise InvalidInput(problems)
    asyncio.run(_main(args, settings, identity))
    return 0


async def _serve(
    port: int, ready: asyncio.Event, registry: Any, auth: Any, host: str = "0.0.0.0"
) -> Any:
    from aiohttp import web

    from common.delegatedauth import metrics_response
    from common.httpserving import PROBE_LIMITS, listen, probe_runner

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready.is_set() else web.Response(status=503)

    async def metrics(request: web.Request) -> web.Response:
        return await metrics_response(registry, auth, request)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    runner = probe_runner(app)
    await runner.setup()
    # The kubelet's probes always get in, whoever else holds connections (common/httpserving).
    await listen(runner, host, port, limits=PROBE_LIMITS)
    return runner


async def _main(args: argparse.Namespace, settings: Any, identity: str) -> None:
    from common.delegatedauth import DelegatedAuth
    from common.kubeclient import KubeClient
    from common.leaderelection import LeaderElector
    from extender.orchestration.controller import LEASE_NAME, Orchestrator, run_orchestrator
    from extender.orchestration.metrics import OrchestratorMetrics
    from extender.orchestration.podexec import Executor, KubeExec, NullExecutor
    from extender.orchestration.storing import KubeJobStore

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    kube = await KubeClient.connect(args.kubeconfig)
    exec_client = None
    executor: Executor
    if args.dry_run:
        executor = NullExecutor()
    else:
        exec_client = await KubeExec.connect(args.kubeconfig)
        executor = exec_client
    metrics = OrchestratorMetrics()
    ready = asyncio.Event()
    auth = DelegatedAuth(kube) if args.metrics_auth else None
    runner = (
        await _serve(args.metrics_port, ready, metrics.registry, auth)
        if args.metrics_port
        else None
    )
    elector = LeaderElector(
        kube, namespace=args.lease_namespace, name=LEASE_NAME, identity=identity
    )

    async def lead() -> None:
        # A fresh controller per term: what it knows comes from the API server.
        orchestrator = Orchestrator(
            store=KubeJobStore(kube), executor=executor, settings=settings, metrics=metrics
        )
        await run_orchestrator(kube=kube, orchestrator=orchestrator)

    work = asyncio.create_task(elector.run(lead))
    ready.set()  # connected; a standby replica is ready too (it waits to lead)
    try:
        await asyncio.wait([work, asyncio.create_task(stop.wait())], return_when="FIRST_COMPLETED")
        if work.done():
            work.result()
        log.info("orchestrator %s stopping", identity)
    finally:
        ready.clear()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        if runner is not None:
            await runner.cleanup()
        if exec_client is not None:
            await exec_client.close()
        await kube.close()
