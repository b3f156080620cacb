"""The prewarm controller: writes :mod:`extender.prewarm.policy`'s directives into the GpuNodes.

Runs in the controllers deployment under its own leader election (``tidelease controllers
--prewarm-controller``). It watches GpuLeases, GpuNodes and the allocation ledgers, reads each
lease's workload (its pod template: images, checkpoint, replicas), and after every change (and
every ``resync_s``) makes each node's ``spec.prewarm`` what the policy says: a JSON merge patch
of that one field, so ``spec.devices`` (the leasing controller's, written with
compare-and-swap) is never touched. The node agents carry the directives out and report in
``status.prewarm``; the controller counts their outcomes and the lead time achieved.

GpuLeases alone are always watched. GpuNodes and ledgers (:class:`PrewarmView`) only while the
plan needs them (:func:`wants_view`): while a GpuLease exists (any lease may have a scale-up
ahead: that depends on its workload's replicas, which are read, not watched), and after the
last one goes, until the directives it left are cleared. Without either a step does nothing
and reads nothing, so a cluster binding GPU pods (a ledger written per bind) costs this
controller no event at all. A leadership term with no GpuLease starts with one LIST of the
GpuNodes, for directives a lease deleted while nobody led left behind.

It runs on :class:`common.reconcile.ReconcileLoop` (named ``prewarm``) with a single key,
:data:`PLAN_KEY`: every step recomputes every node's directives from the whole watched world
(a scale-up's nodes depend on every lease, node and ledger at once), so there is nothing to
gain from finer keys. Every watch event queues the key, the loop's ``min_interval_s`` makes a
burst of events one step, its ``resync_s`` is the clock that brings directives due by time
alone (a horizon reached), and an unexpected error in a step is retried with backoff instead
of ending the controller. The loop's shared metrics (``tidelease_controller_*{controller=
"prewarm"}``) count the steps, errors and retries; :class:`PrewarmMetrics` keeps what
prewarming itself does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from common import contract
from common.errors import InvalidInput, NotFound, NotPermitted, TideleaseError, Unavailable
from common.kubeclient import KubeClient
from common.model import GpuUuid, Holder, NodeInventory
from common.objects import parse_gpu_allocation, parse_gpu_node
from common.prelaunch import Bandwidths
from common.prewarmwire import Directive, directives_json, parse_directives, parse_items
from common.reconcile import ReconcileLoop, ReconcileSettings, Result, run_checked
from common.timefmt import microtime
from common.watches import Watches
from extender.prewarm.policy import (
    PrewarmSettings,
    WorkloadTemplate,
    changes,
    parse_workload,
    plan_prewarm,
)
from extender.rightofreturn.lease import GpuLease, Workload, parse_gpu_lease

log = logging.getLogger(__name__)

LEASE_NAME = "tidelease-prewarm-controller"
PLAN_KEY = "plan"  # the one reconcile key: the whole plan, every node's directives
_GPN = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
_UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def parse_bandwidths(text: str, base: Bandwidths) -> Bandwidths:
    """``net=1.25G,registry=500M,storage=2G,gpu=50G`` (bytes per second; K/M/G/T are powers of
    ten); names left out keep ``base``'s value."""
    values = {"net": base.net, "registry": base.registry, "storage": base.storage, "gpu": base.gpu}
    problems = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        name, value = name.strip(), value.strip()
        unit = value[-1:].upper() if value[-1:].isalpha() else ""
        try:
            number = float(value[: -1 if unit else None]) * _UNITS[unit]
        except (ValueError, KeyError):
            number = -1.0
        if name not in values or not number > 0:
            problems.append(f"--prewarm-bandwidths: {part!r}: want net|registry|storage|gpu=RATE")
            continue
        values[name] = number
    if problems:
        raise InvalidInput(problems)
    return Bandwidths(**values)


class PrewarmWorld(Protocol):
    """What the controller reads besides its watches, and the one write it makes."""

    async def template(self, namespace: str, workload: Workload) -> WorkloadTemplate:
        """The workload's template; NotFound when it is gone."""
        ...

    async def write(self, node: str, directives: Sequence[Directive]) -> None:
        """Make the node's spec.prewarm these directives (none: remove the field)."""
        ...


