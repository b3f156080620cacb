"""The list-watches of one controller, run side by side.

Every controller keeps its view of the API server the same way: one task per watched kind, each
event handed to a handler that updates the view, a wake-up for the controller's loop, and
readiness once every kind has been listed. :class:`Watches` is that shape, once::

    async with Watches(kube, "hot-restart-operator", wake=changed) as watches:
        watches.add("pods", "/api/v1/pods", on_pod)
        watches.add("statefulsets", "/apis/apps/v1/statefulsets", on_statefulset)
        await watches.wait_synced()
        while True:
            watches.check()
            ...

A watch does not end on its own (:meth:`common.kubeclient.KubeClient.list_watch` relists after
a broken watch and logs what it could not read); should its task end anyway, :meth:`check`
raises what ended it, so the controller stops loudly instead of deciding on a view that no
longer moves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from common.kubeclient import KubeClient
from common.objects import object_key
from common.waiting import wait_event

# (event type: ADDED, MODIFIED or DELETED; the object)
Handler = Callable[[str, dict[str, Any]], None]


__all__ = ["Handler", "WatchEnded", "Watches", "object_key"]


class WatchEnded(RuntimeError):
    """A watch task returned: it never should."""


class Watches:
    """Named list-watches feeding handlers; ``synced`` once each has listed once.

    ``wake`` is set after every handled event and every completed list, so the controller's
    loop can sleep on it.
    """

    def __init__(self, kube: KubeClient, owner: str, *, wake: asyncio.Event | None = None) -> None:
        self._kube = kube
        self._owner = owner
        self._wake = wake
        self._listed: set[str] = set()
        self._names: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.synced = asyncio.Event()

    def add(
        self,
        name: str,
        path: str,
        handle: Handler,
        query: Mapping[str, str] | None = None,
    ) -> None:
        """Start watching ``path`` (a collection) with ``handle`` for its events."""
        self._names.append(name)
        self.synced.clear()
        self._tasks.append(
            asyncio.create_task(
                self._run(name, path, handle, dict(query or {})), name=f"{self._owner}-{name}"
            )
        )

    async def _run(self, name: str, path: str, handle: Handler, query: dict[str, str]) -> None:
        async for event, obj in self._kube.list_watch(path, query or None):
            if event == "SYNCED":
                self._listed.add(name)
                if self._listed >= set(self._names):
                    self.synced.set()
            else:
                handle(event, obj)
            if self._wake is not None:
                self._wake.set()

    def listed(self, name: str) -> bool:
        """Whether the watch called ``name`` has listed at least once."""
        return name in self._listed

    def check(self) -> None:
        """Raise what ended a watch task, if one has ended."""
        for task in self._tasks:
            if task.done():
                if not task.cancelled():
                    task.result()
                raise WatchEnded(f"{task.get_name()}: the watch ended")

    async def wait_synced(self, poll_s: float = 1.0) -> None:
        """Until every watch has listed once (checking on them every ``poll_s``)."""
        while not await wait_event(self.synced, poll_s):
            self.check()
        self.check()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def __aenter__(self) -> Watches:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
