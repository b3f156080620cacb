"""Watches: events reach their handlers, readiness once every kind listed, and a watch that
ends is raised instead of leaving the controller on a view that no longer moves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from common.kubeclient import KubeClient
from common.objects import object_key
from common.watches import WatchEnded, Watches


class ScriptedKube:
    """list_watch from per-path queues; an Exception in a queue is raised by that watch."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[tuple[str, dict[str, Any]] | Exception | None]] = {}
        self.queries: dict[str, dict[str, Any] | None] = {}

    def queue(self, path: str) -> asyncio.Queue[tuple[str, dict[str, Any]] | Exception | None]:
        return self.queues.setdefault(path, asyncio.Queue())

    async def list_watch(
        self, path: str, query: dict[str, Any] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.queries[path] = query
        q = self.queue(path)
        while True:
            item = await q.get()
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item


def pod(name: str, ns: str = "ml") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name}}


async def test_events_reach_handlers_and_synced_waits_for_every_kind() -> None:
    kube = ScriptedKube()
    seen: list[tuple[str, str, str]] = []
    wake = asyncio.Event()
    async with Watches(cast(KubeClient, kube), "t", wake=wake) as watches:
        watches.add("pods", "/p", lambda e, o: seen.append(("pods", e, object_key(o))))
        watches.add("sets", "/s", lambda e, o: seen.append(("sets", e, object_key(o))), {"x": "1"})
        kube.queue("/p").put_nowait(("ADDED", pod("a")))
        kube.queue("/p").put_nowait(("SYNCED", {}))
        await asyncio.sleep(0.01)
        assert seen == [("pods", "ADDED", "ml/a")]
        assert wake.is_set()
        assert watches.listed("pods")
        assert not watches.listed("sets")
        assert not watches.synced.is_set()  # the other kind has not listed yet
        kube.queue("/s").put_nowait(("SYNCED", {}))
        await asyncio.wait_for(watches.wait_synced(poll_s=0.01), 5)
        kube.queue("/s").put_nowait(("DELETED", pod("b", "")))
        await asyncio.sleep(0.01)
        assert seen[-1] == ("sets", "DELETED", "/b")
        assert kube.queries == {"/p": None, "/s": {"x": "1"}}
        watches.check()  # both alive


async def test_a_watch_that_fails_before_listing_is_raised_not_waited_on() -> None:
    kube = ScriptedKube()
    async with Watches(cast(KubeClient, kube), "t") as watches:
        watches.add("pods", "/p", lambda e, o: None)
        kube.queue("/p").put_nowait(RuntimeError("decoder broke"))
        with pytest.raises(RuntimeError, match="decoder broke"):
            await asyncio.wait_for(watches.wait_synced(poll_s=0.01), 5)


async def test_a_watch_that_returns_is_raised_with_its_name() -> None:
    kube = ScriptedKube()
    async with Watches(cast(KubeClient, kube), "operator") as watches:
        watches.add("pods", "/p", lambda e, o: None)
        kube.queue("/p").put_nowait(("SYNCED", {}))
        await watches.wait_synced(poll_s=0.01)
        kube.queue("/p").put_nowait(None)
        await asyncio.sleep(0.01)
        with pytest.raises(WatchEnded, match="operator-pods"):
            watches.check()


async def test_close_cancels_the_watches() -> None:
    kube = ScriptedKube()
    watches = Watches(cast(KubeClient, kube), "t")
    watches.add("pods", "/p", lambda e, o: None)
    tasks = [t for t in asyncio.all_tasks() if t.get_name() == "t-pods"]
    assert len(tasks) == 1
    await watches.close()
    assert tasks[0].cancelled()


def test_object_key() -> None:
    assert object_key(pod("a")) == "ml/a"
    assert object_key({"metadata": {"name": "node-1"}}) == "/node-1"
    assert object_key({}) == "/"
