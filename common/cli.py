"""The ``tidelease`` command: one entry point, a subcommand per component."""

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
from common.logsetup import setup_logging

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from common.kubeclient import KubeClient
    from common.leaderelection import LeaderElector
    from extender.planning.stepping import PlannerSettings
    from extender.prewarming import PrewarmSettings

log = logging.getLogger("tidelease")


def _extender(args: argparse.Namespace) -> int:
    from extender.running import run_extender
    from extender.settings import load_settings
    from extender.snapshot import load_snapshot

    settings = load_settings(
        file=args.config,
        overrides={
            "host": args.host,
            "port": args.port,
            "snapshot": args.snapshot,
            "kubeconfig": args.kubeconfig,
            "leasing_controller": True if args.leasing_controller else None,
        },
    )
    prewarm_settings = _prewarm_settings(args) if args.prewarm_controller else None
    planner_settings = _planner_settings(args) if args.planner else None
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
        from extender.kubestore import KubeStore
        from extender.leasecontroller import KubeWorld
        from extender.running import Leasing

        kube = await KubeStore.connect(settings.kubeconfig, settings.agent_namespace)
        writer = await KubeClient.connect(settings.kubeconfig)
        leasing = None
        if settings.leasing_controller:
            elector = _elector(writer, settings.agent_namespace, "tidelease-leasing-controller")
            leasing = Leasing(KubeWorld(writer), elector)
        operator = None
        if args.hot_restart_operator:
            operator = asyncio.create_task(_hot_restart_operator(writer, settings.agent_namespace))
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
                store=kube, settings=settings, stop=stop, leasing=leasing, registry=registry
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


async def _hot_restart_operator(kube: KubeClient, namespace: str) -> None:
    """The hot-restart operator, leader-elected among the extender replicas."""
    from extender.hotrestarting import (
        LEASE_NAME,
        HotRestartOperator,
        KubeRequests,
        run_hot_restart_operator,
    )

    operator = HotRestartOperator(requests=KubeRequests(kube))
    await _elector(kube, namespace, LEASE_NAME).run(
        lambda: run_hot_restart_operator(kube=kube, operator=operator)
    )