class KubePrewarmWorld:
    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def template(self, namespace: str, workload: Workload) -> WorkloadTemplate:
        return parse_workload(await self._kube.json("GET", workload.path(namespace)))

    async def write(self, node: str, directives: Sequence[Directive]) -> None:
        await self._kube.json(
            "PATCH",
            f"{_GPN}/{node}",
            body={"spec": {"prewarm": directives_json(directives)}},
            content_type="application/merge-patch+json",
        )


@dataclass
class PrewarmMetrics:
    """What prewarming does (directives written and cleared, the agents' items and their lead
    time). How the controller's loop fares is :class:`common.reconcile.ControllerMetrics`'s,
    on the same ``registry`` under ``controller="prewarm"``."""

    registry: CollectorRegistry
    written: Counter = field(init=False)
    cleared: Counter = field(init=False)
    items: Counter = field(init=False)
    lead: Histogram = field(init=False)
    late: Counter = field(init=False)
    view_active: Gauge = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry
        self.view_active = Gauge(
            "tidelease_prewarm_view_active",
            "1 while the prewarm controller watches GpuNodes and ledgers (a GpuLease exists, or "
            "directives of a deleted one are left to clear); else 0, also when not leading.",
            registry=r,
        )
        self.written = Counter(
            "tidelease_prewarm_directives_written",
            "Prewarm directives written to GpuNodes (new or changed), by role.",
            ["role"],
            registry=r,
        )
        self.cleared = Counter(
            "tidelease_prewarm_directives_cleared",
            "GpuNodes whose prewarm directives were all removed (scale-up done, lease gone).",
            registry=r,
        )
        self.items = Counter(
            "tidelease_prewarm_items",
            "Prewarm items the node agents finished, by kind (image, checkpoint) and outcome.",
            ["kind", "outcome"],
            registry=r,
        )
        self.lead = Histogram(
            "tidelease_prewarm_lead_seconds",
            "From an item done to its scale-up time (0: done at or after it; see _late).",
            buckets=(0, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=r,
        )
        self.late = Counter(
            "tidelease_prewarm_items_late",
            "Prewarm items done after their scale-up time.",
            registry=r,
        )


def _directives(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("spec") or {}).get("prewarm"))


def _has_prewarm(obj: dict[str, Any]) -> bool:
    return _directives(obj) or bool((obj.get("status") or {}).get("prewarm"))


@dataclass
class Watched:
    """The watched objects, raw, by key; ``on_change`` (when set) is called after every event:
    :func:`run_prewarm_controller` queues the plan there. ``prewarm_nodes``: the GpuNodes with
    directives or items, kept at every event, so that a cluster with no lease and nothing to
    clear costs a step nothing. GpuNodes and ledgers are there only while :class:`PrewarmView`
    watches them."""

    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    ledgers: dict[str, dict[str, Any]] = field(default_factory=dict)
    prewarm_nodes: set[str] = field(default_factory=set)
    on_change: Callable[[], None] | None = None

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        key = f"{meta['namespace']}/{name}" if meta.get("namespace") else name
        table = {"leases": self.leases, "nodes": self.nodes, "ledgers": self.ledgers}[kind]
        if event == "DELETED":
            table.pop(key, None)
        else:
            table[key] = obj
        if kind == "nodes":
            if event != "DELETED" and _has_prewarm(obj):
                self.prewarm_nodes.add(key)
            else:
                self.prewarm_nodes.discard(key)
        if self.on_change is not None:
            self.on_change()

    def idle(self) -> bool:
        """No lease to prepare for, no directive to clear, no item to count."""
        return not self.leases and not self.prewarm_nodes

    def with_directives(self) -> list[str]:
        """The watched GpuNodes whose spec.prewarm holds directives."""
        return sorted(n for n in self.prewarm_nodes if _directives(self.nodes.get(n) or {}))

    def drop_view(self) -> None:
        """Forget the GpuNodes and ledgers (their watches stopped): new tables, the old ones'
        memory freed."""
        self.nodes, self.ledgers, self.prewarm_nodes = {}, {}, set()


def wants_view(watched: Watched) -> tuple[bool, str]:
    """Whether a step needs the GpuNodes and ledgers, and why.

    Only to plan for a GpuLease, or to clear directives: with no lease the plan is "no
    directives anywhere", so the view is kept, after the last lease went, until the nodes it
    shows hold none. Any GpuLease counts: whether it has a scale-up ahead depends on its
    workload's replicas, read by the step itself."""
    first = next(iter(watched.leases), None)
    if first is not None:
        return True, f"GpuLease {first} exists"
    left = watched.with_directives()
    if left:
        return True, f"prewarm directives left to clear on {len(left)} GpuNode(s)"
    return False, "no GpuLease and no prewarm directive left"


