"""Who a peer is: the verdict on a TokenReview (pure), the verifier's cache and rate limit
(against the fake TokenReview endpoint, with an injected clock), the size check before eviction
(pure)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nodeagent.cache.eviction import size_refusal
from nodeagent.cache.identity import (
    NODE_NAME_EXTRA,
    POD_NAME_EXTRA,
    PeerIdentity,
    bearer_token,
    judge_review,
)
from nodeagent.cache.peerauth import NoVerifier, TokenReviewVerifier
from nodeagent.cache.testing import AGENT_USER, FakeTokenReviews

AUD = "tidelease-peer-cache"


def review(
    *,
    authenticated: bool = True,
    user: str = AGENT_USER,
    audiences: list[str] | None = None,
    node: str | None = "gpu-a",
    pod: str | None = "tidelease-agent-x",
) -> dict[str, Any]:
    extra: dict[str, list[str]] = {}
    if node is not None:
        extra[NODE_NAME_EXTRA] = [node]
    if pod is not None:
        extra[POD_NAME_EXTRA] = [pod]
    status: dict[str, Any] = {"authenticated": authenticated}
    if authenticated:
        status["user"] = {"username": user, "extra": extra}
        status["audiences"] = [AUD] if audiences is None else audiences
    return status


@pytest.mark.parametrize(
    ("status", "code", "node"),
    [
        (review(), 200, "gpu-a"),
        (review(authenticated=False), 401, None),
        (review(audiences=[]), 401, None),
        (review(audiences=["https://kubernetes.default.svc"]), 401, None),
        ({"authenticated": True, "user": {"username": AGENT_USER}}, 401, None),
        (review(user="system:serviceaccount:team-a:default"), 403, None),
        (review(user="system:serviceaccount:other-ns:tidelease-agent"), 403, None),
        (review(node=None), 403, None),
        (review(node=None, pod=None), 403, None),
        ({}, 401, None),
    ],
    ids=[
        "agent-on-a-node",
        "not-authenticated",
        "no-audience-answered",
        "api-server-audience",
        "server-ignoring-audiences",
        "workload-account",
        "agent-name-other-namespace",
        "bound-to-no-node",
        "not-bound",
        "empty",
    ],
)
def test_judge_review(status: dict[str, Any], code: int, node: str | None) -> None:
    verdict = judge_review(status, audience=AUD, user=AGENT_USER)
    assert verdict.status == code, verdict.reason
    assert verdict.allowed is (code == 200)
    assert (verdict.identity.node if verdict.identity else None) == node


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer a.b.c", "a.b.c"),
        ("bearer  a.b.c ", "a.b.c"),
        ("Basic a.b.c", None),
        ("a.b.c", None),
        ("Bearer ", None),
        (None, None),
    ],
    ids=["bearer", "case-and-space", "basic", "no-scheme", "empty", "none"],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def verify(v: TokenReviewVerifier | NoVerifier, token: str | None) -> Any:
    return asyncio.run(v.verify(None if token is None else f"Bearer {token}"))


def test_a_peer_is_the_agent_account_on_a_node_for_the_cache_audience() -> None:
    api = FakeTokenReviews()
    v = TokenReviewVerifier(api, audience=AUD, user=AGENT_USER, clock=Clock())
    ok = verify(v, api.agent("gpu-a"))
    assert ok.allowed
    assert ok.identity == PeerIdentity(
        "gpu-a",
        AGENT_USER,
        "tidelease-agent-gpu-a",  # type: ignore[arg-type]
    )
    refused = {
        "none": verify(v, None),
        "garbage": verify(v, "not-a-jwt"),
        "unknown": verify(v, "a.b.c"),
        "api-audience": verify(v, api.agent("gpu-a", audience=api.API_AUDIENCE)),
        "other-audience": verify(v, api.agent("gpu-a", audience="vault")),
        "workload": verify(v, api.workload("gpu-a")),
        "unbound-agent": verify(v, api.unbound_agent()),
    }
    assert {k: r.status for k, r in refused.items()} == {
        "none": 401,
        "garbage": 401,
        "unknown": 401,
        "api-audience": 401,
        "other-audience": 401,
        "workload": 403,
        "unbound-agent": 403,
    }
    assert all(r.identity is None for r in refused.values())
    assert api.reviews == 6  # no review for a missing or malformed token


def test_verdicts_are_cached_briefly_by_token() -> None:
    api, clock = FakeTokenReviews(), Clock()
    v = TokenReviewVerifier(api, audience=AUD, user=AGENT_USER, clock=clock)
    token, stranger = api.agent("gpu-a"), api.workload("gpu-b")
    for _ in range(5):
        assert verify(v, token).allowed
        assert verify(v, stranger).status == 403
    assert api.reviews == 2
    api.revoke(token)  # its pod is gone
    clock.now += 29
    assert verify(v, token).allowed  # within the allowed TTL
    clock.now += 2
    assert verify(v, token).status == 401
    assert verify(v, stranger).status == 403
    assert api.reviews == 4  # both asked again once their TTLs passed


def test_the_cache_is_bounded_and_an_unreachable_api_server_is_asked_again() -> None:
    api, clock = FakeTokenReviews(), Clock()
    v = TokenReviewVerifier(api, audience=AUD, user=AGENT_USER, clock=clock, cache_size=3)
    tokens = [api.agent(f"gpu-{i}") for i in range(5)]
    for t in tokens:
        assert verify(v, t).allowed
    assert len(v._cache) == 3
    api.down = True
    fresh = api.agent("gpu-z")
    assert verify(v, fresh).status == 503
    assert verify(v, tokens[-1]).allowed  # still cached
    api.down = False
    assert verify(v, fresh).allowed


def test_reviews_of_unknown_tokens_are_rate_limited() -> None:
    api, clock = FakeTokenReviews(), Clock()
    v = TokenReviewVerifier(
        api, audience=AUD, user=AGENT_USER, clock=clock, reviews_per_s=2, review_burst=4
    )
    known = api.agent("gpu-a")
    assert verify(v, known).allowed
    statuses = [verify(v, f"x.{i}.y").status for i in range(10)]
    assert statuses == [401] * 3 + [429] * 7
    assert api.reviews == 4
    assert verify(v, known).allowed  # cached: no review needed
    clock.now += 1.0
    assert [verify(v, f"z.{i}.y").status for i in range(3)] == [401, 401, 429]


def test_without_an_api_server_nobody_is_served() -> None:
    assert verify(NoVerifier(), "a.b.c").status == 503


GIB = 1 << 30


@pytest.mark.parametrize(
    ("size", "refused"),
    [
        (1 * GIB, None),
        (8 * GIB, None),
        (1 << 50, "largest entry"),
        (9 * GIB, "whole cache"),
    ],
    ids=["fits", "exactly-the-bound", "absurd", "over-the-bound"],
)
def test_size_refusal(size: int, refused: str | None) -> None:
    reason = size_refusal(size=size, max_bytes=8 * GIB, max_entry_bytes=(1 << 50) - 1)
    assert (reason is None) is (refused is None)
    if refused is not None:
        assert reason is not None
        assert refused in reason
