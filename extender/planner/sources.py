"""Where the live planner learns a job's traffic: the :class:`TrafficSource` protocol and its
implementation on Prometheus's HTTP API (the tests' fakes of both are in
:mod:`extender.planner.testing`).

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
from collections.abc import Mapping
from typing import Protocol

import aiohttp

from common.coercion import number
from common.errors import InvalidInput, Unavailable
from extender.planner.stepping import Observations, Queries, pair_throughput


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
    if not number(t):
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
