"""Where the live planner learns a job's traffic: the :class:`TrafficSource` protocol, its real
implementation on Prometheus's HTTP API, and two fakes (an in-memory source, and a Prometheus
server answering ``/api/v1/query`` and ``/api/v1/query_range`` from synthetic series).

Prometheus's envelope (https://prometheus.io/docs/prometheus/latest/querying/api/)::

    {"status": "success" | "error", "data": <data>, "errorType": "...", "error": "...",
     "warnings": [...], "infos": [...]}
    data = {"resultType": "vector" | "matrix" | "scalar" | "string", "result": <value>}
    vector: [{"metric": {labels}, "value": [<unix time>, "<sample value>"]}, ...]
    matrix: [{"metric": {labels}, "values": [[<unix time>, "<sample value>"], ...]}, ...]
    scalar: [<unix time>, "<value>"]

Sample values are strings ("NaN", "+Inf" and "-Inf" included). Errors come with 400
(bad_data), 422 (execution) or 503 (timeout/canceled) and ``status: "error"``. Each query of a
job must give exactly one series (write ``sum(...)``; ``... or vector(0)`` where no data means
zero). Parsing is pure and lives here at the boundary: raw JSON does not travel inward.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from common.errors import InvalidInput, NotFound, Unavailable
from common.queryscope import DEFAULT_LABEL, scope_query
from extender.planner.stepping import Observations, Queries, pair_throughput
from extender.planner.throughput import ThroughputModel, min_workers

MAX_POINTS = 11000  # Prometheus refuses a range query with more points per series


class TrafficSource(Protocol):
    """A job's traffic: now, and its history at the planning step."""

    async def observe(
        self, queries: Queries, *, at_s: float, history_s: float, step_s: float
    ) -> Observations:
        """Unavailable when the source cannot be reached (or times out); InvalidInput when it
        answers with something unusable (an error, no data, several series, NaN now)."""
        ...


# --- parsing Prometheus's replies (pure) ---


def _sample(pair: object, what: str) -> tuple[float, float]:
    if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
        raise InvalidInput(f'{what}: want [<unix time>, "<value>"], got {pair!r:.80}')
    t, v = pair
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise InvalidInput(f"{what}: timestamp {t!r:.40} is not a number")
    try:
        return float(t), float(v)  # float() reads "NaN", "+Inf", "-Inf" as Prometheus writes
    except ValueError:
        raise InvalidInput(f"{what}: sample value {v!r:.40} is not a number") from None


def result_data(body: object, what: str) -> tuple[str, object]:
    """``(resultType, result)`` of a reply; InvalidInput for an error reply or a bad shape."""
    if not isinstance(body, dict):
        raise InvalidInput(f"{what}: reply is not a JSON object")
    if body.get("status") != "success":
        kind = body.get("errorType", "unknown")
        raise InvalidInput(f"{what}: Prometheus error ({kind}): {body.get('error', '')}")
    data = body.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("resultType"), str):
        raise InvalidInput(f"{what}: reply has no data.resultType")
    return data["resultType"], data.get("result")


def parse_instant(body: object, what: str) -> float:
    """The one finite value of an instant query (a one-series vector, or a scalar)."""
    rtype, result = result_data(body, what)
    if rtype == "scalar":
        _, value = _sample(result, what)
    elif rtype == "vector":
        if not isinstance(result, list):
            raise InvalidInput(f"{what}: vector result is not a list")
        if not result:
            raise InvalidInput(f"{what}: no data (empty vector)")
        if len(result) > 1:
            raise InvalidInput(f"{what}: {len(result)} series, want one (aggregate with sum)")
        series = result[0]
        if not isinstance(series, dict):
            raise InvalidInput(f"{what}: vector element is not an object")
        _, value = _sample(series.get("value"), what)
    else:
        raise InvalidInput(f"{what}: resultType {rtype}, want vector or scalar")
    if not math.isfinite(value):
        raise InvalidInput(f"{what}: value is {value}")
    return value