def _version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class _Parsed:
    """Parsed objects by key, parsed again only when their resourceVersion changes (an object
    without one, as in tests, every time): a step costs what changed, not the cluster."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[str, NodeInventory | None]] = {}
        self.ledgers: dict[str, tuple[str, dict[GpuUuid, Holder]]] = {}
        self.parses = 0  # objects parsed, for tests and the curious

    def node(self, name: str, raw: dict[str, Any]) -> NodeInventory | None:
        version = _version(raw)
        cached = self.nodes.get(name)
        if version and cached is not None and cached[0] == version:
            return cached[1]
        self.parses += 1
        inventory: NodeInventory | None
        try:
            inventory = parse_gpu_node(raw)
        except InvalidInput as e:
            log.debug("GpuNode %s left out: %s", name, e)
            inventory = None
        self.nodes[name] = (version, inventory)
        return inventory

    def holders(self, key: str, raw: dict[str, Any]) -> dict[GpuUuid, Holder]:
        version = _version(raw)
        cached = self.ledgers.get(key)
        if version and cached is not None and cached[0] == version:
            return cached[1]
        self.parses += 1
        held: dict[GpuUuid, Holder] = {}
        try:
            _, allocations = parse_gpu_allocation(raw)
        except InvalidInput:
            allocations = ()
        for a in allocations:
            for u in a.devices:
                held[u] = a.holder
        self.ledgers[key] = (version, held)
        return held

    def forget_except(self, nodes: Mapping[str, Any], ledgers: Mapping[str, Any]) -> None:
        for table, live in ((self.nodes, nodes), (self.ledgers, ledgers)):
            for gone in set(table) - set(live):
                del table[gone]


class PrewarmController:
    def __init__(
        self,
        *,
        world: PrewarmWorld,
        metrics: PrewarmMetrics,
        settings: PrewarmSettings,
        clock: Callable[[], float] = time.time,
        template_ttl_s: float = 10.0,
    ) -> None:
        self.world, self.metrics, self.settings, self.clock = world, metrics, settings, clock
        self.template_ttl_s = template_ttl_s
        self._templates: dict[str, tuple[float, WorkloadTemplate | None]] = {}
        self._started = clock()
        self._seen: dict[tuple[str, str, str, str], str] = {}  # item -> state counted
        self.parsed = _Parsed()

    def forget(self) -> None:
        """Drop what was kept from the view and the leases (the view stopped: no lease, no
        directive). Items finished from now on are counted when the view is back."""
        self.parsed = _Parsed()
        self._templates.clear()
        self._seen.clear()
        self._started = self.clock()

    async def _template(self, lease: GpuLease, now: float) -> WorkloadTemplate | None:
        """The lease's workload template (cached for ``template_ttl_s``); None when it could not
        be read; NotFound when the workload is gone."""
        cached = self._templates.get(lease.key)
        if cached is not None and now - cached[0] < self.template_ttl_s:
            return cached[1]
        template: WorkloadTemplate | None
        try:
            template = await self.world.template(lease.namespace, lease.spec.workload)
        except NotFound:
            self._templates.pop(lease.key, None)
            raise
        except NotPermitted as e:
            # A kind of the chart's extender.leaseWorkloads: its scale is granted, not the
            # object itself, so its replicas are not prewarmed (docs/leasing.md).
            if cached is None:
                log.info("lease %s: no prewarming, its workload is not readable: %s", lease.key, e)
            template = None
        except InvalidInput as e:
            log.error("lease %s: workload template unusable: %s", lease.key, e)
            template = None
        except TideleaseError as e:
            log.warning("lease %s: workload not readable (kept as is): %s", lease.key, e)
            return None
        self._templates[lease.key] = (now, template)
        return template

    def observe(self, watched: Watched) -> None:
        """Count the items the agents finished, once each, and their lead time."""
        live: set[tuple[str, str, str, str]] = set()
        for node in watched.prewarm_nodes:
            obj = watched.nodes.get(node)
            if obj is None:
                continue
            for item in parse_items((obj.get("status") or {}).get("prewarm")):
                key = (node, *item.key)
                live.add(key)
                if item.state == "Pending" or self._seen.get(key) == item.state:
                    continue
                self._seen[key] = item.state
                if item.finished_at is not None and item.finished_at < self._started:
                    continue  # finished before this controller started: counted before
                outcome = "done" if item.state == "Done" else "failed"
                self.metrics.items.labels(item.kind, outcome).inc()
                if item.lead_s is not None:
                    self.metrics.lead.observe(max(0.0, item.lead_s))
                    if item.lead_s < 0:
                        self.metrics.late.inc()
                log.info(
                    "GpuNode %s: prewarm %s %s for lease %s: %s%s",
                    node,
                    item.kind,
                    item.name,
                    item.lease,
                    item.state,
                    f" ({item.reason})" if item.reason else "",
                )
        for gone in set(self._seen) - live:
            del self._seen[gone]

    async def step(self, watched: Watched) -> None:
        """Make every node's spec.prewarm what the policy says now; Unavailable (after writing
        every node it could) when some node's directives could not be written."""
        now = self.clock()
        self.observe(watched)
        if watched.idle():
            return  # no lease, nothing to clear: nothing to read, nothing to write
        leases: list[GpuLease] = []
        for key, raw in list(watched.leases.items()):
            try:
                leases.append(parse_gpu_lease(raw))
            except InvalidInput as e:
                log.error("GpuLease %s is invalid; no prewarming for it: %s", key, e)
        templates: dict[str, WorkloadTemplate | None] = {}
        present = []
        for lease in leases:
            try:
                templates[lease.key] = await self._template(lease, now)
            except NotFound:
                log.info("lease %s: workload %s is gone", lease.key, lease.spec.workload.name)
                continue
            present.append(lease)
        nodes: dict[str, NodeInventory] = {}
        current: dict[str, tuple[Directive, ...]] = {}
        for name, raw in list(watched.nodes.items()):
            inventory = self.parsed.node(name, raw)
            if inventory is None:
                continue
            nodes[name] = inventory
            if name in watched.prewarm_nodes:
                current[name] = parse_directives((raw.get("spec") or {}).get("prewarm"))
        holders: dict[GpuUuid, Holder] = {}
        for key, raw in list(watched.ledgers.items()):
            holders.update(self.parsed.holders(key, raw))
        self.parsed.forget_except(watched.nodes, watched.ledgers)
        plan = plan_prewarm(
            present, templates, nodes.values(), current, self.settings, now, holders
        )
        why = {(d.node, lp.lease): d.why for lp in plan.leases for d in lp.nodes if d.directive}
        failed: list[str] = []
        for node, directives in changes(current, plan.by_node).items():
            try:
                await self.world.write(node, directives)
            except NotFound:
                continue  # the node is gone
            except TideleaseError as e:
                # One node's failure must not hold the others' directives back: on to them,
                # and the step fails at the end so that its loop retries it.
                log.warning("GpuNode %s: writing prewarm directives failed (retrying): %s", node, e)
                failed.append(node)
                continue
            # Our own write, until the watch brings it back; the watch may have deleted the
            # node while the write was in flight (it runs beside this step).
            obj = watched.nodes.get(node)
            if obj is not None:
                obj.setdefault("spec", {})["prewarm"] = directives_json(directives)
                if directives:
                    watched.prewarm_nodes.add(node)
            self._log_write(node, current.get(node, ()), directives, why)
        if failed:
            raise Unavailable(
                f"prewarm directives of GpuNode(s) {', '.join(failed)} not written (the other "
                "nodes' were)"
            )

    def _log_write(
        self,
        node: str,
        before: Sequence[Directive],
        after: Sequence[Directive],
        why: Mapping[tuple[str, str], str],
    ) -> None:
        old = {d.lease: d.to_json() for d in before}
        if not after:
            self.metrics.cleared.inc()
            log.info("GpuNode %s: prewarm directives cleared (%s)", node, ", ".join(sorted(old)))
            return
        for d in after:
            if old.get(d.lease) == d.to_json():
                continue
            self.metrics.written.labels(d.role).inc()
            log.info(
                "GpuNode %s: prewarm for lease %s (%s: %s): images %s, checkpoints %s from %s "
                "(W %.1f s), scale-up at %s",
                node,
                d.lease,
                d.role,
                why.get((node, d.lease), ""),
                list(d.images),
                list(d.checkpoints),
                microtime(d.not_before),
                d.window_s,
                microtime(d.deadline),
            )
        for lease in sorted(set(old) - {d.lease for d in after}):
            log.info("GpuNode %s: prewarm directive of lease %s removed", node, lease)


