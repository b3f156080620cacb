"""The control plane's processes, wired: ``tidelease extender`` (the scheduler extender and the
controllers it runs), ``orchestrator``, ``simulate``, ``plan-simulate``, ``demo`` and
``demo-snapshot``. :func:`register` adds them to the ``tidelease`` command (common/cli.py finds
it through the ``tidelease.commands`` entry point).

Every controller of the extender process is enabled the same way: a settings key (file, or
``TIDELEASE_EXTENDER_<KEY>``) or its flag (``--leasing-controller``, ``--hot-restart-operator``,
``--prewarm-controller``, ``--planner``); docs/reference.md lists them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import InvalidInput

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from common.kubeclient import KubeClient
    from common.leaderelection import LeaderElector
    from extender.planner.stepping import PlannerSettings
    from extender.prewarm.policy import PrewarmSettings

log = logging.getLogger("tidelease")

# The controllers the extender process may run: settings key -> what its flag says.
CONTROLLERS = {
    "leasing_controller": "also run the leasing controller (leader-elected among the replicas)",
    "hot_restart_operator": "also run the hot-restart operator (leader-elected; "
    "docs/hot-restart.md)",
    "prewarm_controller": "also run the prewarm controller: nodes fetch images and checkpoints "
    "ahead of GpuLease scale-ups (leader-elected; docs/hot-restart.md, Prewarming)",
    "planner": "also run the live elastic planner: GpuLeases annotated tidelease.io/planner=true "
    "get spec.desiredGPUs from their Prometheus metrics (leader-elected; docs/planner.md)",
}


def _extender(args: argparse.Namespace) -> int:
    from extender.cluster.snapshot import load_snapshot
    from extender.scheduler.serving import run_extender
    from extender.scheduler.settings import load_settings

    settings = load_settings(
        file=args.config,
        overrides={
            "host": args.host,
            "port": args.port,
            "probe_host": args.probe_host,
            "probe_port": args.probe_port,
            "tls_cert_file": args.tls_cert_file,
            "tls_key_file": args.tls_key_file,
            "client_ca_file": args.client_ca_file,
            "snapshot": args.snapshot,
            "kubeconfig": args.kubeconfig,
            **{name: True for name in CONTROLLERS if getattr(args, name)},
        },
    )
    prewarm_settings = _prewarm_settings(args) if settings.prewarm_controller else None
    planner_settings = _planner_settings(args) if settings.planner else None
    # One registry for the process: /metrics serves the extender's, the leasing and the
    # prewarm controllers' metrics.
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if settings.snapshot is not None:
            store = load_snapshot(settings.snapshot)
            log.info("offline mode: serving the objects of %s", settings.snapshot)
            await run_extender(store=store, settings=settings, stop=stop, drain_s=0.0)
            return
        from common.kubeclient import KubeClient
        from extender.cluster.kubestore import KubeStore
        from extender.leasing.controller import KubeWorld
        from extender.scheduler.serving import Leasing

        kube = await KubeStore.connect(settings.kubeconfig, settings.agent_namespace)
        writer = await KubeClient.connect(settings.kubeconfig)
        leasing = None
        if settings.leasing_controller:
            elector = _elector(writer, settings.agent_namespace, "tidelease-leasing-controller")
            leasing = Leasing(KubeWorld(writer), elector)
        operator = None
        if settings.hot_restart_operator:
            operator = asyncio.create_task(
                _hot_restart_operator(writer, settings.agent_namespace, registry)
            )
        prewarm = None
        if prewarm_settings is not None:
            prewarm = asyncio.create_task(
                _prewarm_controller(writer, settings.agent_namespace, prewarm_settings, registry)
            )
        planner = None
        if planner_settings is not None:
            planner = asyncio.create_task(
                _planner(
                    writer,
                    settings.agent_namespace,
                    planner_settings,
                    args.planner_prometheus,
                    registry,
                )
            )
        try:
            await run_extender(
                store=kube,
                settings=settings,
                stop=stop,
                leasing=leasing,
                registry=registry,
                reviewer=writer,
            )
        finally:
            for task in (operator, prewarm, planner):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            await kube.close()
            await writer.close()

    asyncio.run(main())
    return 0


def _elector(kube: KubeClient, namespace: str, lease: str) -> LeaderElector:
    """Leader election among the extender replicas on the Lease ``lease`` (identity: the pod's
    name, else the host's)."""
    from common.leaderelection import LeaderElector

    identity = os.environ.get("POD_NAME") or socket.gethostname()
    return LeaderElector(kube, namespace=namespace, name=lease, identity=identity)


async def _hot_restart_operator(
    kube: KubeClient, namespace: str, registry: CollectorRegistry
) -> None:
    """The hot-restart operator, leader-elected among the extender replicas."""
    from extender.hotrestart.operator import (
        LEASE_NAME,
        HotRestartOperator,
        KubeRequests,
        run_hot_restart_operator,
    )

    operator = HotRestartOperator(requests=KubeRequests(kube))
    await _elector(kube, namespace, LEASE_NAME).run(
        lambda: run_hot_restart_operator(kube=kube, operator=operator, registry=registry)
    )


def _prewarm_settings(args: argparse.Namespace) -> PrewarmSettings:
    from extender.prewarm.controller import parse_bandwidths
    from extender.prewarm.policy import PrewarmSettings

    base = PrewarmSettings()
    settings = PrewarmSettings(
        bandwidths=parse_bandwidths(args.prewarm_bandwidths or "", base.bandwidths),
        margin_s=args.prewarm_margin,
        horizon_s=args.prewarm_horizon,
    )
    problems = settings.validate()
    if problems:
        raise InvalidInput(problems)
    return settings


async def _prewarm_controller(
    kube: KubeClient, namespace: str, settings: PrewarmSettings, registry: CollectorRegistry
) -> None:
    """The prewarm controller, leader-elected among the extender replicas; its metrics go to
    ``registry`` (the one the extender's /metrics serves)."""
    from extender.prewarm.controller import (
        LEASE_NAME,
        KubePrewarmWorld,
        PrewarmController,
        PrewarmMetrics,
        run_prewarm_controller,
    )

    metrics = PrewarmMetrics(registry)

    async def lead() -> None:
        controller = PrewarmController(
            world=KubePrewarmWorld(kube), metrics=metrics, settings=settings
        )
        await run_prewarm_controller(kube=kube, controller=controller)

    await _elector(kube, namespace, LEASE_NAME).run(lead)


def _planner_settings(args: argparse.Namespace) -> PlannerSettings:
    from extender.planner.autoscaling import OnlineSettings
    from extender.planner.stepping import PlannerSettings

    settings = PlannerSettings(
        online=OnlineSettings(
            step_s=args.planner_step, lead_s=args.planner_lead, headroom=args.planner_headroom
        ),
        history_s=args.planner_history,
    )
    problems = settings.validate()
    if not args.planner_prometheus.startswith(("http://", "https://")):
        problems.append("--planner-prometheus: want an http:// or https:// URL")
    if problems:
        raise InvalidInput(problems)
    return settings


async def _planner(
    kube: KubeClient,
    namespace: str,
    settings: PlannerSettings,
    prometheus: str,
    registry: CollectorRegistry,
) -> None:
    """The live elastic planner (docs/planner.md), leader-elected among the extender
    replicas; its metrics go to ``registry``."""
    from extender.planner.controller import (
        LEASE_NAME,
        KubeLeaseWriter,
        PlannerController,
        PlannerMetrics,
        run_planner_controller,
    )
    from extender.planner.sources import PrometheusSource

    metrics = PlannerMetrics(registry)

    async def lead() -> None:
        source = PrometheusSource(prometheus)
        try:
            controller = PlannerController(
                source=source, writer=KubeLeaseWriter(kube), metrics=metrics, settings=settings
            )
            await run_planner_controller(kube=kube, controller=controller)
        finally:
            await source.close()

    await _elector(kube, namespace, LEASE_NAME).run(lead)


def _simulate(args: argparse.Namespace) -> int:
    from extender.simulation import cli as simulation

    p = argparse.ArgumentParser(
        prog="tidelease simulate",
        description="Compare leasing policies on a trace of tides, failures and borrowers; "
        "size the standby pool.",
    )
    simulation.add_arguments(p)
    code: int = simulation.run(p.parse_args(args.rest))
    return code


def _plan_simulate(args: argparse.Namespace) -> int:
    from extender.simulation import plannercli as command

    code: int = command.run(args)
    return code


def _demo(args: argparse.Namespace) -> int:
    from extender.demo import run_demo

    asyncio.run(run_demo())
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    """Write the demo cluster as a List, a starting point for --snapshot files."""
    import yaml

    from extender.demo import demo_objects

    yaml.safe_dump(
        {"apiVersion": "v1", "kind": "List", "items": demo_objects()}, sys.stdout, sort_keys=False
    )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the control plane's commands to ``tidelease``."""
    ext = sub.add_parser("extender", help="run the kube-scheduler extender")
    ext.add_argument("--config", type=Path, help="settings file (YAML)")
    ext.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    ext.add_argument("--port", type=int, help="port to listen on (default 8888)")
    ext.add_argument(
        "--probe-port",
        type=int,
        help="serve /healthz, /readyz and /metrics on this port instead (on --probe-host, "
        "default 0.0.0.0), so the verbs can listen on loopback only",
    )
    ext.add_argument("--probe-host", help="address of --probe-port (default 0.0.0.0)")
    ext.add_argument(
        "--tls-cert-file", type=Path, help="serve the verbs over HTTPS with this certificate"
    )
    ext.add_argument("--tls-key-file", type=Path, help="the key of --tls-cert-file")
    ext.add_argument(
        "--client-ca-file",
        type=Path,
        help="with HTTPS, require a client certificate signed by this CA (kube-scheduler's)",
    )
    ext.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    ext.add_argument(
        "--snapshot",
        type=Path,
        help="offline mode: serve the objects of this YAML/JSON List instead of an API server",
    )
    for name, what in CONTROLLERS.items():
        ext.add_argument("--" + name.replace("_", "-"), action="store_true", help=what)
    ext.add_argument(
        "--prewarm-margin",
        type=float,
        default=120.0,
        help="seconds a node starts prewarming before T_scale - W (default 120)",
    )
    ext.add_argument(
        "--prewarm-horizon",
        type=float,
        default=3600.0,
        help="directives are written at most this many seconds before they start",
    )
    ext.add_argument(
        "--prewarm-bandwidths",
        help="bytes/s for the prelaunch window W, e.g. net=1.25G,registry=500M,storage=2G,gpu=50G"
        " (these are the defaults)",
    )
    ext.add_argument(
        "--planner-prometheus",
        default="http://prometheus-operated.monitoring.svc:9090",
        help="the Prometheus the planner queries (default: prometheus-operated.monitoring)",
    )
    ext.add_argument(
        "--planner-step", type=float, default=300.0, help="seconds between plans (default 300)"
    )
    ext.add_argument(
        "--planner-lead",
        type=float,
        default=600.0,
        help="prelaunch window W in seconds when a lease does not say (default 600)",
    )
    ext.add_argument(
        "--planner-history",
        type=float,
        default=14 * 86400.0,
        help="seconds of history read each step (default two weeks)",
    )
    ext.add_argument(
        "--planner-headroom",
        type=float,
        default=0.0,
        help="plan for forecast x (1 + headroom) (default 0: kale's eq. 10 as written)",
    )
    ext.set_defaults(run=_extender)

    from extender.orchestration.command import add_orchestrator_command

    add_orchestrator_command(sub)  # tidelease orchestrator (docs/orchestration.md)

    # The simulator (numpy, matplotlib) loads only when asked for: the agent stays small.
    sim = sub.add_parser(
        "simulate",
        help="compare leasing policies on a trace; size the standby pool (the main job)",
        add_help=False,
    )
    sim.add_argument("rest", nargs=argparse.REMAINDER, help="see tidelease simulate --help")
    sim.set_defaults(run=_simulate, passes_extra=True)

    plan = sub.add_parser(
        "plan-simulate",
        help="the elastic planner on an embedded tidal trace: online jobs and shared queues",
    )
    from extender.simulation.plannercli import add_arguments as add_plan_arguments

    add_plan_arguments(plan)
    plan.set_defaults(run=_plan_simulate)

    demo = sub.add_parser("demo", help="serve a built-in cluster and replay a day of tides")
    demo.set_defaults(run=_demo)

    snap = sub.add_parser("demo-snapshot", help="print the demo cluster as a List for --snapshot")
    snap.set_defaults(run=_snapshot)
