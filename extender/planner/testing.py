"""Fakes of the live planner's inputs and outputs, for tests: a traffic source in memory
(:class:`FakeTrafficSource`), a Prometheus HTTP API over synthetic series (:class:`FakePrometheus`,
answering ``/api/v1/query`` and ``/api/v1/query_range`` in Prometheus's exact JSON), a synthetic
tidal job (:class:`TidalJob`), and the API server's GpuLeases and Events in memory
(:class:`MemoryLeases`, :class:`MemoryLeaseEvents`). Production code does not import this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from common.errors import Conflict, InvalidInput, NotFound
from common.queryscope import DEFAULT_LABEL, scope_query
from common.watches import object_key
from extender.planner.stepping import Observations, Queries
from extender.planner.throughput import ThroughputModel, min_workers

MAX_POINTS = 11000  # Prometheus refuses a range query with more points per series


def _scoped_key(known: Iterable[str], query: str, namespace: str | None, label: str) -> str | None:
    """The known query that ``query`` is: itself, or (a fake holding one namespace's series)
    the one it is once scoped to ``namespace`` (common/queryscope.py), as the controllers run
    a tenant's query; an unscoped query then reads nothing."""
    if namespace is None:
        return query if query in known else None
    for k in known:
        try:
            if scope_query(k, namespace, label) == query:
                return k
        except InvalidInput:
            continue
    return None


@dataclass
class FakeTrafficSource:
    """Observations set by the test, per traffic query; an exception set in ``fail`` is raised.
    With ``namespace`` set the observations are that namespace's: they answer the traffic
    query scoped to it (``label="<namespace>"`` on every selector), and only that. ``asked``
    records the queries received."""

    by_traffic_query: dict[str, Observations] = field(default_factory=dict)
    fail: Exception | None = None
    calls: int = 0
    namespace: str | None = None
    label: str = DEFAULT_LABEL
    asked: list[Queries] = field(default_factory=list)

    async def observe(
        self, queries: Queries, *, at_s: float, history_s: float, step_s: float
    ) -> Observations:
        self.calls += 1
        self.asked.append(queries)
        if self.fail is not None:
            raise self.fail
        key = _scoped_key(self.by_traffic_query, queries.traffic, self.namespace, self.label)
        if key is None:
            raise NotFound(f"no observations for {queries.traffic!r}")
        return self.by_traffic_query[key]


Series = Callable[[float], float]  # value at a unix time; NaN: no sample


def _error(status: int, kind: str, message: str) -> web.Response:
    body = {"status": "error", "errorType": kind, "error": message}
    return web.json_response(body, status=status)


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if v != int(v) else str(int(v))


@dataclass
class FakePrometheus:
    """A Prometheus HTTP API over synthetic series: each known PromQL string is a function of
    time, answered as one series (``{}`` labels) in Prometheus's exact JSON. An unknown query
    is a ``bad_data`` parse error, as Prometheus answers a query it cannot parse; a series in
    ``empty`` answers no data; ``down`` answers 503. Sample timestamps are the query's times,
    as Prometheus evaluates them (``start + k * step <= end``). With ``namespace`` set the
    series are that namespace's: a known query is answered scoped to it (``label="<namespace>"``
    on every selector, as tidelease's controllers run tenants' queries), and only so.
    ``requests`` records every request (path, parameters)."""

    series: dict[str, Series] = field(default_factory=dict)
    empty: set[str] = field(default_factory=set)
    down: bool = False
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    namespace: str | None = None
    label: str = DEFAULT_LABEL

    def queries(self) -> list[str]:
        """The queries received, in order."""
        return [params.get("query", "") for _, params in self.requests]

    def app(self) -> web.Application:
        app = web.Application()
        for endpoint, handler in (("query", self._query), ("query_range", self._query_range)):
            app.router.add_get(f"/api/v1/{endpoint}", handler)
            app.router.add_post(f"/api/v1/{endpoint}", handler)
        return app

    async def _params(self, request: web.Request) -> dict[str, str]:
        params = dict(request.query)
        if request.method == "POST":
            params.update({k: str(v) for k, v in (await request.post()).items()})
        self.requests.append((request.path, params))
        return params

    def _lookup(self, query: str | None) -> Series | web.Response:
        if not query:
            return _error(400, "bad_data", 'invalid parameter "query": empty query')
        key = _scoped_key(self.series, query, self.namespace, self.label)
        if key is None:
            return _error(400, "bad_data", f'invalid parameter "query": 1:1: parse error: {query}')
        return self.series[key]

    def _empty(self, query: str) -> bool:
        return _scoped_key(self.empty, query, self.namespace, self.label) is not None

    async def _asked(self, request: web.Request) -> tuple[dict[str, str], Series] | web.Response:
        """The request's parameters and the series its query names, or the error reply."""
        params = await self._params(request)
        if self.down:
            return _error(503, "timeout", "query timed out in expression evaluation")
        fn = self._lookup(params.get("query"))
        if isinstance(fn, web.Response):
            return fn
        return params, fn

    async def _query(self, request: web.Request) -> web.Response:
        asked = await self._asked(request)
        if isinstance(asked, web.Response):
            return asked
        params, fn = asked
        try:
            at = float(params["time"])
        except (KeyError, ValueError):
            return _error(400, "bad_data", 'invalid parameter "time"')
        query = params["query"]
        value = fn(at)
        result: list[dict[str, Any]] = []
        if not self._empty(query) and not math.isnan(value):
            result = [{"metric": {}, "value": [at, _value(value)]}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    async def _query_range(self, request: web.Request) -> web.Response:
        asked = await self._asked(request)
        if isinstance(asked, web.Response):
            return asked
        params, fn = asked
        try:
            start, end = float(params["start"]), float(params["end"])
            step = float(params["step"])
        except (KeyError, ValueError):
            return _error(400, "bad_data", 'invalid parameter "start", "end" or "step"')
        if end < start:
            return _error(400, "bad_data", "end timestamp must not be before start time")
        if step <= 0:
            return _error(
                400,
                "bad_data",
                "zero or negative query resolution step widths are "
                "not accepted. Try a positive integer",
            )
        if (end - start) / step > MAX_POINTS:
            return _error(
                400,
                "bad_data",
                "exceeded maximum resolution of 11,000 points per "
                "timeseries. Try decreasing the query resolution (?step=XX)",
            )
        query = params["query"]
        values = []
        k = 0
        while start + k * step <= end:
            t = start + k * step
            v = fn(t)
            if not math.isnan(v):  # a missing sample, as a gap in the series
                values.append([t, _value(v)])
            k += 1
        result = [] if self._empty(query) or not values else [{"metric": {}, "values": values}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "matrix", "result": result}}
        )


