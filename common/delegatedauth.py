"""Who may read an endpoint such as /metrics, asked of the API server as kube-scheduler and the
kubelet do for theirs: the bearer token is authenticated with a TokenReview, and the user it
names is authorized with a SubjectAccessReview for ``get`` on the non-resource URL (what
Prometheus' ClusterRole grants with ``nonResourceURLs: ["/metrics"]``).

Answers are cached by the token's sha256 (never the token) for a minute (allowed) or ten
seconds (refused), so that a scrape every few seconds costs the API server two calls a minute.
Allowed and refused answers are kept in two bounded LRUs of their own: a flood of bad tokens
pushes out other refusals, never the scraper's cached yes. Reviews of tokens not in the cache are
rate-limited (a token bucket, ``REVIEWS_PER_S`` with bursts of ``REVIEW_BURST``): a client sending
random tokens costs the API server at most that many TokenReviews, and past it is answered 429
with ``Retry-After`` (nothing cached: the same token is reviewed once the bucket has refilled).
Concurrent requests with the same token wait for one review.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from common.errors import TideleaseError
from common.reviewcache import ExpiringCache, TokenBucket

log = logging.getLogger(__name__)

ALLOWED_TTL_S = 60.0
REFUSED_TTL_S = 10.0
CACHE_SIZE = 1024  # each of the two caches (allowed, refused)
REVIEWS_PER_S = 2.0  # reviews of tokens not in the cache, sustained
REVIEW_BURST = 20
MAX_TOKEN_BYTES = 16 << 10  # refused unreviewed; a ServiceAccount token is about 1 KiB


@dataclass(frozen=True, slots=True)
class Verdict:
    status: int  # 200: allowed; 401: no or bad credentials; 403: not allowed;
    # 429: too many unknown tokens lately, try later; 503: cannot tell
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


class Reviewer(Protocol):
    """What the API server's review endpoints need: a JSON POST (common.kubeclient.KubeClient)."""

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]: ...


_Key = tuple[bytes, str]  # the token's sha256, the path


class DelegatedAuth:
    def __init__(
        self,
        api: Reviewer,
        *,
        clock: Callable[[], float] = time.monotonic,
        cache_size: int = CACHE_SIZE,
        reviews_per_s: float = REVIEWS_PER_S,
        review_burst: int = REVIEW_BURST,
    ) -> None:
        self._api = api
        self._clock = clock
        self._allowed = ExpiringCache[_Key, Verdict](cache_size)
        self._refused = ExpiringCache[_Key, Verdict](cache_size)
        self._bucket = TokenBucket(reviews_per_s, review_burst, clock)
        self._pending: dict[_Key, asyncio.Future[Verdict]] = {}
        self.reviews = 0  # TokenReviews sent (tests, metrics)
        self.throttled = 0  # unknown tokens answered 429 unreviewed

    async def check(self, authorization: str | None, path: str) -> Verdict:
        """The verdict for an ``Authorization`` header asking to GET ``path``."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Verdict(401, "a bearer token is required")
        if len(token) > MAX_TOKEN_BYTES:
            return Verdict(401, "the token is not valid")
        key = (hashlib.sha256(token.encode()).digest(), path)
        now = self._clock()
        cached = self._allowed.get(key, now) or self._refused.get(key, now)
        if cached is not None:
            return cached
        pending = self._pending.get(key)
        if pending is None:
            if not self._bucket.take():
                self.throttled += 1
                return Verdict(429, "too many unknown tokens lately; try again later")
            pending = asyncio.ensure_future(self._review_and_keep(key, token, path))
            self._pending[key] = pending
        # Shielded: a client that goes away does not cancel the review the others wait for.
        return await asyncio.shield(pending)

    async def _review_and_keep(self, key: _Key, token: str, path: str) -> Verdict:
        try:
            verdict = await self._review(token, path)
        finally:
            self._pending.pop(key, None)
        now = self._clock()
        if verdict.allowed:
            self._allowed.put(key, now + ALLOWED_TTL_S, verdict)
        elif verdict.status in (401, 403):
            self._refused.put(key, now + REFUSED_TTL_S, verdict)
        # 503 (the API server did not answer): asked again next time
        return verdict

    async def _review(self, token: str, path: str) -> Verdict:
        self.reviews += 1
        try:
            review = await self._api.json(
                "POST",
                "/apis/authentication.k8s.io/v1/tokenreviews",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                      "spec": {"token": token}},
                request_timeout=5,
            )  # fmt: skip
            status = review.get("status") or {}
            if not status.get("authenticated"):
                return Verdict(401, "the token is not valid")
            user = status.get("user") or {}
            spec: dict[str, Any] = {
                "user": user.get("username", ""),
                "groups": user.get("groups") or [],
                "nonResourceAttributes": {"path": path, "verb": "get"},
            }
            if user.get("uid"):
                spec["uid"] = user["uid"]
            if user.get("extra"):
                spec["extra"] = user["extra"]
            access = await self._api.json(
                "POST",
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": spec},
                request_timeout=5,
            )  # fmt: skip
        except TideleaseError as e:
            log.warning("cannot review a request for %s: %s", path, e)
            return Verdict(503, "the API server could not review the credentials")
        if not (access.get("status") or {}).get("allowed"):
            return Verdict(403, f"{spec['user'] or 'this user'} may not get {path}")
        return Verdict(200, "ok")


async def refusal(auth: DelegatedAuth | None, request: web.Request) -> web.Response | None:
    """The response refusing ``request`` (401 with a Bearer challenge, 403, 429 with
    Retry-After, 503), or None
    when it may go on (or when no ``auth`` is asked for)."""
    if auth is None:
        return None
    verdict = await auth.check(request.headers.get(hdrs.AUTHORIZATION), request.path)
    if verdict.allowed:
        return None
    headers = (
        {"WWW-Authenticate": "Bearer"}
        if verdict.status == 401
        else {"Retry-After": "1"}
        if verdict.status == 429
        else None
    )
    return web.Response(status=verdict.status, text=verdict.reason, headers=headers)


async def metrics_response(
    registry: CollectorRegistry, auth: DelegatedAuth | None, request: web.Request
) -> web.Response:
    """/metrics: the registry's samples in Prometheus' text format, for allowed callers."""
    refused = await refusal(auth, request)
    if refused is not None:
        return refused
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )
