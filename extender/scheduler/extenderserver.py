"""Lifecycle of one extender instance: its watched view, the reaper and the HTTP servers that
serve :mod:`extender.scheduler.handlers`. The controllers run in a process of their own
(extender/controllers.py)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.delegatedauth import DelegatedAuth, Reviewer
from common.errors import InvalidInput
from common.httpserving import (
    PROBE_LIMITS,
    GuardedSite,
    Limits,
    TLSContext,
    listen,
    probe_runner,
    raise_fd_limit,
)
from common.httpserving import runner as make_runner
from common.waiting import first_of
from extender.cluster import metrics as cluster_metrics
from extender.cluster.state import ClusterState
from extender.cluster.store import Store
from extender.cluster.watching import PodCache, run_liveness, run_watch
from extender.scheduler.binding import Binder, Clock, utcnow
from extender.scheduler.handlers import ExtenderApp
from extender.scheduler.metrics import ExtenderMetrics
from extender.scheduler.settings import ExtenderSettings

log = logging.getLogger(__name__)


def build_app(
    *,
    store: Store,
    settings: ExtenderSettings,
    clock: Clock = utcnow,
    registry: CollectorRegistry | None = None,
) -> ExtenderApp:
    cluster = ClusterState()
    pods = PodCache(settings.gpu_resource)
    metrics = ExtenderMetrics(registry)
    cluster_metrics.register(cluster, metrics.registry, gpu_info=settings.gpu_info_metric)
    binder = Binder(
        store=store, cluster=cluster, pods=pods, settings=settings, metrics=metrics, clock=clock
    )
    return ExtenderApp(
        settings=settings, cluster=cluster, pods=pods, binder=binder, metrics=metrics
    )


async def run_api_probe(
    *, store: Store, stale_after_s: float, answered: Callable[[float], None]
) -> None:
    """Ask the store whether it answers, every quarter of ``stale_after_s`` (at most 3 s), and
    tell ``answered`` the monotonic time when it did: /readyz fails once that is longer ago
    than ``stale_after_s``."""
    interval_s = min(3.0, stale_after_s / 4)
    was_ok = True
    while True:
        try:
            async with asyncio.timeout(max(interval_s, 1.0)):
                ok = await store.reachable()
        except TimeoutError:
            ok = False
        if ok:
            answered(time.monotonic())
        if ok != was_ok:
            log.warning("API server %s", "answers again" if ok else "stopped answering")
            was_ok = ok
        await asyncio.sleep(interval_s)


def run_api_probe_at(
    store: Store, last: list[float], stale_after_s: float
) -> Coroutine[Any, Any, None]:
    """run_api_probe keeping the time in ``last[0]``."""

    def answered(at: float) -> None:
        last[0] = at

    return run_api_probe(store=store, stale_after_s=stale_after_s, answered=answered)


class TLSExpiry(Collector):
    """tidelease_extender_tls_not_after_timestamp_seconds: when the serving certificate and the
    client CA the extender serves with now end, and the client certificate it last admitted
    (kube-scheduler's copy on its host). Alerted on (monitoring/alerts.yaml)."""

    def __init__(self, tls: TLSContext) -> None:
        self._tls = tls

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "tidelease_extender_tls_not_after_timestamp_seconds",
            "When the extender's TLS certificates end (Unix seconds): serving, client_ca, and "
            "client (the client certificate last admitted).",
            labels=["certificate"],
        )
        family.add_metric(["serving"], self._tls.serving_not_after)
        family.add_metric(["client_ca"], self._tls.client_ca_not_after)
        if self._tls.client_not_after is not None:
            family.add_metric(["client"], self._tls.client_not_after)
        yield family
        yield CounterMetricFamily(
            "tidelease_extender_tls_reloads",
            "Times the extender loaded its rotated TLS files again.",
            value=self._tls.reloads,
        )


@dataclass(frozen=True, slots=True)
class Running:
    app: ExtenderApp
    url: str  # base URL the server listens on
    tasks: tuple[asyncio.Task[None], ...]  # background work: watch and reaper
    probe_url: str | None = None  # where /healthz, /readyz, /metrics are, if not at url
    site: GuardedSite | None = None  # the verbs' listener (its guard's counts)
    tls: TLSContext | None = None  # the verbs' TLS, when HTTPS


