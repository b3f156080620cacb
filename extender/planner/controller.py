"""The live planner: every planning step, each opted-in GpuLease's ``spec.desiredGPUs`` becomes
what the online planner (:mod:`extender.planner.autoscaling`) says, ``W`` ahead of the traffic.

Runs in the extender deployment under its own leader election (``tidelease extender --planner``). It
watches GpuLeases; each one annotated ``tidelease.io/planner: "true"`` is a key of the controller's
:class:`~common.reconcile.ReconcileLoop`, reconciled at once when it is first seen opted in and then
every planning step ``step_s`` (the reconcile asks for that itself). Reconciling plans the lease:
its traffic source is asked for the job's traffic, lag and history
(:mod:`extender.planner.sources`), :func:`~extender.planner.stepping.plan_step` decides, and a
changed count is written as a JSON merge patch of the spec
(:func:`~extender.planner.directives.desired_patch`, which also drops a schedule) conditioned on the
resourceVersion the planner decided on. A Conflict is left to the next step, which sees the lease
again. Errors (source unreachable, unusable result, invalid annotations) are logged with the lease,
counted, and leave the lease as it is. Other changes to a lease (our own write among them) do not
plan it again before its step: planning is paced by the step, not by edits. Nothing is stored
locally: the history is re-read from the source each step, so a restarted or new leader decides as
the last one did.

Reference: kale 3.4 (docs/references.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from common import contract
from common.errors import Conflict, InvalidInput, NotFound, TideleaseError, Unavailable
from common.events import Involved, post_event
from common.kubeclient import KubeClient
from common.reconcile import ReconcileLoop, Requeue, Result, run_checked
from common.watches import Watches, object_key
from extender.planner.directives import desired_patch
from extender.planner.sources import TrafficSource
from extender.planner.stepping import PlannerSettings, lease_config, plan_step, scoped_queries
from extender.rightofreturn.lease import parse_gpu_lease

log = logging.getLogger(__name__)

LEASE_NAME = "tidelease-planner"
COMPONENT = "tidelease-planner"
_GPL = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_LEASE}"


def opted_in(obj: Mapping[str, Any]) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(contract.ANN_PLANNER, "")).lower() == "true"


class LeaseWriter(Protocol):
    async def patch_spec(
        self, namespace: str, name: str, resource_version: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """Apply a JSON merge patch to the lease if it is still at ``resource_version``; the
        lease after it. Conflict when it changed meanwhile, NotFound when it is gone."""
        ...


class KubeLeaseWriter:
    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def patch_spec(
        self, namespace: str, name: str, resource_version: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        body = {**patch, "metadata": {"resourceVersion": resource_version}}
        return await self._kube.json(
            "PATCH",
            f"/apis/{contract.API_VERSION}/namespaces/{namespace}/{contract.PLURAL_GPU_LEASE}/{name}",
            body=body,
            content_type="application/merge-patch+json",
        )


class LeaseEvents(Protocol):
    async def warn(self, lease: Mapping[str, Any], reason: str, message: str) -> None:
        """A Warning Event on the GpuLease ``lease`` (its object as watched)."""
        ...


class KubeLeaseEvents:
    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def warn(self, lease: Mapping[str, Any], reason: str, message: str) -> None:
        meta = lease.get("metadata") or {}
        involved = Involved(
            contract.KIND_GPU_LEASE,
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
            api_version=contract.API_VERSION,
        )
        await post_event(self._kube, involved, reason, message, warning=True, component=COMPONENT)


class NullLeaseEvents:
    """No Events: what the planner refuses is logged only."""

    async def warn(self, lease: Mapping[str, Any], reason: str, message: str) -> None:
        return None


@dataclass
class PlannerMetrics:
    registry: CollectorRegistry
    planned: Gauge = field(init=False)
    forecast: Gauge = field(init=False)
    decisions: Counter = field(init=False)
    source_errors: Counter = field(init=False)
    writes: Counter = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.planned = Gauge(
            "tidelease_planner_planned_gpus",
            "GPUs the planner holds for a GpuLease (its last decision).",
            ["lease"],
            registry=r,
        )
        self.forecast = Gauge(
            "tidelease_planner_forecast_traffic",
            "Forecast incoming samples/s of a GpuLease's job, now and at now + W.",
            ["lease", "at"],
            registry=r,
        )
        self.decisions = Counter(
            "tidelease_planner_decisions",
            "Planning decisions by reason (forecast, fallback-lag, capped).",
            ["reason"],
            registry=r,
        )
        self.source_errors = Counter(
            "tidelease_planner_source_errors",
            "Planning steps that left a lease as it was, by kind (unavailable: the source "
            "could not be reached; bad-result: it answered something unusable; config: the "
            "lease's annotations are invalid).",
            ["kind"],
            registry=r,
        )
        self.writes = Counter(
            "tidelease_planner_writes",
            "GpuLease spec writes by outcome (written, unchanged, conflict, failed).",
            ["outcome"],
            registry=r,
        )

    def forget(self, lease: str) -> None:
        with contextlib.suppress(KeyError):
            self.planned.remove(lease)
        for at in ("now", "lead"):
            with contextlib.suppress(KeyError):
                self.forecast.remove(lease, at)


class PlannerController:
    """Plans the opted-in GpuLeases it is shown (:meth:`on_lease`), one key of :attr:`loop`
    per lease. ``interval_s`` is how often each is planned (default: the planning step)."""

    def __init__(
        self,
        *,
        source: TrafficSource,
        writer: LeaseWriter,
        metrics: PlannerMetrics,
        settings: PlannerSettings,
        clock: Callable[[], float] = time.time,
        interval_s: float | None = None,
        events: LeaseEvents | None = None,
    ) -> None:
        self.source, self.writer, self.metrics = source, writer, metrics
        self.events: LeaseEvents = NullLeaseEvents() if events is None else events
        # Leases whose queries were refused, told (Event, log): key -> (uid, message).
        self._refused: dict[str, tuple[str, str]] = {}
        self.settings, self.clock = settings, clock
        self.interval_s = settings.online.step_s if interval_s is None else interval_s
        if not self.interval_s > 0:
            raise InvalidInput([f"interval_s: want a positive number, got {self.interval_s}"])
        # The opted-in GpuLeases as last watched, by key: what reconcile() plans.
        self.leases: dict[str, dict[str, Any]] = {}
        self.loop = ReconcileLoop(
            "planner", self.reconcile, keys=self.keys, registry=metrics.registry
        )

    # --- what the watch brings ---

    def on_lease(self, event: str, obj: dict[str, Any]) -> None:
        """Keep the view of the opted-in leases; a lease newly opted in is planned at once (a
        lease already known waits for its step, whatever changed: our own writes come back
        here too)."""
        key = object_key(obj)
        if event == "DELETED" or not opted_in(obj):
            self._refused.pop(key, None)
            if self.leases.pop(key, None) is not None:
                self.metrics.forget(key)
                why = "deleted" if event == "DELETED" else "opted out"
                log.info("GpuLease %s: %s, no longer planned", key, why)
            return
        if key not in self.leases:
            log.info("GpuLease %s: opted in, planned every %.0f s", key, self.interval_s)
            self.loop.add(key)
        self.leases[key] = obj

    def keys(self) -> list[str]:
        """Every lease planned now (the loop's first pass)."""
        return list(self.leases)

    async def reconcile(self, key: str) -> Result:
        """Plan the lease ``key`` as last watched, then again after ``interval_s`` (an error
        too waits for the next step: the lease is left as it was, see :meth:`plan`); nothing
        more once it is gone or opted out."""
        raw = self.leases.get(key)
        if raw is None:
            return None
        await self.plan(raw)
        return Requeue(self.interval_s)

    # --- planning one lease ---

    async def _tell_refused(self, raw: Mapping[str, Any], key: str, why: str) -> None:
        """Queries that cannot be scoped: not run; a log line and a Warning Event on the
        lease, once per lease object and reason."""
        uid = str((raw.get("metadata") or {}).get("uid", ""))
        if self._refused.get(key) == (uid, why):
            return
        log.warning("GpuLease %s: not planned, queries refused: %s", key, why)
        try:
            await self.events.warn(raw, "PlannerQueryRefused", why)
        except NotFound:
            pass
        except TideleaseError as e:  # told again next step
            log.warning("GpuLease %s: Event not posted: %s", key, e)
            return
        self._refused[key] = (uid, why)

    async def plan(self, raw: Mapping[str, Any]) -> int | None:
        """Plan one lease and write the change; the GPUs it holds afterwards (None: left as
        it was because of an error)."""
        meta = raw.get("metadata") or {}
        key = object_key(raw)
        try:
            lease = parse_gpu_lease(raw)
            config = lease_config(meta.get("annotations") or {}, self.settings.online.lead_s)
        except InvalidInput as e:
            log.error("GpuLease %s: not planned, invalid: %s", key, e)
            self.metrics.source_errors.labels("config").inc()
            return None
        try:
            queries = scoped_queries(
                config.queries, lease.namespace, self.settings.tenant_query_label
            )
        except InvalidInput as e:
            await self._tell_refused(raw, key, str(e))
            self.metrics.source_errors.labels("config").inc()
            return None
        self._refused.pop(key, None)
        now = self.clock()
        try:
            seen = await self.source.observe(
                queries,
                at_s=now,
                history_s=self.settings.history_s,
                step_s=self.settings.online.step_s,
            )
        except Unavailable as e:
            log.warning("GpuLease %s: traffic source unreachable, lease kept: %s", key, e)
            self.metrics.source_errors.labels("unavailable").inc()
            return None
        except TideleaseError as e:
            log.warning("GpuLease %s: traffic source answer unusable, lease kept: %s", key, e)
            self.metrics.source_errors.labels("bad-result").inc()
            return None
        try:
            step = plan_step(config, seen, self.settings, lease.spec.gpus_per_replica)
        except InvalidInput as e:
            log.warning("GpuLease %s: no plan from the observations, lease kept: %s", key, e)
            self.metrics.source_errors.labels("bad-result").inc()
            return None
        self.metrics.decisions.labels(step.reason).inc()
        self.metrics.planned.labels(key).set(step.gpus)
        self.metrics.forecast.labels(key, "now").set(step.forecast_now)
        self.metrics.forecast.labels(key, "lead").set(step.forecast_lead)
        current = None if lease.spec.schedule else lease.spec.desired_gpus
        directive = desired_patch(lease.namespace, lease.name, step.gpus, current, step.reason)
        if directive is None:
            self.metrics.writes.labels("unchanged").inc()
            return step.gpus
        try:
            await self.writer.patch_spec(
                lease.namespace, lease.name, lease.resource_version, directive.merge_patch()
            )
        except Conflict as e:
            log.info("GpuLease %s: changed meanwhile, planned again next step: %s", key, e)
            self.metrics.writes.labels("conflict").inc()
            return None
        except NotFound:
            log.info("GpuLease %s: gone", key)
            return None
        except TideleaseError as e:
            log.warning("GpuLease %s: writing desiredGPUs failed, next step retries: %s", key, e)
            self.metrics.writes.labels("failed").inc()
            return None
        self.metrics.writes.labels("written").inc()
        log.info(
            "GpuLease %s: desiredGPUs %s -> %d (%s; %d workers; forecast %.0f samples/s now, "
            "%.0f at +%.0f s)",
            key,
            "schedule" if current is None else current,
            step.gpus,
            step.reason,
            step.workers,
            step.forecast_now,
            step.forecast_lead,
            config.lead_s,
        )
        return step.gpus


async def run_planner_controller(
    *,
    kube: KubeClient,
    controller: PlannerController,
    ready: asyncio.Event | None = None,
) -> None:
    """Watch GpuLeases and plan the opted-in ones (``controller.loop``), until cancelled or a
    watch ends. ``ready`` is set once the leases are listed: planning acts on a full view."""
    # This term's view comes from its own list: a lease deleted meanwhile sends no event.
    for key in list(controller.leases):
        controller.metrics.forget(key)
    controller.leases.clear()
    async with Watches(kube, "planner") as watches:
        watches.add("gpuleases", _GPL, controller.on_lease)
        await watches.wait_synced()
        log.info("planner: %d GpuLease(s) opted in", len(controller.leases))
        if ready is not None:
            ready.set()
        await run_checked(controller.loop, watches.check)