def parse_range(body: object, what: str) -> tuple[tuple[float, float], ...]:
    """The ``(time, value)`` points of a one-series range query, NaN and infinite values
    dropped; empty when there is no data."""
    rtype, result = result_data(body, what)
    if rtype != "matrix" or not isinstance(result, list):
        raise InvalidInput(f"{what}: resultType {rtype}, want matrix")
    if not result:
        return ()
    if len(result) > 1:
        raise InvalidInput(f"{what}: {len(result)} series, want one (aggregate with sum)")
    series = result[0]
    values = series.get("values") if isinstance(series, dict) else None
    if not isinstance(values, list):
        raise InvalidInput(f"{what}: matrix series without values")
    points = (_sample(p, what) for p in values)
    return tuple((t, v) for t, v in points if math.isfinite(v))


# --- the real source ---


class PrometheusSource:
    """Prometheus's HTTP API at ``base_url`` (e.g. ``http://prometheus.monitoring:9090``)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 30.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._session = session
        self._own = session is None

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, endpoint: str, params: Mapping[str, str], what: str) -> object:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = f"{self._base}/api/v1/{endpoint}"
        try:
            async with self._session.post(
                url, data=dict(params), timeout=aiohttp.ClientTimeout(total=self._timeout_s)
            ) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unavailable(f"{what}: {url}: {e or type(e).__name__}") from e
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if status >= 500 and (not isinstance(body, dict) or body.get("status") != "error"):
            raise Unavailable(f"{what}: {url}: HTTP {status}")
        if status == 503:
            raise Unavailable(f"{what}: {url}: {body.get('error', '') if body else ''}")
        if body is None:
            raise InvalidInput(f"{what}: {url}: HTTP {status}, reply is not JSON")
        return body

    async def instant(self, query: str, at_s: float, what: str) -> float:
        body = await self._get("query", {"query": query, "time": f"{at_s:.3f}"}, what)
        return parse_instant(body, what)

    async def range(
        self, query: str, start_s: float, end_s: float, step_s: float, what: str
    ) -> tuple[tuple[float, float], ...]:
        params = {
            "query": query,
            "start": f"{start_s:.3f}",
            "end": f"{end_s:.3f}",
            "step": f"{step_s:g}",
        }
        return parse_range(await self._get("query_range", params, what), what)

    async def observe(
        self, queries: Queries, *, at_s: float, history_s: float, step_s: float
    ) -> Observations:
        # Aligned to the step, as Grafana does: the same history on every replica and restart.
        end = math.floor(at_s / step_s) * step_s
        start = end - history_s

        async def optional(query: str | None, what: str) -> float:
            return 0.0 if query is None else await self.instant(query, at_s, what)

        now = asyncio.gather(
            self.instant(queries.traffic, at_s, "traffic query"),
            self.instant(queries.workers, at_s, "workers query"),
            optional(queries.lag, "lag query"),
            optional(queries.backlog, "backlog query"),
        )
        past = asyncio.gather(
            self.range(queries.traffic, start, end, step_s, "traffic query (range)"),
            self.range(queries.workers, start, end, step_s, "workers query (range)"),
            self.range(queries.throughput, start, end, step_s, "throughput query (range)"),
        )
        try:
            (rate, workers, lag, backlog), (traffic, counts, throughput) = await asyncio.gather(
                now, past
            )
        except BaseException:
            now.cancel()
            past.cancel()
            await asyncio.gather(now, past, return_exceptions=True)
            raise
        return Observations(
            at_s=at_s,
            rate=max(0.0, rate),
            workers=max(0, round(workers)),
            backlog=max(0.0, backlog),
            lag_s=max(0.0, lag),
            traffic=traffic,
            throughput=pair_throughput(counts, throughput),
        )


# --- fakes ---


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
