"""The node agent's hot restarts of kubelet-managed pods: watch this node's pods, carry out
:mod:`nodeagent.hotrestart.restartdecision`' decisions.

The agent never removes a container the kubelet manages (the kubelet would recreate it, undoing
or duplicating the restart). It pre-pulls the new image through CRI, so that the restart does not
wait for a pull and a failed pull changes nothing; then it patches the pod's container image,
and the kubelet restarts just that container inside the existing sandbox (same pod UID, IP,
volumes and devices). It watches the pod's status for the new container and reports the outcome
on the pod (``tidelease.io/hot-restart-status``) and as an Event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from common import contract
from common.errors import NotFound, TideleaseError
from common.hotrestartpods import Pods
from common.hotrestartwire import Phase, PodView, Status, pod_view
from common.kubeclient import KubeClient
from common.waiting import wait_event
from common.watches import Watches, object_key
from nodeagent.cri.runtime import Runtime
from nodeagent.hotrestart.insandbox import ensure_image
from nodeagent.hotrestart.planning import RestartSettings
from nodeagent.hotrestart.restartdecision import Begin, Finish, Wait, decide

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodRestartSettings:
    node: str
    restart_timeout_s: float = 120.0  # patch -> new container running
    tick_s: float = 1.0  # re-evaluation of pending restarts (timeouts)
    restart: RestartSettings = field(default_factory=RestartSettings)

    def validate(self) -> list[str]:
        problems = list(self.restart.validate())
        if not self.node:
            problems.append("node is required")
        if self.restart_timeout_s <= 0 or self.tick_s <= 0:
            problems.append("restart_timeout_s and tick_s must be positive")
        return problems


class PodRestarter:
    """Carries out one pod's decision at a time; the watch loop calls :meth:`handle`."""

    def __init__(
        self,
        *,
        runtime: Runtime,
        pods: Pods,
        settings: PodRestartSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.runtime, self.pods, self.settings, self.clock = runtime, pods, settings, clock

    async def handle(self, pod: PodView) -> float | None:
        """One step for ``pod``; when it wants to be looked at again (None: on its next change)."""
        decision = decide(pod, self.clock(), self.settings.restart_timeout_s)
        if isinstance(decision, Begin):
            await self._begin(pod, decision)
            return self.clock() + self.settings.tick_s
        if isinstance(decision, Finish):
            await self._finish(pod, decision)
        elif isinstance(decision, Wait):
            return min(decision.until, self.clock() + self.settings.tick_s)
        return None

    async def _begin(self, pod: PodView, begin: Begin) -> None:
        req = begin.request
        status = Status(
            id=req.id,
            phase=Phase.PULLING,
            container=req.container,
            image=req.image,
            reason="pre-pulling the new image",
            old_image=begin.old_image,
            old_container_id=begin.old_container_id,
            started_at=self.clock(),
        )
        resumed = pod.status is not None and pod.status.id == req.id
        if resumed and pod.status is not None:
            # Our own Pulling status (an agent restart, or a stale event): what it recorded of
            # the old container stands; the pod's view may already show the new one.
            status = replace(pod.status, phase=Phase.PULLING)
        else:
            await self.pods.write(pod, status, None)
            log.info("pod %s: hot restart %s: pulling %s", pod.key, req.id, req.image)
        try:
            pulled = await ensure_image(self.runtime, req.image, self.settings.restart)
        except TideleaseError as e:
            failed = replace(
                status,
                phase=Phase.FAILED,
                reason=f"pre-pulling {req.image} failed: {e}; the pod was left untouched",
                finished_at=self.clock(),
            )
            await self._finish(pod, Finish(failed))
            return
        restarting = replace(
            status,
            phase=Phase.RESTARTING,
            reason=("pulled; " if pulled else "image present; ")
            + "the kubelet restarts the container in its sandbox",
        )
        await self.pods.write(pod, restarting, (req.container, req.image))
        log.info("pod %s: hot restart %s: image of %s set", pod.key, req.id, req.container)

    async def _finish(self, pod: PodView, finish: Finish) -> None:
        status = finish.status
        image = (status.container, finish.rollback_to) if finish.rollback_to else None
        await self.pods.write(pod, status, image)
        ok = status.phase is Phase.SUCCEEDED
        log.log(
            logging.INFO if ok else logging.WARNING,
            "pod %s: hot restart %s %s: %s",
            pod.key,
            status.id,
            status.phase.value,
            status.reason,
        )
        try:
            await self.pods.event(
                pod,
                "HotRestarted" if ok else "HotRestartFailed",
                f"container {status.container}: {status.reason}"
                + (f" ({status.finished_at - status.started_at:.1f} s)" if ok else ""),
                warning=not ok,
            )
        except TideleaseError as e:  # the outcome is in the pod's status either way
            log.warning("pod %s: hot restart %s: no Event: %s", pod.key, status.id, e)


async def run_pod_hot_restarts(
    *,
    kube: KubeClient,
    restarter: PodRestarter,
    ready: asyncio.Event | None = None,
) -> None:
    """Watch the node's pods and step those with hot-restart requests, until cancelled."""
    settings = restarter.settings
    latest: dict[str, dict[str, Any]] = {}
    due: dict[str, float] = {}
    changed = asyncio.Event()

    def on_pod(event: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        if event == "DELETED" or contract.ANN_HOT_RESTART_REQUEST not in ann:
            latest.pop(key, None)
            due.pop(key, None)
            return
        latest[key] = obj
        due[key] = 0.0

    async with Watches(kube, "hot-restart", wake=changed) as watches:
        query = {"fieldSelector": f"spec.nodeName={settings.node}"}
        watches.add("pods", "/api/v1/pods", on_pod, query)
        await watches.wait_synced()
        if ready is not None:
            ready.set()
        while True:
            watches.check()
            now = restarter.clock()
            for key in [k for k, t in due.items() if t <= now]:
                raw = latest.get(key)
                if raw is None:
                    due.pop(key, None)
                    continue
                try:
                    again = await restarter.handle(pod_view(raw))
                except NotFound:
                    again = None  # the pod is gone
                except TideleaseError as e:
                    log.warning("pod %s: hot restart step failed (retrying): %s", key, e)
                    again = restarter.clock() + 2.0
                if key in latest and latest[key] is not raw:
                    due[key] = 0.0  # a newer version came in meanwhile: look at it now
                elif again is None:
                    due.pop(key, None)
                else:
                    due[key] = again
            changed.clear()
            wake = min(due.values(), default=now + settings.tick_s * 10)
            await wait_event(changed, max(0.05, wake - restarter.clock()))