@dataclass(frozen=True, slots=True)
class TidalJob:
    """A synthetic online job for the fakes: a daily tide of incoming samples/s between
    ``trough`` and ``peak`` (lowest at 04:00 UTC), run in the past with the fewest workers of
    ``model`` carrying ``1 + margin`` times the traffic, each processing at its capacity."""

    model: ThroughputModel
    trough: float = 30_000.0
    peak: float = 150_000.0
    margin: float = 0.2
    queries: Queries = field(
        default_factory=lambda: Queries(
            traffic='sum(rate(job_input_samples_total{job="tidal"}[5m]))',
            workers='count(up{job="tidal-worker"} == 1)',
            throughput='sum(rate(trainer_samples_total{job="tidal"}[5m]))',
            lag='max(job_input_lag_seconds{job="tidal"}) or vector(0)',
        )
    )

    def traffic(self, t: float) -> float:
        phase = 2.0 * math.pi * ((t - 4 * 3600.0) % 86400.0) / 86400.0
        return self.trough + (self.peak - self.trough) * (1.0 - math.cos(phase)) / 2.0

    def workers(self, t: float) -> float:
        w = min_workers(self.model, self.traffic(t) * (1.0 + self.margin), highest=1024)
        return float(w or 1024)

    def throughput(self, t: float) -> float:
        return self.model.predict(round(self.workers(t)))

    def series(self) -> dict[str, Series]:
        q = self.queries
        out: dict[str, Series] = {
            q.traffic: self.traffic,
            q.workers: self.workers,
            q.throughput: self.throughput,
        }
        if q.lag is not None:
            out[q.lag] = lambda t: 0.0
        return out


@dataclass
class MemoryLeaseEvents:
    """The Events posted, as (lease key, reason, message)."""

    posted: list[tuple[str, str, str]] = field(default_factory=list)

    async def warn(self, lease: Mapping[str, Any], reason: str, message: str) -> None:
        self.posted.append((object_key(lease), reason, message))


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


@dataclass
class MemoryLeases:
    """A faithful fake of the API server's GpuLeases for the planner: merge patches conditioned
    on resourceVersion, which every write bumps; ``writes`` records (namespace, name, patch)."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    _version: int = 0

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace (as another writer would): a new resourceVersion."""
        self._version += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._version)
        self.objects[f"{meta['namespace']}/{meta['name']}"] = obj
        return obj

    async def patch_spec(
        self, namespace: str, name: str, resource_version: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        key = f"{namespace}/{name}"
        current = self.objects.get(key)
        if current is None:
            raise NotFound(f"GpuLease {key} not found")
        if current["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(f"GpuLease {key}: the object has been modified")
        self.writes.append((namespace, name, patch))
        return self.put(merge(current, patch))
