"""Leader election on a coordination.k8s.io/v1 Lease, as Kubernetes' own controllers do.

A candidate takes the Lease when it is free or expired (``renewTime + leaseDurationSeconds``
in the past), renews it every ``renew_s``, and runs its work only while it holds it. Every
write is a compare-and-swap on the Lease's resourceVersion, so two candidates never both lead;
a leader that cannot renew in time stops its work before its lease could expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from common.errors import Conflict, NotFound, TideleaseError
from common.kubeclient import KubeClient
from common.timefmt import epoch, microtime

log = logging.getLogger(__name__)


class LeaderElector:
    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_s: int = 15,
        renew_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._namespace, self._name, self.identity = namespace, name, identity
        self._lease_s, self._renew_s, self._clock = lease_s, renew_s, clock
        self.other_holder = ""  # who held the lease when this last found it held

    def _spec(self, now: float, acquired: float) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._lease_s,
            "acquireTime": microtime(acquired),
            "renewTime": microtime(now),
        }

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; whether we hold the lease afterwards."""
        now = self._clock()
        try:
            current = await self._kube.json("GET", f"{self._path}/{self._name}")
        except NotFound:
            body = {
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": self._spec(now, now),
            }
            try:
                await self._kube.json("POST", self._path, body=body)
                return True
            except Conflict:
                return False
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity")
        expires = (epoch(spec.get("renewTime")) or 0.0) + float(
            spec.get("leaseDurationSeconds") or 0
        )
        if holder not in (None, "", self.identity) and expires > now:
            self.other_holder = str(holder)
            return False
        acquired = (epoch(spec.get("acquireTime")) or now) if holder == self.identity else now
        current["spec"] = self._spec(now, acquired)
        try:
            await self._kube.json("PUT", f"{self._path}/{self._name}", body=current)
        except Conflict:
            return False
        return True

    async def run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``work`` while leading, until cancelled; stop it when leadership is lost. While
        another holds the lease, says so once per holder."""
        waiting_for = ""
        while True:
            try:
                leading = await self.try_acquire_or_renew()
            except TideleaseError as e:
                log.warning("leader election %s: %s", self._name, e)
                leading = False
            if not leading:
                if self.other_holder and self.other_holder != waiting_for:
                    waiting_for = self.other_holder
                    log.info("%s waits for %s, held by %s", self.identity, self._name, waiting_for)
                await asyncio.sleep(self._renew_s)
                continue
            waiting_for = ""
            log.info("%s now leads %s", self.identity, self._name)
            task = asyncio.create_task(work())
            try:
                deadline = self._clock() + self._lease_s
                while not task.done():
                    await asyncio.wait({task}, timeout=self._renew_s)
                    try:
                        renewed = await self.try_acquire_or_renew()
                    except TideleaseError:
                        renewed = False
                    if renewed:
                        deadline = self._clock() + self._lease_s
                    elif self._clock() > deadline - self._renew_s:
                        log.warning("%s lost %s; stopping its work", self.identity, self._name)
                        break
                if task.done():
                    task.result()  # work ended on its own: an error worth surfacing
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
