"""The controllers' process, ``tidelease controllers``: leasing and reclaim, the hot-restart
operator, the gang controller (a disrupted borrower gang goes whole), Kueue's admission check
of lent GPUs (extender/kueue: it reads the leasing controller's view), the agents' AgentReady
conditions, the shared queues' admission, prewarming, the live planner and the extender's
certificate rotation (extender/certrotation), each leader-elected among the replicas on a Lease
of its own. The extender's replicas serve the verbs only: a controller's step never waits in
line with kube-scheduler's calls, nor they behind it.

The leasing controller always watches GpuLeases, and keeps a watched view of the cluster of its
own (pods, GpuNodes, ledgers, agents' Leases; ResourceClaims too in DRA mode) only while a
GpuLease exists or standby targets are set (extender.cluster.watching.DemandView): with neither
there is nothing to act on, and a cluster scheduling GPU pods costs this process nothing. The
others watch what they need themselves. /healthz, /readyz and /metrics (for allowed tokens,
common/delegatedauth.py) on the probes' port.

/readyz is ok once the GpuLease watch has synced and, while the view is watched, the view has
synced too: a replica is ready when it could act at once on every lease there is. So readiness
goes away for the view's first list (seconds) when the first GpuLease appears, and is not held
back by a view nobody needs. As everywhere, it also fails while the API server does not answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from common.delegatedauth import DelegatedAuth, metrics_response
from common.errors import InvalidInput
from common.httpserving import PROBE_LIMITS, listen, probe_runner
from common.keyfile import make_key_secret
from common.leaderelection import LeaderElector
from common.model import JobKey
from common.waiting import first_of
from extender.agents.controller import LEADER_LEASE, AgentConditions
from extender.cluster.store import Store
from extender.cluster.watching import DemandView, follow_watch
from extender.leasing.controller import (
    DRA_VIEW_KINDS,
    VIEW_KINDS,
    LeaseCache,
    LeaseController,
    World,
)
from extender.leasing.metrics import LeasingMetrics
from extender.queues.controller import LEADER_LEASE as QUEUES_LEASE
from extender.queues.controller import QueueMetrics, QueuesController, QueueSettings
from extender.queues.measuring import NullReader, Profiler
from extender.scheduler.extenderserver import run_api_probe_at
from extender.scheduler.handlers import readiness
from extender.scheduler.settings import ExtenderSettings

if TYPE_CHECKING:
    from common.kubeclient import KubeClient
    from extender.certrotation.policy import RotationSettings
    from extender.planner.stepping import PlannerSettings
    from extender.prewarm.policy import PrewarmSettings

log = logging.getLogger(__name__)

Elect = Callable[[str], LeaderElector]


@dataclass(frozen=True, slots=True)
class Enabled:
    """Which controllers run, with their settings."""

    leasing: bool = False
    hot_restart_operator: bool = False
    gangs: bool = False
    kueue: bool = False
    agent_conditions: bool = False
    queues: QueueSettings | None = None
    prewarm: PrewarmSettings | None = None
    planner: PlannerSettings | None = None
    planner_prometheus: str = ""
    certificates: RotationSettings | None = None

    def names(self) -> list[str]:
        return [
            name
            for name, on in (
                ("leasing", self.leasing),
                ("hot-restart-operator", self.hot_restart_operator),
                ("gangs", self.gangs),
                ("kueue-admission-check", self.kueue),
                ("agent-conditions", self.agent_conditions),
                ("queues", self.queues is not None),
                ("prewarm", self.prewarm is not None),
                ("planner", self.planner is not None),
                ("certificates", self.certificates is not None),
            )
            if on
        ]


@dataclass(frozen=True, slots=True)
class Running:
    tasks: tuple[asyncio.Task[None], ...]
    probe_url: str | None
    view: DemandView | None  # the leasing controller's view (None without it)


def elector_for(kube: KubeClient, namespace: str) -> Elect:
    """Leader election on a Lease of ``namespace`` (identity: the pod's name, else the host's)."""
    identity = os.environ.get("POD_NAME") or socket.gethostname()

    def elect(lease: str) -> LeaderElector:
        return LeaderElector(kube, namespace=namespace, name=lease, identity=identity)

    return elect


@asynccontextmanager
async def controllers(
    *,
    store: Store,
    world: World,
    kube: KubeClient,
    settings: ExtenderSettings,
    enabled: Enabled,
    elect: Elect | None = None,
    registry: CollectorRegistry | None = None,
    reviewer: Any = None,
) -> AsyncIterator[Running]:
    """Run the enabled controllers until the block exits; yields once the GpuLease watch has
    synced (at once without leasing) and the probes listen (when settings.probe_port is set).
    ``elect``: leader election per controller (None: always lead, one process); ``kube``: the
    API client the operator, prewarm and planner watch and write with."""
    registry = registry if registry is not None else CollectorRegistry()
    tasks: list[asyncio.Task[None]] = []
    synced = asyncio.Event()
    last_reachable = [time.monotonic()]
    view: DemandView | None = None
    leases: LeaseCache | None = None

    def led(lease: str, work: Callable[[], Coroutine[Any, Any, None]]) -> Coroutine[Any, Any, None]:
        return elect(lease).run(work) if elect is not None else work()

    if enabled.leasing:
        view = DemandView(
            store,
            kinds=DRA_VIEW_KINDS if settings.dra else VIEW_KINDS,
            resource=settings.gpu_resource,
            agent_timeout_s=settings.agent_timeout_s,
            name="leasing view",
        )
        leases = LeaseCache()
        controller = LeaseController(
            view=view,
            leases=leases,
            world=world,
            metrics=LeasingMetrics(registry),
            standby_targets=settings.standby_targets(),
            test_grace_s=settings.leasing_test_grace_s,
            overdue_after_s=settings.reclaim_overdue_s,
            dra_mode=settings.dra,
            workers=settings.leasing_workers,
        )
        if settings.leasing_test_grace_s is not None:
            log.warning(
                "leasing: every borrower gets %d s of notice, whatever its lease says "
                "(leasing_test_grace_s: for test clusters only)",
                settings.leasing_test_grace_s,
            )

        async def lead_leasing() -> None:
            await synced.wait()
            await controller.run()

        def apply_lease(kind: str, event: str, obj: dict[str, Any]) -> None:
            if kind == "Namespace":
                leases.apply_namespace(event, obj)
            else:
                leases.apply(event, obj)

        tasks += [
            asyncio.create_task(
                follow_watch(
                    store=store,
                    kinds=("GpuLease", "Namespace"),
                    apply=apply_lease,
                    synced=synced.set,
                ),
                name="watch-gpuleases",
            ),
            asyncio.create_task(view.run(), name="leasing-view"),
            asyncio.create_task(
                run_api_probe_at(store, last_reachable, settings.stale_after_s), name="api-probe"
            ),
            asyncio.create_task(led("tidelease-leasing-controller", lead_leasing), name="leasing"),
        ]
    else:
        synced.set()
    if enabled.hot_restart_operator:
        tasks.append(asyncio.create_task(_hot_restart_operator(kube, registry, led), name="hr"))
    if enabled.gangs:
        tasks.append(asyncio.create_task(_gang_controller(kube, registry, led), name="gangs"))
    if enabled.kueue:
        if view is None or leases is None:
            raise InvalidInput(
                "the Kueue admission check reads what is lent from the leasing controller's "
                "view: run it with the leasing controller (--leasing-controller)"
            )
        work = _kueue_check(
            kube, view, leases, settings.gpu_resource, settings.kueue_checks, registry, led
        )
        tasks.append(asyncio.create_task(work, name="kueue"))
    if enabled.agent_conditions:
        agents = AgentConditions(
            kube, namespace=settings.agent_namespace, timeout_s=settings.agent_timeout_s
        )
        tasks.append(asyncio.create_task(led(LEADER_LEASE, agents.run), name="agent-conditions"))
    if enabled.queues is not None:
        # Ramp-up profiling reads the planner's Prometheus; without one, jobs scale by their
        # tidelease.io/throughput annotation, else linearly. (Imported here: the planner's
        # modules bring numpy and scipy, a third of a second, to no other controller.)
        from extender.planner.sources import PrometheusSource

        reader: PrometheusSource | NullReader = (
            PrometheusSource(enabled.planner_prometheus)
            if enabled.planner_prometheus
            else NullReader()
        )
        queues = QueuesController(
            kube,
            store,
            namespace=settings.agent_namespace,
            settings=enabled.queues,
            metrics=QueueMetrics(registry),
            resource=settings.gpu_resource,
            agent_timeout_s=settings.agent_timeout_s,
            profiler=Profiler(reader, registry=registry),
            release_key=settings.queue_release_key,
        )
        if settings.queue_release_key_file is None:
            log.warning(
                "queues: no queue_release_key_file: released pods carry no proof, and a pod "
                "whose gate another removed is placed past the queues (docs/planner.md)"
            )

        async def run_queues() -> None:
            try:
                if settings.queue_release_secret:
                    # Made here, in the cluster, once (the chart renders no random value).
                    await make_key_secret(
                        kube, settings.agent_namespace, settings.queue_release_secret
                    )
                await led(QUEUES_LEASE, queues.run)
            finally:
                if isinstance(reader, PrometheusSource):
                    await reader.close()

        tasks.append(asyncio.create_task(run_queues(), name="queues"))
    if enabled.prewarm is not None:
        work = _prewarm_controller(kube, enabled.prewarm, registry, led)
        tasks.append(asyncio.create_task(work, name="prewarm"))
    if enabled.certificates is not None:
        work = _certificates(kube, enabled.certificates, registry, led)
        tasks.append(asyncio.create_task(work, name="certificates"))
    if enabled.planner is not None:
        work = _planner(kube, enabled.planner, enabled.planner_prometheus, registry, led)
        tasks.append(asyncio.create_task(work, name="planner"))

    auth = DelegatedAuth(reviewer) if settings.metrics_auth and reviewer is not None else None

    def ready() -> bool:
        return synced.is_set() and (view is None or view.ready())

    probes = probe_runner(
        _probes_app(ready, last_reachable, settings.stale_after_s, registry, auth)
    )
    try:
        # The probes answer at once (/readyz: 503 until the watches have synced), so that a
        # slow first list is not taken for a dead process.
        probe_url = None
        if settings.probe_port is not None:
            await probes.setup()
            await listen(probes, settings.probe_host, settings.probe_port, limits=PROBE_LIMITS)
            host, port = probes.addresses[0][:2]
            probe_url = f"http://{host}:{port}"
        await first_of(synced, tuple(tasks))
        log.info("controllers running: %s", ", ".join(enabled.names()) or "none")
        yield Running(tuple(tasks), probe_url, view)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await probes.cleanup()


def _probes_app(
    ready: Callable[[], bool],
    last_reachable: list[float],
    stale_after_s: float,
    registry: CollectorRegistry,
    auth: DelegatedAuth | None,
) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return readiness(
            draining=False,
            synced=ready(),
            silent_s=time.monotonic() - last_reachable[0],
            stale_after_s=stale_after_s,
        )

    async def metrics(request: web.Request) -> web.Response:
        return await metrics_response(registry, auth, request)

    app = web.Application(client_max_size=1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


Led = Callable[[str, Callable[[], Coroutine[Any, Any, None]]], Coroutine[Any, Any, None]]


async def _hot_restart_operator(kube: KubeClient, registry: CollectorRegistry, led: Led) -> None:
    from extender.hotrestart.operator import (
        LEASE_NAME,
        HotRestartOperator,
        KubeRequests,
        run_hot_restart_operator,
    )

    operator = HotRestartOperator(requests=KubeRequests(kube))
    await led(
        LEASE_NAME,
        lambda: run_hot_restart_operator(kube=kube, operator=operator, registry=registry),
    )


async def _gang_controller(kube: KubeClient, registry: CollectorRegistry, led: Led) -> None:
    from extender.gangs.controller import (
        LEASE_NAME,
        GangMetrics,
        KubeEvictions,
        run_gang_controller,
    )

    metrics = GangMetrics(registry)
    await led(
        LEASE_NAME,
        lambda: run_gang_controller(
            kube=kube, evictions=KubeEvictions(kube), metrics=metrics, registry=registry
        ),
    )


async def _kueue_check(
    kube: KubeClient,
    view: DemandView,
    leases: LeaseCache,
    resource: str,
    names: tuple[str, ...],
    registry: CollectorRegistry,
    led: Led,
) -> None:
    from extender.kueue.controller import LEASE_NAME, KueueMetrics, run_kueue_check
    from extender.rightofreturn.lease import reclaim_of

    metrics = KueueMetrics(registry)

    def reclaiming() -> frozenset[JobKey]:
        found = (reclaim_of(lease) for lease in leases.raw.values())
        return frozenset(r.owner for r in found if r is not None)

    await led(
        LEASE_NAME,
        lambda: run_kueue_check(
            kube=kube,
            view=view,
            metrics=metrics,
            resource=resource,
            names=frozenset(names),
            reclaiming=reclaiming,
            registry=registry,
        ),
    )


async def _prewarm_controller(
    kube: KubeClient, settings: PrewarmSettings, registry: CollectorRegistry, led: Led
) -> None:
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

    await led(LEASE_NAME, lead)


async def _certificates(
    kube: KubeClient, settings: RotationSettings, registry: CollectorRegistry, led: Led
) -> None:
    """The extender's CA and certificates, made and renewed in the cluster
    (extender/certrotation)."""
    from extender.certrotation.controller import (
        LEASE_NAME,
        KubeSecrets,
        Rotation,
        RotationMetrics,
    )

    metrics = RotationMetrics.create(registry)
    rotation = Rotation(KubeSecrets(kube, settings.namespace), settings, metrics)
    await led(LEASE_NAME, rotation.run)


async def _planner(
    kube: KubeClient,
    settings: PlannerSettings,
    prometheus: str,
    registry: CollectorRegistry,
    led: Led,
) -> None:
    """The live elastic planner (docs/planner.md)."""
    from extender.planner.controller import (
        LEASE_NAME,
        KubeLeaseEvents,
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
                source=source,
                writer=KubeLeaseWriter(kube),
                metrics=metrics,
                settings=settings,
                events=KubeLeaseEvents(kube),
            )
            await run_planner_controller(kube=kube, controller=controller)
        finally:
            await source.close()

    await led(LEASE_NAME, lead)


async def run_controllers(
    *,
    store: Store,
    world: World,
    kube: KubeClient,
    settings: ExtenderSettings,
    enabled: Enabled,
    stop: asyncio.Event,
    elect: Elect | None,
    registry: CollectorRegistry,
) -> None:
    """Run until ``stop`` is set (SIGTERM): leadership is given up as the tasks are cancelled."""
    async with controllers(
        store=store,
        world=world,
        kube=kube,
        settings=settings,
        enabled=enabled,
        elect=elect,
        registry=registry,
        reviewer=kube,
    ) as running:
        await first_of(stop, running.tasks)
        log.info("stopping: giving up leadership")
