"""The soak's observer on a real API server: the pods' watch shows what a list a second misses
(kube-scheduler's preemption condition on a victim deleted at once, a pod made and deleted
between two lists), and a deletion counts as noticed when any state of it carried the notice."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from common import builders, contract
from tests.apiserver.conftest import ApiServer
from tests.e2e.kube import Kube, path_of
from tests.soak.invariants import Deletion
from tests.soak.observing import Observer

pytestmark = pytest.mark.apiserver

PREEMPTED = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "PreemptionByScheduler",
    "message": "preempted by a pod of higher priority",
}


@pytest.fixture
def kube(apiserver: ApiServer) -> Kube:
    return Kube(apiserver.server, apiserver.token, str(apiserver.ca))


@pytest.fixture
def namespace(kube: Kube) -> str:
    ns = f"soak-obs-{uuid.uuid4().hex[:6]}"
    kube.create(builders.namespace(ns))
    return ns


@pytest.fixture
def node(kube: Kube) -> Iterator[str]:
    name = f"soak-node-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    yield name
    kube.delete("Node", name)


def bound_pod(kube: Kube, ns: str, name: str, node: str) -> dict[str, Any]:
    return kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "local/app:v1"}]},
        }
    )


def delete_now(kube: Kube, ns: str, name: str) -> None:
    """Deleted with no grace: gone from the API server at once, as a kwok pod is."""
    kube.request(
        "DELETE", path_of("Pod", name, ns), {"kind": "DeleteOptions", "gracePeriodSeconds": 0}
    )


def observe_until(observer: Observer, want: str, timeout_s: float = 20) -> list[Deletion]:
    """Observations until one reports the deletion of pod ``want`` (a name)."""
    deadline = time.monotonic() + timeout_s
    seen: list[Deletion] = []
    while time.monotonic() < deadline:
        obs = observer.observe(time.monotonic(), {})
        if obs is not None:
            seen += obs.deletions
            if any(d.pod["metadata"]["name"] == want for d in seen):
                return seen
        time.sleep(0.2)
    raise AssertionError(f"no deletion of {want} observed in {timeout_s} s (saw {seen})")


def first(observer: Observer, timeout_s: float = 30) -> None:
    """A first observation (the CRDs' storage may still be starting: 429 until it is)."""
    deadline = time.monotonic() + timeout_s
    while observer.observe(0.0, {}) is None:
        assert time.monotonic() < deadline, observer.last_error
        time.sleep(0.5)


def settle(observer: Observer, events: int) -> None:
    """Until the watch has seen more than ``events`` events (it runs behind the requests)."""
    assert observer.watch is not None
    deadline = time.monotonic() + 10
    while observer.watch.events <= events and time.monotonic() < deadline:
        time.sleep(0.05)


def preempt(kube: Kube, ns: str, name: str) -> None:
    """What kube-scheduler does to a victim: its DisruptionTarget condition, then a deletion."""
    kube.patch("Pod", name, {"status": {"conditions": [PREEMPTED]}}, ns, "status")
    delete_now(kube, ns, name)


@pytest.mark.parametrize("watch", [True, False], ids=["watched", "listed-only"])
def test_a_preempted_victim_deleted_between_lists_keeps_its_condition(
    kube: Kube, namespace: str, node: str, watch: bool
) -> None:
    observer = Observer(kube, watch=watch)
    observer.start()
    try:
        bound_pod(kube, namespace, "victim", node)
        first(observer)
        events = observer.watch.events if observer.watch else 0
        preempt(kube, namespace, "victim")
        if observer.watch is not None:
            settle(observer, events + 1)
        gone = [
            d for d in observe_until(observer, "victim") if d.pod["metadata"]["name"] == "victim"
        ]
    finally:
        observer.stop()
    assert len(gone) == 1
    conditions = gone[0].pod.get("status", {}).get("conditions") or []
    # With the watch, the last state is the one kube-scheduler left (the checker exempts a
    # preemption by it); a list a second saw only the state before.
    assert (PREEMPTED["reason"] in [c.get("reason") for c in conditions]) is watch
    assert not gone[0].node_gone


def test_a_pod_made_and_deleted_between_two_lists_is_seen(
    kube: Kube, namespace: str, node: str
) -> None:
    observer = Observer(kube)
    observer.start()
    try:
        first(observer)
        assert observer.watch is not None
        events = observer.watch.events
        made = bound_pod(kube, namespace, "brief", node)
        kube.patch(
            "Pod",
            "brief",
            {"metadata": {"annotations": {contract.ANN_RECLAIM_NOTICE: "2026-11-29T00:00:00Z"}}},
            namespace,
        )
        delete_now(kube, namespace, "brief")
        settle(observer, events + 2)
        gone = [d for d in observe_until(observer, "brief") if d.pod["metadata"]["name"] == "brief"]
    finally:
        observer.stop()
    assert [d.pod["metadata"]["uid"] for d in gone] == [made["metadata"]["uid"]]
    assert gone[0].noticed  # the notice was on a state no list saw


def test_the_runners_own_deletions_are_left_out(kube: Kube, namespace: str, node: str) -> None:
    observer = Observer(kube)
    observer.start()
    try:
        made = bound_pod(kube, namespace, "finished", node)
        bound_pod(kube, namespace, "marker", node)
        first(observer)
        observer.ours.add(made["metadata"]["uid"])
        delete_now(kube, namespace, "finished")
        delete_now(kube, namespace, "marker")
        gone = observe_until(observer, "marker")
    finally:
        observer.stop()
    assert [d.pod["metadata"]["name"] for d in gone] == ["marker"]


def test_a_lease_state_between_two_lists_is_in_the_history(kube: Kube, namespace: str) -> None:
    observer = Observer(kube)
    observer.start()
    try:
        made = kube.create(builders.gpu_lease("brief", namespace, gpus_per_replica=1))
        first(observer)
        status = made.get("status") or {}
        for phase in ("Reclaiming", "Steady"):  # a reclaim begun and ended between two lists
            kube.patch(
                contract.KIND_GPU_LEASE,
                "brief",
                {"status": {**status, "phase": phase}},
                namespace,
                "status",
            )
        assert observer.lease_watch is not None
        deadline = time.monotonic() + 10
        history: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            obs = observer.observe(1.0, {})
            if obs is not None:
                history += [o for o in obs.lease_history if o["metadata"]["name"] == "brief"]
                if any((o.get("status") or {}).get("phase") == "Steady" for o in history):
                    break
            time.sleep(0.2)
    finally:
        observer.stop()
    assert [(o.get("status") or {}).get("phase") for o in history][-2:] == ["Reclaiming", "Steady"]