_VIEW_PATHS = {
    "nodes": _GPN,
    "ledgers": f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_ALLOCATION}",
}


class PrewarmView:
    """The GpuNodes and ledgers, watched into a :class:`Watched` only between :meth:`start`
    and :meth:`stop`; each start and stop is logged once, with its reason, and shown by
    ``tidelease_prewarm_view_active``. A stop drops what was watched and what the controller
    kept of it (:meth:`PrewarmController.forget`); each start lists afresh."""

    def __init__(self, kube: KubeClient, watched: Watched, controller: PrewarmController) -> None:
        self._kube, self._watched, self._controller = kube, watched, controller
        self._watches: Watches | None = None

    @property
    def active(self) -> bool:
        return self._watches is not None

    def start(self, why: str) -> None:
        if self._watches is not None:
            return
        log.info("prewarm view: watching GpuNode, GpuAllocation: %s", why)
        watches = Watches(self._kube, "prewarm-view")
        for kind, path in _VIEW_PATHS.items():
            watches.add(kind, path, functools.partial(self._watched.apply, kind))
        self._watches = watches
        self._controller.metrics.view_active.set(1)

    async def synced(self) -> None:
        """Until both kinds have listed since the start (raises what ended a watch)."""
        if self._watches is not None:
            await self._watches.wait_synced()

    async def stop(self, why: str) -> None:
        watches, self._watches = self._watches, None
        if watches is None:
            return
        await watches.close()
        self._watched.drop_view()
        self._controller.forget()
        self._controller.metrics.view_active.set(0)
        log.info("prewarm view: stopped watching: %s", why)

    def check(self) -> None:
        if self._watches is not None:
            self._watches.check()


