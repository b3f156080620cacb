"""The extender's HTTP handlers (aiohttp): the scheduler-extender verbs and the probes. Handlers
only translate between wire and decisions; :mod:`extender.scheduler.extenderserver` runs the
servers.

Routes: ``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt`` (register ``urlPrefix`` as the
server's address and the verbs by these names), ``GET /healthz``, ``/readyz``, ``/metrics``.

Errors: a body that is not the protocol gets 400 with ``{"Error": ...}``; a valid request that
cannot be honoured (an invalid pod annotation, a node without room at bind time) gets 200 with
the protocol's ``Error`` field where the verb has one (filter, bind), so kube-scheduler shows the
message on the pod; prioritize and preempt have no such field and answer 400. A 500 is a bug.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web

from common import contract
from common.delegatedauth import DelegatedAuth, metrics_response
from common.errors import Conflict, InvalidInput, NotFound, NotPermitted, TideleaseError
from common.logsetup import add_log_context, log_context
from common.model import Holder, PodRequest
from extender.cluster.state import ClusterState
from extender.cluster.watching import PodCache
from extender.queues.jobviews import held_by_job, job_views, opted_in, preemptor_queue
from extender.scheduler import wire
from extender.scheduler.admitting import placed_request
from extender.scheduler.binding import Binder, BindRefused
from extender.scheduler.filtering import filter_nodes
from extender.scheduler.gangplacement import hold_for_gang
from extender.scheduler.gangvictims import choose_gang_victims, eviction_costs
from extender.scheduler.metrics import ExtenderMetrics
from extender.scheduler.partialpreemption import choose_preemption
from extender.scheduler.scoring import prioritize_nodes
from extender.scheduler.settings import ExtenderSettings
from extender.scheduler.victims import Chooser, noticed_only, preempt_nodes

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


# Request bodies past this get 413 before they are read whole. The NodeNames of 10,000 nodes
# (nodeCacheCapable, as the chart configures kube-scheduler) take about 300 KB; full Node
# objects, without nodeCacheCapable, some 5 KB a node. A body is parsed into Python objects
# several times its size, so this also bounds what one request can cost in memory.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Bodies are read concurrently, one per connection (up to max_connections): without a bound on
# them together, 256 clients each sending just under the cap would hold 2 GiB. A body larger
# than SMALL_BODY_BYTES (or of unknown size: chunked or compressed) reserves its size (the cap,
# when unknown) before it is read, and past BODY_BUDGET_BYTES reserved the request is answered
# 503 at once. Small bodies do not count, so that large ones cannot crowd out kube-scheduler's
# usual calls: 256 of them hold at most 256 MiB.
SMALL_BODY_BYTES = 1024 * 1024
BODY_BUDGET_BYTES = 8 * MAX_BODY_BYTES
# A body must arrive within this (the first-request deadline covers only the request's head):
# a client trickling its body would hold its part of the budget for ever.
BODY_READ_S = 10.0


def readiness(
    *, draining: bool, synced: bool, silent_s: float, stale_after_s: float
) -> web.Response:
    """/readyz of a process that serves from a watched view (the extender, the controllers):
    503 saying why (draining, not synced yet, the API server silent too long), else ok."""
    if draining:
        return web.Response(status=503, text="draining")
    if not synced:
        return web.Response(status=503, text="initial sync not done")
    if silent_s > stale_after_s:
        return web.Response(
            status=503,
            text=f"the API server has not answered for {silent_s:.0f} s: the view may be stale",
        )
    return web.Response(text="ok")


class ExtenderApp:
    """State and verbs of one extender instance (one replica)."""

    def __init__(
        self,
        *,
        settings: ExtenderSettings,
        cluster: ClusterState,
        pods: PodCache,
        binder: Binder,
        metrics: ExtenderMetrics,
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.pods = pods
        self.binder = binder
        self.metrics = metrics
        self.synced = False
        self.draining = False
        # When the store (the API server) last answered, on the monotonic clock; run_api_probe
        # keeps it current. None: not probed yet (ready as soon as synced).
        self.last_reachable: float | None = None
        self.body_bytes = 0  # reserved by the requests whose bodies are being read or handled
        # Who may read /metrics (serving sets it when metrics_auth is on); None: anyone.
        self.metrics_auth: DelegatedAuth | None = None

    def _request(self, pod: dict[str, Any]) -> PodRequest:
        return placed_request(
            self.cluster,
            pod,
            resource=self.settings.gpu_resource,
            online_class=self.settings.online_priority_class,
            release_key=self.settings.queue_release_key(),
        )

    # --- verbs: wire in, decision, wire out ---
    async def filter(self, body: dict[str, Any]) -> tuple[int, Any]:
        args = wire.parse_extender_args(body)
        try:
            req = self._request(args.pod)
        except NotPermitted as e:
            self.metrics.decisions.labels("filter", "refused-pod").inc()
            return 200, wire.filter_error(f"tidelease: {e}")
        except InvalidInput as e:
            self.metrics.decisions.labels("filter", "invalid-pod").inc()
            return 200, wire.filter_error(f"tidelease: {e}")
        decision = filter_nodes(self.cluster, req, args.node_names, now=time.time())
        if req.gang is not None:
            decision = hold_for_gang(
                self.cluster,
                req,
                decision,
                self.settings.weights,
                now=time.monotonic(),
                ttl_s=self.settings.gang_reserve_ttl_s,
            )
        reasons = Counter((*decision.failed.values(), *decision.unresolvable.values()))
        reasons["fits"] = len(decision.passed)
        for reason, n in reasons.items():
            self.metrics.decisions.labels("filter", reason).inc(n)
        return 200, wire.encoded_filter_result(
            args, decision.passed, decision.failed, decision.unresolvable
        )

    async def prioritize(self, body: dict[str, Any]) -> tuple[int, Any]:
        args = wire.parse_extender_args(body)
        try:
            req = self._request(args.pod)
        except NotPermitted:
            # Not placed (the filter says why): no node is better than another for it.
            self.metrics.decisions.labels("prioritize", "refused-pod").inc()
            return 200, wire.encoded_host_priority_list((n, 0) for n in args.node_names)
        scores = prioritize_nodes(self.cluster, req, args.node_names, self.settings.weights)
        return 200, wire.encoded_host_priority_list(scores)

    async def bind(self, body: dict[str, Any]) -> tuple[int, Any]:
        args = wire.parse_binding_args(body)
        del body  # not kept, whatever else it held, while the bind waits for the API server
        try:
            async with asyncio.timeout(self.settings.bind_timeout_s):
                result = await self.binder.bind(
                    args.pod_namespace, args.pod_name, args.pod_uid, args.node
                )
        except TimeoutError:
            # An allocation left behind by the cut-off bind is released by the reaper.
            self.metrics.decisions.labels("bind", "Timeout").inc()
            log.warning(
                "bind of %s/%s to %s timed out", args.pod_namespace, args.pod_name, args.node
            )
            return 200, wire.binding_result(
                f"tidelease: bind did not finish within {self.settings.bind_timeout_s:g} s"
                " (the API server is slow or unreachable)"
            )
        except (BindRefused, NotFound, Conflict, InvalidInput) as e:
            self.metrics.decisions.labels("bind", type(e).__name__).inc()
            log.info(
                "bind of %s/%s to %s refused: %s", args.pod_namespace, args.pod_name, args.node, e
            )
            # Placement's reasons carry the prefix already (they are filter reasons too).
            message = str(e)
            return 200, wire.binding_result(
                message if message.startswith("tidelease: ") else f"tidelease: {message}"
            )
        self.metrics.decisions.labels("bind", "reused" if result.reused else "bound").inc()
        return 200, wire.binding_result()

    async def preempt(self, body: dict[str, Any]) -> tuple[int, Any]:
        args = wire.parse_preemption_args(body)
        try:
            req = self._request(args.pod)
        except NotPermitted:
            # kube-scheduler preempts for pods its own filters refused before asking ours (no
            # node had room): a pod tidelease does not place yet evicts nobody.
            self.metrics.decisions.labels("preempt", "refused-pod").inc()
            return 200, wire.preemption_result({})
        # Gangs broken, then work lost (extender.scheduler.gangvictims), from the pods' view.
        choose: Chooser = functools.partial(
            choose_gang_victims, costs=eviction_costs(self.pods.raw_pods(), time.time())
        )
        if opted_in(args.pod):
            # The shared queues' partial preemption (cornucopia): from the lower queues, the GPUs
            # worth least.
            allocations = [a for state in self.cluster for a in state.allocations.values()]
            jobs = job_views(
                self.pods.raw_pods(),
                held_by_job(allocations),
                now=time.time(),
                resource=self.settings.gpu_resource,
            )
            choose = functools.partial(
                choose_preemption, jobs=jobs, preemptor=preemptor_queue(args.pod, jobs)
            )
            self.metrics.decisions.labels("preempt", "cornucopia").inc()
        # No borrower of the preemptor's own lent devices goes without its reclaim notice.
        choose = noticed_only(choose, self._noticed)
        answer = preempt_nodes(self.cluster, req, args.proposals, choose)
        self.metrics.decisions.labels("preempt", "nodes-kept").inc(len(answer))
        self.metrics.decisions.labels("preempt", "nodes-dropped").inc(
            len(args.proposals) - len(answer)
        )
        return 200, wire.preemption_result(answer)

    def _noticed(self, holder: Holder) -> bool:
        """Whether the pod ``holder`` names (that very pod) carries a reclaim notice."""
        pod = self.pods.get(holder.namespace, holder.name)
        if pod is None:
            return False
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return meta.get("uid") == holder.pod_uid and contract.ANN_RECLAIM_NOTICE in annotations

    # --- aiohttp plumbing ---
    def _route(
        self, verb: str, handler: Handler
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        requests = self.metrics.requests
        latency = self.metrics.latency.labels(verb)

        async def handle(request: web.Request) -> web.Response:
            with log_context(verb=verb):
                return await answer(request)

        async def answer(request: web.Request) -> web.Response:
            start = time.perf_counter()
            outcome = "ok"
            declared = request.content_length
            if declared is not None and declared > MAX_BODY_BYTES:
                raise web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, declared)  # before reading
            reserved = MAX_BODY_BYTES
            if declared is not None and hdrs.CONTENT_ENCODING not in request.headers:
                reserved = declared if declared > SMALL_BODY_BYTES else 0
            if self.body_bytes + reserved > BODY_BUDGET_BYTES:
                outcome, status = "error", 503
                reply: Any = {"Error": "tidelease: too many request bodies in flight, try again"}
            else:
                self.body_bytes += reserved
                try:
                    body = wire.decode(await self._body(request))
                    add_log_context(**wire.pod_fields(body))
                    status, reply = await handler(body)
                except InvalidInput as e:
                    outcome, status, reply = "bad_request", 400, {"Error": f"tidelease: {e}"}
                    log.info("%s answered 400: %s", verb, e)
                except TideleaseError as e:
                    outcome, status, reply = "error", 503, {"Error": f"tidelease: {e}"}
                finally:
                    self.body_bytes -= reserved
            if outcome == "ok" and isinstance(reply, dict) and reply.get("Error"):
                outcome = "error"
            latency.observe(time.perf_counter() - start)
            requests.labels(verb, outcome).inc()
            return web.Response(
                body=wire.encode(reply), status=status, content_type="application/json"
            )

        return handle

    @staticmethod
    async def _body(request: web.Request) -> bytes:
        try:
            async with asyncio.timeout(BODY_READ_S):
                return await request.read()
        except TimeoutError:
            raise web.HTTPRequestTimeout(
                text=f"tidelease: request body not received within {BODY_READ_S:g} s"
            ) from None

    def silent_for(self) -> float:
        """Seconds since the API server last answered (0 before the first probe)."""
        if self.last_reachable is None:
            return 0.0
        return time.monotonic() - self.last_reachable

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, _: web.Request) -> web.Response:
        return readiness(
            draining=self.draining,
            synced=self.synced,
            silent_s=self.silent_for(),
            stale_after_s=self.settings.stale_after_s,
        )

    async def metrics_view(self, request: web.Request) -> web.Response:
        return await metrics_response(self.metrics.registry, self.metrics_auth, request)

    def web_app(self, *, probes: bool = True) -> web.Application:
        """The verbs; with ``probes``, also /healthz, /readyz and /metrics."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/filter", self._route("filter", self.filter))
        app.router.add_post("/prioritize", self._route("prioritize", self.prioritize))
        app.router.add_post("/bind", self._route("bind", self.bind))
        app.router.add_post("/preempt", self._route("preempt", self.preempt))
        if probes:
            self._add_probes(app)
        return app

    def probes_app(self) -> web.Application:
        """/healthz, /readyz and /metrics alone, for a port of their own."""
        app = web.Application(client_max_size=1024)
        self._add_probes(app)
        return app

    def _add_probes(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_view)