@asynccontextmanager
async def serve(
    *,
    store: Store,
    settings: ExtenderSettings,
    clock: Clock = utcnow,
    registry: CollectorRegistry | None = None,
    reviewer: Reviewer | None = None,
) -> AsyncIterator[Running]:
    """Run an extender until the block exits; yields once it is synced and listening.
    ``registry``: where its metrics go (and what /metrics serves; other components of the
    process may register theirs there too); a new one by default. ``reviewer``: the API
    server that reviews the tokens of /metrics readers (settings.metrics_auth)."""
    app = build_app(store=store, settings=settings, clock=clock, registry=registry)
    if settings.metrics_auth:
        if reviewer is None:
            raise InvalidInput("metrics_auth needs an API server to review tokens")
        app.metrics_auth = DelegatedAuth(reviewer)
    server_tls = settings.server_tls()
    tls = TLSContext(server_tls) if server_tls is not None else None
    if tls is not None:
        app.metrics.registry.register(TLSExpiry(tls))
    verb_limits = Limits(max_connections=settings.max_connections)
    raise_fd_limit(verb_limits.max_connections + PROBE_LIMITS.max_connections + 512)
    synced = asyncio.Event()

    def answered(at: float) -> None:
        app.last_reachable = at

    tasks: tuple[asyncio.Task[None], ...] = (
        asyncio.create_task(
            run_watch(
                store=store,
                cluster=app.cluster,
                pods=app.pods,
                ready=synced,
                pod_gone=app.binder.reap_soon,
            ),
            name="watch",
        ),
        asyncio.create_task(app.binder.run_reaper(ready=synced), name="reaper"),
        asyncio.create_task(
            run_liveness(cluster=app.cluster, timeout_s=settings.agent_timeout_s),
            name="liveness",
        ),
        asyncio.create_task(
            run_api_probe(store=store, stale_after_s=settings.stale_after_s, answered=answered),
            name="api-probe",
        ),
    )
    if tls is not None:
        tasks = (*tasks, asyncio.create_task(tls.follow(), name="tls-files"))
    separate = settings.probe_port is not None

    # On SIGTERM, in-flight verbs get at most a bind's time to finish, so that the whole stop
    # (drain included) fits the pod's 15 s grace.
    def runner_of(web_app: web.Application) -> web.AppRunner:
        return make_runner(web_app, shutdown_timeout=settings.bind_timeout_s + 1)

    runner = runner_of(app.web_app(probes=not separate))
    probes = (
        probe_runner(app.probes_app(), shutdown_timeout=settings.bind_timeout_s + 1)
        if separate
        else None
    )
    try:
        await first_of(synced, tasks)
        app.synced = True
        await runner.setup()
        site = await listen(runner, settings.host, settings.port, limits=verb_limits, tls=tls)
        host, port = runner.addresses[0][:2]
        scheme = "https" if tls is not None else "http"
        log.info(
            "extender listening on %s://%s:%s%s, %d GPU nodes",
            scheme,
            host,
            port,
            " (client certificates required)" if tls is not None else "",
            len(app.cluster),
        )
        probe_url = None
        if probes is not None and settings.probe_port is not None:
            await probes.setup()
            await listen(probes, settings.probe_host, settings.probe_port, limits=PROBE_LIMITS)
            probe_host, probe_port = probes.addresses[0][:2]
            probe_url = f"http://{probe_host}:{probe_port}"
            log.info("probes and metrics on %s", probe_url)
        yield Running(app, f"{scheme}://{host}:{port}", tasks, probe_url, site, tls)
    finally:
        app.draining = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.cleanup()
        if probes is not None:
            await probes.cleanup()


async def run_extender(
    *,
    store: Store,
    settings: ExtenderSettings,
    stop: asyncio.Event,
    drain_s: float = 2.0,
    registry: CollectorRegistry | None = None,
    ready: asyncio.Future[str] | None = None,
    reviewer: Reviewer | None = None,
    freeze: bool = False,
) -> None:
    """Serve until ``stop`` is set; then fail readiness, let in-flight calls finish (each
    within bind_timeout_s), exit. ``ready`` gets the URL once it listens. ``freeze``: the
    process is the extender's own (``tidelease extender``): once synced, what it holds then is
    moved out of the cyclic garbage collector's way."""
    async with serve(
        store=store, settings=settings, registry=registry, reviewer=reviewer
    ) as running:
        if freeze:
            # Modules, settings and the view as first listed live as long as the process; left
            # to the collector, its oldest generation walks all of them again and again while
            # verbs and watch events churn through short-lived objects.
            gc.collect()
            gc.freeze()
        if ready is not None:
            ready.set_result(running.url)
        await first_of(stop, running.tasks)
        running.app.draining = True
        log.info("stopping: readiness failed, draining for %.1f s", drain_s)
        await asyncio.sleep(drain_s)