def _prewarm_settings(args: argparse.Namespace) -> PrewarmSettings:
    from extender.prewarmcontroller import parse_bandwidths
    from extender.prewarming import PrewarmSettings

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
    from extender.prewarmcontroller import (
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
    from extender.planning.autoscaling import OnlineSettings
    from extender.planning.stepping import PlannerSettings

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
    from extender.planning.controller import (
        LEASE_NAME,
        KubeLeaseWriter,
        PlannerController,
        PlannerMetrics,
        run_planner_controller,
    )
    from extender.planning.sources import PrometheusSource

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


def _agent(args: argparse.Namespace) -> int:
    from common.kubeclient import KubeClient
    from nodeagent.agent import AgentSettings, run_agent
    from nodeagent.deviceplugin.devices import InMemoryDeviceSource
    from nodeagent.deviceplugin.plugin import run_device_plugin
    from nodeagent.deviceplugin.pods import KubePodLookup
    from nodeagent.deviceplugin.settings import DevicePluginSettings
    from nodeagent.health import HealthSettings
    from nodeagent.nvml import GpuReader, NvmlReader, open_reader
    from nodeagent.publishing import KubePublisher

    node = args.node or os.environ.get("NODE_NAME", "")
    problems = []
    if not node:
        problems.append("--node (or NODE_NAME) is required")
    try:
        ignored = frozenset(int(x) for x in args.ignored_xids.split(",") if x.strip())
    except ValueError:
        problems.append(f"--ignored-xids: want comma-separated integers, got {args.ignored_xids!r}")
        ignored = frozenset()
    if args.quiet_period <= 0 or args.cycle <= 0:
        problems.append("--quiet-period and --cycle must be positive")
    if args.hot_restart_timeout <= 0:
        problems.append("--hot-restart-timeout must be positive")
    if problems:
        raise InvalidInput(problems)
    settings = AgentSettings(
        node=node,
        health=HealthSettings(ignored_xids=ignored, quiet_period_s=args.quiet_period),
        cycle_s=args.cycle,
    )
    reader: GpuReader
    if args.backend == "fake":
        from nodeagent.nvmlfake import FakeNvml, full_gpu

        reader = NvmlReader(FakeNvml([full_gpu(i) for i in range(args.fake_gpus)]))
    else:
        reader = open_reader(args.backend)

    plugin_settings = DevicePluginSettings(
        node_name=node, plugin_dir=args.device_plugin_dir, host_device_root=args.host_device_root
    )
    if not args.no_device_plugin:
        plugin_problems = plugin_settings.validate()
        if plugin_problems:
            raise InvalidInput(plugin_problems)
    from nodeagent.pulling.command import agent_inventory, open_agent_cache

    cache = open_agent_cache(args)  # the peer cache, when --cache-dir is given

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        kube = await KubeClient.connect(args.kubeconfig)
        publisher = KubePublisher(kube, node=node, namespace=args.namespace)
        source = InMemoryDeviceSource()
        runtime = None
        if args.cri_endpoint:
            from nodeagent.cri.client import GrpcRuntime

            runtime = GrpcRuntime(args.cri_endpoint)
        from nodeagent.prewarm import KubePrewarmNode, open_prewarmer, run_prewarm

        # Prewarming (docs/hot-restart.md): on with a CRI runtime and/or the peer cache.
        prewarmer = open_prewarmer(
            node=node,
            kube=kube,
            runtime=runtime,
            cache=cache,
            token_file=args.cache_token_file if cache is not None else None,
        )
        inventory = agent_inventory(cache)
        tasks = [
            asyncio.create_task(
                run_agent(
                    reader=reader,
                    publisher=publisher,
                    settings=settings,
                    on_change=source.set,
                    cache_inventory=(
                        prewarmer.inventory(inventory) if prewarmer is not None else inventory
                    ),
                    prewarm_status=prewarmer.status if prewarmer is not None else None,
                )
            )
        ]
        if prewarmer is not None:
            tasks.append(
                asyncio.create_task(
                    run_prewarm(node=KubePrewarmNode(kube, node), prewarmer=prewarmer)
                )
            )
        if cache is not None:
            tasks.append(asyncio.create_task(cache.run()))
        if not args.no_device_plugin:
            lookup = KubePodLookup(kube, timeout_s=plugin_settings.api_timeout_s)
            tasks.append(
                asyncio.create_task(
                    run_device_plugin(source=source, lookup=lookup, settings=plugin_settings)
                )
            )
        if runtime is not None:
            from common.hotrestartkube import KubePods
            from nodeagent.restarting.podwatch import (
                PodRestarter,
                PodRestartSettings,
                run_pod_hot_restarts,
            )

            restarter = PodRestarter(
                runtime=runtime,
                pods=KubePods(kube),
                settings=PodRestartSettings(node=node, restart_timeout_s=args.hot_restart_timeout),
            )
            tasks.append(asyncio.create_task(run_pod_hot_restarts(kube=kube, restarter=restarter)))
        try:
            await asyncio.wait(
                [*tasks, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            for task in tasks:
                if task.done():
                    task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if runtime is not None:
                await runtime.close()
            await kube.close()
            reader.close()

    asyncio.run(main())
    return 0


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
    from extender.planning import command

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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidelease", description="Elastic GPU leasing on Kubernetes")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    p.add_argument("--log-json", action="store_true", help="one JSON object per log line")
    sub = p.add_subparsers(dest="command", required=True)

    ext = sub.add_parser("extender", help="run the kube-scheduler extender")
    ext.add_argument("--config", type=Path, help="settings file (YAML)")
    ext.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    ext.add_argument("--port", type=int, help="port to listen on (default 8888)")
    ext.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    ext.add_argument(
        "--snapshot",
        type=Path,
        help="offline mode: serve the objects of this YAML/JSON List instead of an API server",
    )
    ext.add_argument(
        "--leasing-controller",
        action="store_true",
        help="also run the leasing controller (leader-elected among the replicas)",
    )
    ext.add_argument(
        "--hot-restart-operator",
        action="store_true",
        help="also run the hot-restart operator (leader-elected; docs/hot-restart.md)",
    )
    ext.add_argument(
        "--prewarm-controller",
        action="store_true",
        help="also run the prewarm controller: nodes fetch images and checkpoints ahead of "
        "GpuLease scale-ups (leader-elected; docs/hot-restart.md, Prewarming)",
    )
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
        "--planner",
        action="store_true",
        help="also run the live elastic planner: GpuLeases annotated tidelease.io/planner=true "
        "get spec.desiredGPUs from their Prometheus metrics (leader-elected; docs/planner.md)",
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

    agent = sub.add_parser("agent", help="run the node agent (DaemonSet on GPU nodes)")
    agent.add_argument("--node", help="this node's name (default: $NODE_NAME)")
    agent.add_argument(
        "--backend",
        choices=["nvml", "null", "fake"],
        default="nvml",
        help="nvml: the driver (no GPUs if it is missing); null: no GPUs; fake: simulated GPUs",
    )
    agent.add_argument("--fake-gpus", type=int, default=8, help="GPUs of the fake backend")
    agent.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: in-cluster)")
    agent.add_argument(
        "--namespace", default="tidelease-system", help="namespace of the heartbeat Lease"
    )
    agent.add_argument(
        "--ignored-xids",
        default="13,31,43,45,68,109",
        help="application XIDs that do not mark a device unhealthy (79 always does)",
    )
    agent.add_argument(
        "--quiet-period",
        type=float,
        default=300.0,
        help="seconds without faults before a device is healthy again",
    )
    agent.add_argument("--cycle", type=float, default=5.0, help="seconds between readings")
    agent.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=Path("/var/lib/kubelet/device-plugins"),
        help="the kubelet's device-plugin directory",
    )
    agent.add_argument(
        "--host-device-root",
        default="",
        help="directory standing in for the host's / when naming device nodes to the kubelet"
        " (test nodes with fake GPUs; default: the host's own /dev)",
    )
    agent.add_argument(
        "--no-device-plugin",
        action="store_true",
        help="do not serve the kubelet device plugin (nodes without a kubelet, e.g. kwok)",
    )
    agent.add_argument(
        "--cri-endpoint",
        help="the node's CRI socket (unix:///run/containerd/containerd.sock): turns on hot "
        "restarts of this node's pods (default: off)",
    )
    agent.add_argument(
        "--hot-restart-timeout",
        type=float,
        default=120.0,
        help="seconds from the image patch to the new container running, else rolled back",
    )
    agent.set_defaults(run=_agent)
    from nodeagent.pulling.command import add_agent_flags, add_cache_command

    add_agent_flags(agent)
    add_cache_command(sub)  # tidelease cache pull|add|ls
    from extender.orchestration.command import add_orchestrator_command

    add_orchestrator_command(sub)  # tidelease orchestrator (docs/orchestration.md)

    # The simulator (numpy, matplotlib) loads only when asked for: the agent stays small.
    sim = sub.add_parser(
        "simulate",
        help="compare leasing policies on a trace; size the standby pool (the main job)",
        add_help=False,
    )
    sim.add_argument("rest", nargs=argparse.REMAINDER, help="see tidelease simulate --help")
    sim.set_defaults(run=_simulate)

    plan = sub.add_parser(
        "plan-simulate",
        help="the elastic planner on an embedded tidal trace: online jobs and shared queues",
    )
    from extender.planning.command import add_arguments as add_plan_arguments

    add_plan_arguments(plan)
    plan.set_defaults(run=_plan_simulate)

    demo = sub.add_parser("demo", help="serve a built-in cluster and replay a day of tides")
    demo.set_defaults(run=_demo)

    snap = sub.add_parser("demo-snapshot", help="print the demo cluster as a List for --snapshot")
    snap.set_defaults(run=_snapshot)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if args.command == "simulate":
        args.rest = extra + args.rest  # the simulator parses its own options
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    setup_logging(args.log_level, json_format=args.log_json)
    try:
        code: int = args.run(args)
    except InvalidInput as e:
        for problem in e.problems:
            print(f"tidelease: {problem}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
