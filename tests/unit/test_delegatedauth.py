"""common.delegatedauth: /metrics tokens reviewed by the API server, cached by hash, and the
reviews of unknown tokens rate-limited (issue 31: a random token cost one TokenReview each)."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from common.delegatedauth import (
    ALLOWED_TTL_S,
    REFUSED_TTL_S,
    REVIEW_BURST,
    REVIEWS_PER_S,
    DelegatedAuth,
    refusal,
)
from common.errors import Unavailable

GOOD = "the-scrapers-token"
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeApi:
    """An API server that knows one token (allowed /metrics); counts the reviews asked of it."""

    def __init__(self, *, gate: asyncio.Event | None = None, down: bool = False) -> None:
        self.tokenreviews = 0
        self.accessreviews = 0
        self._gate = gate
        self._down = down

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if self._down:
            raise Unavailable("the API server does not answer")
        if self._gate is not None:
            await self._gate.wait()
        spec = kwargs["body"]["spec"]
        if path == TOKENREVIEWS:
            self.tokenreviews += 1
            ok = spec["token"] == GOOD
            user = {"username": "system:serviceaccount:monitoring:prometheus"}
            return {"status": {"authenticated": ok, "user": user if ok else {}}}
        self.accessreviews += 1
        return {"status": {"allowed": spec["nonResourceAttributes"]["path"] == "/metrics"}}


def bearer(token: str) -> str:
    return f"Bearer {token}"


async def test_a_thousand_random_tokens_cost_at_most_the_burst_and_the_scraper_is_served() -> None:
    api, clock = FakeApi(), Clock()
    auth = DelegatedAuth(api, clock=clock)
    assert (await auth.check(bearer(GOOD), "/metrics")).allowed
    assert api.tokenreviews == 1

    statuses = [
        (await auth.check(bearer(secrets.token_urlsafe(32)), "/metrics")).status
        for _ in range(1000)
    ]
    # One token was already taken by the scraper's first review.
    assert api.tokenreviews <= REVIEW_BURST
    assert statuses.count(401) == REVIEW_BURST - 1
    assert statuses.count(429) == 1000 - (REVIEW_BURST - 1)
    # The scraper's token is served from the cache, the flood notwithstanding.
    reviews = api.tokenreviews
    for _ in range(100):
        assert (await auth.check(bearer(GOOD), "/metrics")).allowed
    assert api.tokenreviews == reviews


async def test_the_bucket_refills_at_its_rate() -> None:
    api, clock = FakeApi(), Clock()
    auth = DelegatedAuth(api, clock=clock)
    for _ in range(REVIEW_BURST):
        assert (await auth.check(bearer(secrets.token_hex(8)), "/metrics")).status == 401
    assert (await auth.check(bearer("one-more"), "/metrics")).status == 429
    clock.now += 10
    sent = api.tokenreviews
    statuses = [
        (await auth.check(bearer(secrets.token_hex(8)), "/metrics")).status for _ in range(100)
    ]
    assert api.tokenreviews - sent == int(10 * REVIEWS_PER_S)
    assert statuses.count(401) == int(10 * REVIEWS_PER_S)


async def test_a_refused_token_is_cached_for_its_ttl_and_an_allowed_one_for_its_own() -> None:
    api, clock = FakeApi(), Clock()
    auth = DelegatedAuth(api, clock=clock)
    for _ in range(5):
        assert (await auth.check(bearer("bad"), "/metrics")).status == 401
        assert (await auth.check(bearer(GOOD), "/metrics")).allowed
    assert api.tokenreviews == 2
    clock.now += REFUSED_TTL_S + 0.1
    assert (await auth.check(bearer("bad"), "/metrics")).status == 401
    assert (await auth.check(bearer(GOOD), "/metrics")).allowed
    assert api.tokenreviews == 3  # the refusal expired, the yes did not
    clock.now += ALLOWED_TTL_S
    assert (await auth.check(bearer(GOOD), "/metrics")).allowed
    assert api.tokenreviews == 4


async def test_refusals_do_not_push_the_allowed_out() -> None:
    api, clock = FakeApi(), Clock()
    auth = DelegatedAuth(api, clock=clock, cache_size=8, review_burst=10_000)
    assert (await auth.check(bearer(GOOD), "/metrics")).allowed
    for i in range(100):
        assert (await auth.check(bearer(f"bad-{i}"), "/metrics")).status == 401
    reviews = api.tokenreviews
    assert (await auth.check(bearer(GOOD), "/metrics")).allowed
    assert api.tokenreviews == reviews


async def test_concurrent_requests_with_one_token_wait_for_one_review() -> None:
    gate = asyncio.Event()
    api = FakeApi(gate=gate)
    auth = DelegatedAuth(api, clock=Clock())
    checks = [asyncio.create_task(auth.check(bearer(GOOD), "/metrics")) for _ in range(50)]
    await asyncio.sleep(0)
    gate.set()
    verdicts = await asyncio.gather(*checks)
    assert all(v.allowed for v in verdicts)
    assert api.tokenreviews == 1


async def test_an_api_server_that_does_not_answer_is_asked_again() -> None:
    auth = DelegatedAuth(FakeApi(down=True), clock=Clock())
    assert (await auth.check(bearer(GOOD), "/metrics")).status == 503
    assert (await auth.check(bearer(GOOD), "/metrics")).status == 503
    assert auth.reviews == 2


@pytest.mark.parametrize(
    ("header", "status"),
    [
        pytest.param(None, 401, id="no-token"),
        pytest.param("Basic abc", 401, id="not-bearer"),
        pytest.param(bearer("x" * (17 << 10)), 401, id="oversized-unreviewed"),
    ],
)
async def test_what_is_refused_without_a_review(header: str | None, status: int) -> None:
    api = FakeApi()
    auth = DelegatedAuth(api, clock=Clock())
    assert (await auth.check(header, "/metrics")).status == status
    assert api.tokenreviews == 0


async def test_throttled_answers_are_429_with_retry_after() -> None:
    auth = DelegatedAuth(FakeApi(), clock=Clock(), review_burst=0)
    request = make_mocked_request("GET", "/metrics", headers={"Authorization": bearer("new")})
    response = await refusal(auth, request)
    assert response is not None
    assert response.status == 429
    assert response.headers["Retry-After"] == "1"
