"""KubeWorld.evict and a 429: a PodDisruptionBudget's refusal (its cause named in the Status)
ends in a deletion; the API server's own rate limit (API Priority and Fairness: Retry-After, no
such cause) is asked again after a wait and never ends in a deletion (issue 31)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common import builders
from common.errors import TooManyRequests
from common.kubeclient import api_error
from common.model import Holder, PodUid, Priority
from extender.leasing.kubeworld import EVICTION_BACKOFF_MAX_S, EVICTION_TRIES, KubeWorld
from extender.rightofreturn.lease import parse_gpu_lease

POD = "/api/v1/namespaces/team/pods/borrower"

# What kube-apiserver answers (staging/src/k8s.io/apiserver and pkg/registry/core/pod/storage/
# eviction.go): the budget's refusal names the cause DisruptionBudget; APF's does not.
BUDGET_REFUSAL = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget b needs 1 healthy pods and has 1 currently",
            }
        ]
    },
    "code": 429,
}
BUDGET_PROCESSING = {  # a budget not yet observed by its controller: refuses too
    **BUDGET_REFUSAL,
    "details": {
        "retryAfterSeconds": 10,
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget borrower is still being processed by the server.",
            }
        ],
    },
}
THROTTLED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Too many requests, please try again later.",
    "reason": "TooManyRequests",
    "details": {"retryAfterSeconds": 3},
    "code": 429,
}
THROTTLED_BARE = {**THROTTLED, "details": {}}


def error(body: dict[str, Any]) -> Exception:
    return api_error(429, f"POST {POD}/eviction", json.dumps(body).encode())


class FakeKube:
    """Answers the eviction from a script (an exception or None: 201), everything else 200."""

    def __init__(self, evictions: list[Exception | None]) -> None:
        self.script = list(evictions)
        self.calls: list[tuple[str, str]] = []

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if path.endswith("/eviction"):
            outcome = self.script.pop(0)
            if outcome is not None:
                raise outcome
        return {}

    def count(self, method: str, suffix: str) -> int:
        return sum(1 for m, p in self.calls if m == method and p.endswith(suffix))

    def events(self) -> int:
        return self.count("POST", "/events")


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def world(kube: FakeKube, sleeps: Sleeps) -> KubeWorld:
    return KubeWorld(kube, sleep=sleeps)  # type: ignore[arg-type]


HOLDER = Holder(PodUid("uid-1"), "team", "borrower", Priority.LOW, 1000)
LEASE = parse_gpu_lease(builders.gpu_lease("recsys", "team", gpus_per_replica=4, desired_gpus=8))


@pytest.mark.parametrize(
    ("body", "budget", "after"),
    [
        pytest.param(BUDGET_REFUSAL, True, None, id="budget"),
        pytest.param(BUDGET_PROCESSING, True, 10.0, id="budget-being-processed"),
        pytest.param(THROTTLED, False, 3.0, id="apf"),
        pytest.param(THROTTLED_BARE, False, None, id="apf-without-retry-after"),
    ],
)
def test_a_429_says_whether_a_budget_refused(
    body: dict[str, Any], budget: bool, after: float | None
) -> None:
    e = error(body)
    assert isinstance(e, TooManyRequests)
    assert e.disruption_budget is budget
    assert e.retry_after_s == after


async def test_a_refusing_budget_ends_in_a_deletion_without_retries() -> None:
    kube, sleeps = FakeKube([error(BUDGET_REFUSAL)]), Sleeps()
    await world(kube, sleeps).evict(HOLDER, LEASE)
    assert kube.count("POST", "/eviction") == 1
    assert kube.count("DELETE", POD) == 1
    assert kube.events() == 1  # EvictedPastDisruptionBudget
    assert sleeps.waits == []


async def test_a_throttled_eviction_is_asked_again_after_retry_after_and_deletes_nothing() -> None:
    kube, sleeps = FakeKube([error(THROTTLED), error(THROTTLED_BARE), None]), Sleeps()
    await world(kube, sleeps).evict(HOLDER, LEASE)
    assert kube.count("POST", "/eviction") == 3
    assert kube.count("DELETE", POD) == 0
    assert kube.events() == 0
    assert sleeps.waits == [3.0, 2.0]  # Retry-After, then the doubling backoff's second step


async def test_throttled_to_the_end_the_step_fails_and_nothing_is_deleted() -> None:
    kube, sleeps = FakeKube([error(THROTTLED_BARE)] * EVICTION_TRIES), Sleeps()
    with pytest.raises(TooManyRequests) as raised:
        await world(kube, sleeps).evict(HOLDER, LEASE)
    assert not raised.value.disruption_budget
    assert kube.count("POST", "/eviction") == EVICTION_TRIES
    assert kube.count("DELETE", POD) == 0
    assert kube.events() == 0
    assert len(sleeps.waits) == EVICTION_TRIES - 1
    assert all(w <= EVICTION_BACKOFF_MAX_S for w in sleeps.waits)


async def test_throttled_then_refused_by_its_budget_is_deleted() -> None:
    kube, sleeps = FakeKube([error(THROTTLED), error(BUDGET_REFUSAL)]), Sleeps()
    await world(kube, sleeps).evict(HOLDER, LEASE)
    assert kube.count("POST", "/eviction") == 2
    assert kube.count("DELETE", POD) == 1
    assert sleeps.waits == [3.0]


async def test_the_eviction_is_the_first_write_and_the_reclaims_reason_follows() -> None:
    """At dawn nothing delays the eviction itself: the reclaim's reason is written over the
    Eviction API's after it; a pod deleted past its budget gets it before its deletion."""
    kube, sleeps = FakeKube([None]), Sleeps()
    await world(kube, sleeps).evict(HOLDER, LEASE)
    assert kube.calls == [("POST", f"{POD}/eviction"), ("PATCH", f"{POD}/status")]
    kube = FakeKube([error(BUDGET_REFUSAL)])
    await world(kube, sleeps).evict(HOLDER, LEASE)
    writes = [(m, p) for m, p in kube.calls if not p.endswith("/events")]
    assert writes == [("POST", f"{POD}/eviction"), ("PATCH", f"{POD}/status"), ("DELETE", POD)]
