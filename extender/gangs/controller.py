"""The gang controller: evicts the rest of a borrower gang once one member is disrupted
(:mod:`extender.gangs.policy` decides). Runs in the controllers' process under its own leader
election (``tidelease controllers --gang-controller``; the chart turns it on with
``scheduling.gangScheduling`` or ``extender.controllers.gangs``).

It watches every pod and keeps the members of gangs only. Each gang is a key of a
:class:`~common.reconcile.ReconcileLoop`, added when a member changes while the gang is broken;
reconciling it evicts, through the Eviction API, every member the policy names (a
PodDisruptionBudget that refuses is respected: the loop retries with backoff), and says so in an
Event on each; a member waiting for its reclaim notice's time has the gang reconciled again
then (:class:`~common.reconcile.Requeue`). A member already gone (NotFound) or replaced
(Conflict: another UID) is left to the watch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from common.errors import Conflict, NotFound
from common.events import Involved, post_event
from common.kubeclient import KubeClient
from common.objects import eviction
from common.reconcile import ReconcileLoop, Requeue, Result, run_checked
from common.watches import Watches, object_key
from extender.gangs.policy import Member, breaks, mates_to_evict, member_of, next_notice

log = logging.getLogger(__name__)

LEASE_NAME = "tidelease-gang-controller"
NOTICE_SLACK_S = 0.5  # a noticed member is evicted this long after its notice's time
COMPONENT = "tidelease-gang-controller"


class Evictions(Protocol):
    async def evict(self, member: Member, why: str) -> None:
        """Evict ``member`` (that very pod: its UID) and say ``why`` in an Event."""


class KubeEvictions:
    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def evict(self, member: Member, why: str) -> None:
        path = f"/api/v1/namespaces/{member.namespace}/pods/{member.name}/eviction"
        body = eviction(member.namespace, member.name, member.uid)
        await self._kube.json("POST", path, body=body)
        await post_event(
            self._kube,
            Involved("Pod", member.namespace, member.name, member.uid),
            "GangMemberEvicted",
            why,
            warning=True,
            component=COMPONENT,
        )


@dataclass
class GangMetrics:
    registry: CollectorRegistry
    evicted: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.evicted = Counter(
            "tidelease_gang_members_evicted",
            "Members of borrower gangs evicted because another member was disrupted.",
            registry=self.registry,
        )


class Gangs:
    """The members of every gang and what broke each, from the pod watch; pure bookkeeping."""

    def __init__(self) -> None:
        self.members: dict[str, dict[str, Member]] = {}  # gang -> pod key -> member
        self.broken: dict[str, Member] = {}  # gang -> the member whose disruption broke it
        self.present: dict[str, frozenset[str]] = {}  # gang -> its members' UIDs at the break
        self._gang_of: dict[str, str] = {}  # pod key -> its gang

    def apply(self, event: str, pod: dict[str, Any], now: float) -> str | None:
        """Take a watch event; the pod's gang when it has members to evict, now or at their
        notice's time."""
        key = object_key(pod)
        member = member_of(pod)
        old = self._gang_of.pop(key, None)
        if old is not None:
            group = self.members.get(old, {})
            group.pop(key, None)
            if not group:
                self.members.pop(old, None)
                self.broken.pop(old, None)
                self.present.pop(old, None)
        if member is None:
            return None
        deleted = event == "DELETED"
        if not deleted:
            self._gang_of[key] = member.gang
            self.members.setdefault(member.gang, {})[key] = member
        if breaks(member, deleted) and member.gang in self.members:
            last = self.broken.get(member.gang)
            if last is None or member.disrupted_at >= last.disrupted_at:
                self.broken[member.gang] = member
                # The members the watch knows now existed at the break: a pod made again
                # afterwards comes later in the watch.
                self.present[member.gang] = frozenset(
                    m.uid for m in self.members[member.gang].values()
                )
        pending = self.to_evict(member.gang, now) or self.next_notice(member.gang, now) is not None
        return member.gang if pending else None

    def to_evict(self, gang: str, now: float) -> tuple[Member, ...]:
        cause = self.broken.get(gang)
        if cause is None:
            return ()
        return mates_to_evict(self._members(gang), cause, self._present(gang), now=now)

    def next_notice(self, gang: str, now: float) -> float | None:
        """When a member noticed by a reclaim is due, after ``now``, if any."""
        cause = self.broken.get(gang)
        if cause is None:
            return None
        return next_notice(self._members(gang), cause, self._present(gang), now=now)

    def _members(self, gang: str) -> Iterable[Member]:
        return self.members.get(gang, {}).values()

    def _present(self, gang: str) -> frozenset[str]:
        return self.present.get(gang, frozenset())


async def run_gang_controller(
    *,
    kube: KubeClient,
    evictions: Evictions,
    metrics: GangMetrics,
    registry: CollectorRegistry | None = None,
) -> None:
    """Watch every pod; evict the rest of each broken gang, until cancelled or the watch ends."""
    gangs = Gangs()

    async def reconcile(gang: str) -> Result:
        cause = gangs.broken.get(gang)
        if cause is None:
            return None
        now = time.time()
        for m in gangs.to_evict(gang, now):
            why = (
                f"gang {gang}: member {cause.name} was disrupted ({cause.disrupted}); "
                "a gang runs whole or not at all"
            )
            try:
                await evictions.evict(m, why)
            except (NotFound, Conflict) as e:
                log.debug("gang %s: %s already gone: %s", gang, m.key, e)
                continue
            metrics.evicted.inc()
            log.info(
                "gang %s: evicted %s (%s was disrupted: %s)",
                gang,
                m.key,
                cause.key,
                cause.disrupted,
            )
        due = gangs.next_notice(gang, now)
        return None if due is None else Requeue(due - now + NOTICE_SLACK_S)

    loop = ReconcileLoop("gangs", reconcile, keys=lambda: list(gangs.members), registry=registry)

    def on_pod(event: str, obj: dict[str, Any]) -> None:
        broken = gangs.apply(event, obj, time.time())
        if broken is not None:
            loop.add(broken)

    async with Watches(kube, "gang-controller") as watches:
        watches.add("pods", "/api/v1/pods", on_pod)
        await watches.wait_synced()
        await run_checked(loop, watches.check)