async def left_behind(kube: KubeClient) -> list[str]:
    """The GpuNodes holding prewarm directives, from one LIST (no watch)."""
    listed = await kube.json("GET", _GPN)
    return sorted(
        str((obj.get("metadata") or {}).get("name", ""))
        for obj in listed.get("items") or []
        if isinstance(obj, dict) and _directives(obj)
    )


async def run_prewarm_controller(
    *,
    kube: KubeClient,
    controller: PrewarmController,
    resync_s: float = 15.0,
    min_interval_s: float = 1.0,
    ready: asyncio.Event | None = None,
) -> None:
    """Watch GpuLeases, and GpuNodes and ledgers while :func:`wants_view` says so; step on
    changes (at most every ``min_interval_s``) and every ``resync_s``, until cancelled (one
    leadership term). A step waits for the view to have listed; without a view it does
    nothing. ``ready`` is set once the GpuLeases have listed and the first step is over
    (whatever its outcome). The loop's metrics go to the registry of ``controller.metrics``."""
    watched = Watched()
    view = PrewarmView(kube, watched, controller)
    looked = False  # for directives left behind by a lease deleted before this term

    async def reconcile(key: str) -> Result:
        nonlocal looked
        wanted, why = wants_view(watched)
        if not wanted and not looked and not view.active:
            left = await left_behind(kube)
            if left:
                shown = ", ".join(left[:3]) + (", ..." if len(left) > 3 else "")
                wanted, why = True, f"prewarm directives left on GpuNode(s) {shown} to clear"
        looked = True
        if not wanted:
            await view.stop(why)
            return None  # nothing to prepare, nothing to clear: nothing to read
        view.start(why)
        await view.synced()
        await controller.step(watched)
        wanted, why = wants_view(watched)
        if not wanted:
            await view.stop(why)
        return None  # the next event or resync steps again

    loop = ReconcileLoop(
        "prewarm",
        reconcile,
        keys=lambda: (PLAN_KEY,),
        settings=ReconcileSettings(resync_s=resync_s, min_interval_s=min_interval_s),
        registry=controller.metrics.registry,
    )
    watched.on_change = functools.partial(loop.add, PLAN_KEY)

    def check() -> None:
        watches.check()
        view.check()

    try:
        async with Watches(kube, "prewarm") as watches:
            watches.add(
                "leases",
                f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_LEASE}",
                functools.partial(watched.apply, "leases"),
            )
            await watches.wait_synced()
            # Should a watch end, the controller stops with its error rather than plan on a
            # frozen view (the elector surfaces it).
            await run_checked(loop, check, ready=ready)
    finally:
        await view.stop("the controller stopped (leadership given up or lost)")
