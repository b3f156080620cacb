"""The serving agent's check of who is asking: a TokenReview of the peer's token, cached.

:class:`PeerVerifier` is what the server needs; :class:`TokenReviewVerifier` asks the API
server (``spec.audiences`` set to the cache's audience, so a token issued for the API server or
anything else is not valid here) and judges the answer with :func:`identity.judge_review`.
Verdicts are cached by the token's sha256 (never the token) in a bounded LRU: a peer's yes for
``allowed_ttl_s`` (30 s: a deleted pod's token stops working within that), a no for
``refused_ttl_s``; an API server that did not answer is asked again next time. Reviews of tokens
not in the cache are rate-limited (a token bucket), so that a flood of random tokens costs the
API server a bounded number of calls: past the limit the answer is 429 and nothing is served.

:class:`NoVerifier` refuses everyone (an agent without an API server serves nobody); the fakes
for tests are in ``nodeagent.cache.testing``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from common.delegatedauth import Reviewer
from common.errors import TideleaseError
from common.reviewcache import ExpiringCache, TokenBucket
from nodeagent.cache.identity import PeerVerdict, bearer_token, judge_review

log = logging.getLogger(__name__)

ALLOWED_TTL_S: Final = 30.0
REFUSED_TTL_S: Final = 10.0
CACHE_SIZE: Final = 1024
REVIEWS_PER_S: Final = 20.0
REVIEW_BURST: Final = 50
MAX_TOKEN_BYTES: Final = 16 << 10  # a projected token is about 1 KiB


class PeerVerifier(Protocol):
    async def verify(self, authorization: str | None) -> PeerVerdict:
        """The verdict on an ``Authorization`` header."""
        ...


class NoVerifier:
    """No way to verify anyone: every request is refused."""

    async def verify(self, authorization: str | None) -> PeerVerdict:
        return PeerVerdict(503, "this cache cannot verify peers (no API server)")


class TokenReviewVerifier:
    """Peers are the ``user`` (the agents' ServiceAccount) holding a token for ``audience``,
    bound to a pod on a node; asked of the API server with a TokenReview."""

    def __init__(
        self,
        api: Reviewer,
        *,
        audience: str,
        user: str,
        clock: Callable[[], float] = time.monotonic,
        allowed_ttl_s: float = ALLOWED_TTL_S,
        refused_ttl_s: float = REFUSED_TTL_S,
        cache_size: int = CACHE_SIZE,
        reviews_per_s: float = REVIEWS_PER_S,
        review_burst: int = REVIEW_BURST,
    ) -> None:
        self._api = api
        self.audience, self.user = audience, user
        self._clock = clock
        self._ttl = (allowed_ttl_s, refused_ttl_s)
        self._cache: ExpiringCache[bytes, PeerVerdict] = ExpiringCache(cache_size)
        self._bucket = TokenBucket(reviews_per_s, review_burst, clock)
        self.reviews = 0  # TokenReviews sent (tests, metrics)

    async def verify(self, authorization: str | None) -> PeerVerdict:
        token = bearer_token(authorization)
        if token is None:
            return PeerVerdict(401, "a bearer token (the agent's projected token) is required")
        if len(token) > MAX_TOKEN_BYTES or token.count(".") != 2:
            return PeerVerdict(401, "the token is not a ServiceAccount token")
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        cached = self._cache.get(key, now)
        if cached is not None:
            return cached
        if not self._bucket.take():
            return PeerVerdict(429, "too many unknown tokens; try again later")
        verdict = await self._review(token)
        if verdict.status in (200, 401, 403):
            ttl = self._ttl[0] if verdict.allowed else self._ttl[1]
            self._cache.put(key, now + ttl, verdict)
        return verdict

    async def _review(self, token: str) -> PeerVerdict:
        self.reviews += 1
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        try:
            review = await self._api.json(
                "POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body, request_timeout=5
            )
        except TideleaseError as e:
            log.warning("cache: cannot review a peer's token: %s", e)
            return PeerVerdict(503, "the API server could not review the token")
        status = review.get("status")
        return judge_review(
            status if isinstance(status, dict) else {}, audience=self.audience, user=self.user
        )
