"""The control plane's processes, wired: ``tidelease extender`` (the scheduler extender: the
verbs only), ``controllers`` (leasing, hot-restart operator, prewarm, planner; extender/
controllers.py), ``orchestrator``, ``simulate``, ``plan-simulate``, ``demo`` and
``demo-snapshot``. :func:`register` adds them to the ``tidelease`` command (common/cli.py finds
it through the ``tidelease.commands`` entry point).

Both read the same settings (file, ``TIDELEASE_EXTENDER_<KEY>``, flags). Every controller is
enabled the same way: a settings key or its flag (``--leasing-controller``,
``--hot-restart-operator``, ``--prewarm-controller``, ``--planner``); docs/reference.md lists
them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import InvalidInput

if TYPE_CHECKING:
    from extender.certrotation.policy import RotationSettings
    from extender.planner.stepping import PlannerSettings
    from extender.prewarm.policy import PrewarmSettings
    from extender.queues.controller import QueueSettings
    from extender.scheduler.settings import ExtenderSettings

log = logging.getLogger("tidelease")

# The controllers `tidelease controllers` may run: settings key -> what its flag says.
CONTROLLERS = {
    "leasing_controller": "run the leasing controller (leader-elected among the replicas)",
    "hot_restart_operator": "run the hot-restart operator (leader-elected; docs/hot-restart.md)",
    "gang_controller": "evict the rest of a borrower gang once one member is disrupted "
    "(leader-elected; docs/gangs.md)",
    "kueue_admission_check": "run tidelease's Kueue admission check: Kueue workloads are "
    "admitted against lent GPUs and requeued at reclaim (leader-elected; with "
    "--leasing-controller; docs/kueue.md)",
    "queues_controller": "release GPU pods gated at admission in cornucopia's MLFQ order "
    "(leader-elected; docs/planner.md, Shared queues live)",
    "agent_conditions": "write each GpuNode's AgentReady condition from its agent's heartbeat "
    "(leader-elected; docs/reference.md, GpuNode)",
    "prewarm_controller": "run the prewarm controller: nodes fetch images and checkpoints "
    "ahead of GpuLease scale-ups (leader-elected; docs/hot-restart.md, Prewarming)",
    "planner": "run the live elastic planner: GpuLeases annotated tidelease.io/planner=true "
    "get spec.desiredGPUs from their Prometheus metrics (leader-elected; docs/planner.md)",
}


def _queue_settings(settings: ExtenderSettings) -> QueueSettings:
    from extender.queues.controller import QueueSettings
    from extender.queues.mlfq import Thresholds

    return QueueSettings(
        thresholds=Thresholds(
            settings.queue_demote_interactive_s,
            settings.queue_demote_batch_s,
            settings.queue_promote_s,
        ),
        adapt_every=settings.queue_adapt_every,
        interval_s=settings.queue_interval_s,
        tenant_query_label=settings.tenant_query_label,
    )


def _settings(args: argparse.Namespace, **more: object) -> ExtenderSettings:
    from extender.scheduler.settings import load_settings

    return load_settings(
        file=args.config,
        overrides={
            "probe_host": args.probe_host,
            "probe_port": args.probe_port,
            "kubeconfig": args.kubeconfig,
            **more,
        },
    )


def _extender(args: argparse.Namespace) -> int:
    from extender.cluster.snapshotfile import load_snapshot
    from extender.scheduler.extenderserver import run_extender

    settings = _settings(
        args,
        host=args.host,
        port=args.port,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        client_ca_file=args.client_ca_file,
        snapshot=args.snapshot,
    )
    if any(getattr(settings, name) for name in CONTROLLERS):
        log.warning(
            "the extender serves the verbs only; %s run in `tidelease controllers`",
            ", ".join(name for name in CONTROLLERS if getattr(settings, name)),
        )

    async def main() -> None:
        stop = _stop_on_signals()
        if settings.snapshot is not None:
            store = load_snapshot(settings.snapshot)
            log.info("offline mode: serving the objects of %s", settings.snapshot)
            await run_extender(store=store, settings=settings, stop=stop, drain_s=0.0, freeze=True)
            return
        from common.kubeclient import KubeClient
        from extender.cluster.kubestore import KubeStore

        kube = await KubeStore.connect(settings.kubeconfig, settings.agent_namespace)
        writer = await KubeClient.connect(settings.kubeconfig)
        try:
            await run_extender(
                store=kube, settings=settings, stop=stop, reviewer=writer, freeze=True
            )
        finally:
            await kube.close()
            await writer.close()

    asyncio.run(main())
    return 0


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _controllers(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from extender.controllers import Enabled, elector_for, run_controllers

    settings = _settings(args, **{name: True for name in CONTROLLERS if getattr(args, name)})
    enabled = Enabled(
        leasing=settings.leasing_controller,
        hot_restart_operator=settings.hot_restart_operator,
        gangs=settings.gang_controller,
        kueue=settings.kueue_admission_check,
        agent_conditions=settings.agent_conditions,
        queues=_queue_settings(settings) if settings.queues_controller else None,
        prewarm=_prewarm_settings(args) if settings.prewarm_controller else None,
        planner=_planner_settings(args, settings) if settings.planner else None,
        planner_prometheus=args.planner_prometheus,
        certificates=_rotation_settings(args.certificates),
    )
    if not enabled.names():
        raise InvalidInput(
            "no controller enabled: give --leasing-controller, --hot-restart-operator, "
            "--gang-controller, --kueue-admission-check, "
            "--agent-conditions, --queues-controller, --prewarm-controller, --planner or "
            "--certificates (or "
            "their settings keys)"
        )

    async def main() -> None:
        from common.kubeclient import KubeClient
        from extender.cluster.kubestore import KubeStore
        from extender.leasing.kubeworld import KubeWorld

        stop = _stop_on_signals()
        store = await KubeStore.connect(settings.kubeconfig, settings.agent_namespace)
        kube = await KubeClient.connect(settings.kubeconfig)
        try:
            await run_controllers(
                store=store,
                world=KubeWorld(kube),
                kube=kube,
                settings=settings,
                enabled=enabled,
                stop=stop,
                elect=elector_for(kube, settings.agent_namespace),
                registry=CollectorRegistry(),
            )
        finally:
            await store.close()
            await kube.close()

    asyncio.run(main())
    return 0


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


def _planner_settings(args: argparse.Namespace, extender: ExtenderSettings) -> PlannerSettings:
    from extender.planner.autoscaling import OnlineSettings
    from extender.planner.stepping import PlannerSettings

    settings = PlannerSettings(
        online=OnlineSettings(
            step_s=args.planner_step, lead_s=args.planner_lead, headroom=args.planner_headroom
        ),
        history_s=args.planner_history,
        tenant_query_label=extender.tenant_query_label,
    )
    problems = settings.validate()
    if not args.planner_prometheus.startswith(("http://", "https://")):
        problems.append("--planner-prometheus: want an http:// or https:// URL")
    if problems:
        raise InvalidInput(problems)
    return settings


def _rotation_settings(path: Path | None) -> RotationSettings | None:
    if path is None:
        return None
    from extender.certrotation.controller import load_rotation_settings

    return load_rotation_settings(path)


def _simulate(args: argparse.Namespace) -> int:
    from extender.leasingsim import cli as simulation

    p = argparse.ArgumentParser(
        prog="tidelease simulate",
        description="Compare leasing policies on a trace of tides, failures and borrowers; "
        "size the standby pool.",
    )
    simulation.add_arguments(p)
    code: int = simulation.run(p.parse_args(args.rest))
    return code


def _plan_simulate(args: argparse.Namespace) -> int:
    from extender.plannersim import cli as command

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


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="settings file (YAML)")
    p.add_argument(
        "--probe-port",
        type=int,
        help="serve /healthz, /readyz and /metrics on this port (the extender: instead of on the "
        "verbs' port, which may then listen on loopback only)",
    )
    p.add_argument("--probe-host", help="address of --probe-port (default 0.0.0.0)")
    p.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )


def _controller_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prewarm-margin",
        type=float,
        default=120.0,
        help="seconds a node starts prewarming before T_scale - W (default 120)",
    )
    p.add_argument(
        "--prewarm-horizon",
        type=float,
        default=3600.0,
        help="directives are written at most this many seconds before they start",
    )
    p.add_argument(
        "--prewarm-bandwidths",
        help="bytes/s for the prelaunch window W, e.g. net=1.25G,registry=500M,storage=2G,gpu=50G"
        " (these are the defaults)",
    )
    p.add_argument(
        "--certificates",
        type=Path,
        default=None,
        metavar="FILE",
        help="run the certificate rotation with these settings (YAML; the chart's "
        "certificates.yaml): makes the extender's CA, serving and kube-scheduler client "
        "certificates in their Secrets and renews them before they end",
    )
    p.add_argument(
        "--planner-prometheus",
        default="http://prometheus-operated.monitoring.svc:9090",
        help="the Prometheus the planner queries (default: prometheus-operated.monitoring)",
    )
    p.add_argument(
        "--planner-step", type=float, default=300.0, help="seconds between plans (default 300)"
    )
    p.add_argument(
        "--planner-lead",
        type=float,
        default=600.0,
        help="prelaunch window W in seconds when a lease does not say (default 600)",
    )
    p.add_argument(
        "--planner-history",
        type=float,
        default=14 * 86400.0,
        help="seconds of history read each step (default two weeks)",
    )
    p.add_argument(
        "--planner-headroom",
        type=float,
        default=0.0,
        help="plan for forecast x (1 + headroom) (default 0: kale's eq. 10 as written)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the control plane's commands to ``tidelease``."""
    ext = sub.add_parser("extender", help="run the kube-scheduler extender (the verbs)")
    _common_flags(ext)
    ext.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    ext.add_argument("--port", type=int, help="port to listen on (default 8888)")
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
        "--snapshot",
        type=Path,
        help="offline mode: serve the objects of this YAML/JSON List instead of an API server",
    )
    ext.set_defaults(run=_extender)

    ctl = sub.add_parser(
        "controllers",
        help="run the controllers: leasing, hot-restart operator, prewarm, planner "
        "(each leader-elected)",
    )
    _common_flags(ctl)
    for name, what in CONTROLLERS.items():
        ctl.add_argument("--" + name.replace("_", "-"), action="store_true", help=what)
    _controller_flags(ctl)
    ctl.set_defaults(run=_controllers)

    from extender.orchestration.command import add_orchestrator_command

    add_orchestrator_command(sub)  # tidelease orchestrator (docs/orchestration.md)

    from extender.ctl.command import register as add_ctl_command

    add_ctl_command(sub)  # tidelease ctl, also kubectl-tidelease (docs/operating.md)

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
    from extender.plannersim.cli import add_arguments as add_plan_arguments

    add_plan_arguments(plan)
    plan.set_defaults(run=_plan_simulate)

    demo = sub.add_parser("demo", help="serve a built-in cluster and replay a day of tides")
    demo.set_defaults(run=_demo)

    snap = sub.add_parser("demo-snapshot", help="print the demo cluster as a List for --snapshot")
    snap.set_defaults(run=_snapshot)
