"""The operator follows opted-in StatefulSets: a template image change becomes a wish on each of
their pods (then a hot restart), never a re-creation."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from common import contract
from common.hotrestartwire import PodView, Request, pod_view
from common.watches import WatchEnded
from extender.hotrestart.operator import HotRestartOperator, run_hot_restart_operator
from extender.hotrestart.policy import (
    Reject,
    Template,
    owner_key,
    template_wish,
    workload_template,
)
from tests.polling import eventually

V1, V2 = "docker.io/local/app:v1", "docker.io/local/app:v2"


def statefulset(
    *, image: str = V2, strategy: str = "OnDelete", opted_in: bool = True
) -> dict[str, Any]:
    ann = {contract.ANN_HOT_RESTART: "true"} if opted_in else {}
    return {
        "metadata": {"namespace": "ns", "name": "trainer"},
        "spec": {
            "updateStrategy": {"type": strategy},
            "template": {
                "metadata": {"annotations": ann},
                "spec": {
                    "containers": [
                        {"name": "app", "image": image},
                        {"name": "sidecar", "image": "docker.io/local/app:v1"},
                    ]
                },
            },
        },
    }


def member(*, image: str = V1, wish: str | None = None, opted_in: bool = True) -> dict[str, Any]:
    ann = {contract.ANN_HOT_RESTART: "true"} if opted_in else {}
    if wish is not None:
        ann[contract.ANN_HOT_RESTART_IMAGE] = wish
    return {
        "metadata": {
            "namespace": "ns",
            "name": "trainer-0",
            "uid": "uid-1",
            "resourceVersion": "7",
            "annotations": ann,
            "ownerReferences": [
                {"kind": "StatefulSet", "name": "trainer", "controller": True, "uid": "s"}
            ],
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "app", "image": image},
                {"name": "sidecar", "image": "docker.io/local/app:v1"},
            ],
        },
        "status": {"phase": "Running"},
    }


@pytest.mark.parametrize(
    ("sts", "want"),
    [
        pytest.param(statefulset(), {"app": V2, "sidecar": V1}, id="opted-in-ondelete"),
        pytest.param(statefulset(strategy="RollingUpdate"), None, id="rolling-update-recreates"),
        pytest.param(statefulset(opted_in=False), None, id="not-opted-in"),
    ],
)
def test_workload_template(sts: dict[str, Any], want: dict[str, str] | None) -> None:
    template = workload_template(sts)
    assert (template.images if template else None) == want
    if template:
        assert template.key == "ns/trainer"


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        pytest.param(member(), f"app={V2}", id="image-differs"),
        pytest.param(member(image=V2), None, id="already-there"),
        pytest.param(member(image="local/app:v2"), None, id="same-image-other-spelling"),
        pytest.param(member(wish=f"app={V2}"), None, id="wish-written-already"),
        pytest.param(member(wish="app=docker.io/local/app:v3"), f"app={V2}", id="older-wish"),
        pytest.param(member(opted_in=False), None, id="pod-not-opted-in"),
    ],
)
def test_template_wish(pod: dict[str, Any], want: str | None) -> None:
    template = Template("ns/trainer", {"app": V2, "sidecar": V1})
    assert template_wish(template, pod_view(pod)) == want


def test_template_wish_goes_one_container_at_a_time_by_name() -> None:
    template = Template("ns/trainer", {"sidecar": V2, "app": V2})
    assert template_wish(template, pod_view(member())) == f"app={V2}"
    assert template_wish(template, pod_view(member(image=V2))) == f"sidecar={V2}"


def test_owner_key_is_the_controlling_statefulset() -> None:
    assert owner_key(member()) == "ns/trainer"
    lone = member()
    lone["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "x", "controller": True}]
    assert owner_key(lone) is None


class PathWatch:
    """list_watch by path: the given events, then waits forever (until cancelled)."""

    def __init__(self, events: dict[str, list[tuple[str, dict[str, Any]]]]) -> None:
        self.events = events

    async def list_watch(
        self, path: str, query: dict[str, Any] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        for event in self.events.get(path, []):
            yield event
        await asyncio.Event().wait()


@dataclass
class Wishes:
    written: list[tuple[str, str, str]] = field(default_factory=list)

    async def request(self, pod: PodView, request: Request) -> None:
        raise AssertionError(f"no request before the wish: {request}")

    async def wish(self, pod: PodView, wish: str, workload: str) -> None:
        self.written.append((pod.key, wish, workload))

    async def reject(self, pod: PodView, reject: Reject) -> None:
        raise AssertionError(reject)


async def test_operator_turns_a_template_change_into_wishes_on_the_pods() -> None:
    watch = PathWatch(
        {
            "/api/v1/pods": [("ADDED", member()), ("SYNCED", {})],
            "/apis/apps/v1/statefulsets": [
                ("ADDED", statefulset(image=V1)),
                ("SYNCED", {}),
                ("MODIFIED", statefulset(image=V2)),
            ],
        }
    )
    wishes = Wishes()
    ready = asyncio.Event()
    operator = HotRestartOperator(requests=wishes, clock=lambda: 1.0)
    task = asyncio.create_task(
        run_hot_restart_operator(kube=watch, operator=operator, ready=ready)  # type: ignore[arg-type]
    )

    async def written() -> list[tuple[str, str, str]]:
        return wishes.written

    try:
        got = await eventually(written, within_s=5)
        assert ready.is_set()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert got == [("ns/trainer-0", f"app={V2}", "ns/trainer")]


class EndingWatch(PathWatch):
    """:class:`PathWatch` whose StatefulSet watch ends once ``end`` is set (as a watch task
    that returned would)."""

    def __init__(self, events: dict[str, list[tuple[str, dict[str, Any]]]]) -> None:
        super().__init__(events)
        self.end = asyncio.Event()

    async def list_watch(
        self, path: str, query: dict[str, Any] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        for event in self.events.get(path, []):
            yield event
        if path == "/apis/apps/v1/statefulsets":
            await self.end.wait()
            return
        await asyncio.Event().wait()


async def test_operator_stops_loudly_when_a_watch_ends() -> None:
    """Its view would no longer move: the operator raises (its leader election notices)
    rather than go on deciding on stale pods."""
    watch = EndingWatch(
        {
            "/api/v1/pods": [("ADDED", member()), ("SYNCED", {})],
            "/apis/apps/v1/statefulsets": [("SYNCED", {})],
        }
    )
    ready = asyncio.Event()
    operator = HotRestartOperator(requests=Wishes(), clock=lambda: 1.0)
    task = asyncio.create_task(
        run_hot_restart_operator(kube=watch, operator=operator, ready=ready)  # type: ignore[arg-type]
    )
    try:
        await asyncio.wait_for(ready.wait(), 5)
        watch.end.set()
        with pytest.raises(WatchEnded, match="statefulsets"):
            await asyncio.wait_for(task, 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_member_fixture_is_not_shared() -> None:
    a, b = member(), member()
    a["metadata"]["annotations"]["x"] = "y"
    assert "x" not in b["metadata"]["annotations"]
    assert copy.deepcopy(a) == a
