"""Who may read an endpoint such as /metrics, asked of the API server as kube-scheduler and the
kubelet do for theirs: the bearer token is authenticated with a TokenReview, and the user it
names is authorized with a SubjectAccessReview for ``get`` on the non-resource URL (what
Prometheus' ClusterRole grants with ``nonResourceURLs: ["/metrics"]``).

Answers are cached by the token's hash for a minute (allowed) or ten seconds (refused), in a
bounded LRU, so that a scrape every few seconds costs the API server two calls a minute.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from common.errors import TideleaseError

log = logging.getLogger(__name__)

ALLOWED_TTL_S = 60.0
REFUSED_TTL_S = 10.0
CACHE_SIZE = 1024


@dataclass(frozen=True, slots=True)
class Verdict:
    status: int  # 200: allowed; 401: no or bad credentials; 403: not allowed; 503: cannot tell
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


class Reviewer(Protocol):
    """What the API server's review endpoints need: a JSON POST (common.kubeclient.KubeClient)."""

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]: ...


class DelegatedAuth:
    def __init__(self, api: Reviewer, *, clock: Any = time.monotonic) -> None:
        self._api = api
        self._clock = clock
        self._cache: OrderedDict[tuple[bytes, str], tuple[float, Verdict]] = OrderedDict()

    async def check(self, authorization: str | None, path: str) -> Verdict:
        """The verdict for an ``Authorization`` header asking to GET ``path``."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Verdict(401, "a bearer token is required")
        key = (hashlib.sha256(token.strip().encode()).digest(), path)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            self._cache.move_to_end(key)
            return cached[1]
        verdict = await self._review(token.strip(), path)
        if verdict.status != 503:  # an API server that did not answer is asked again next time
            ttl = ALLOWED_TTL_S if verdict.allowed else REFUSED_TTL_S
            self._cache[key] = (now + ttl, verdict)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return verdict

    async def _review(self, token: str, path: str) -> Verdict:
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
    """The response refusing ``request`` (401 with a Bearer challenge, 403, 503), or None
    when it may go on (or when no ``auth`` is asked for)."""
    if auth is None:
        return None
    verdict = await auth.check(request.headers.get(hdrs.AUTHORIZATION), request.path)
    if verdict.allowed:
        return None
    headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else None
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
