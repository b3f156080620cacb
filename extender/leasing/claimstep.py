"""The leasing controller's DRA step (docs/dra.md), taken before its classic decision: write
the ``reclaiming`` marks of the devices a lease's reclaim takes back (so that no borrower's
claim is allocated them again), then pin the claim of an owner's gated pod to its lent group, or
let the pod go. :mod:`extender.leasing.claimpinning` decides each of these; this carries them
out, and remembers the claims it pinned until the view shows them allocated.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from common.errors import InvalidInput
from common.model import GpuUuid
from extender.cluster.watching import ClusterView
from extender.leasing import claimpinning
from extender.leasing.decisions import OwnerPod, View
from extender.leasing.observation import is_replica
from extender.rightofreturn.lease import GpuLease, parse_gpu_lease

log = logging.getLogger(__name__)


class ClaimWrites(Protocol):
    """The writes of the DRA step (a part of :class:`extender.leasing.controller.World`)."""

    async def pin(self, step: claimpinning.Pin, lease: GpuLease) -> None: ...

    async def ungate(self, step: claimpinning.Ungate, lease: GpuLease) -> None: ...

    async def mark_reclaiming(self, step: claimpinning.MarkReclaiming) -> None: ...


class ClaimPinner:
    """The DRA step of every lease, over the controller's view (which must watch its
    ResourceClaims) and its leases as the watch gives them (``leases``: raw, by key)."""

    def __init__(
        self,
        view: ClusterView,
        leases: Mapping[str, Mapping[str, Any]],
        world: ClaimWrites,
    ) -> None:
        self._view, self._leases, self._world = view, leases, world
        # Claims pinned by this process that the view has not shown allocated yet, with their
        # devices: no other pod is pinned to those meanwhile.
        self._pins: dict[tuple[str, str], tuple[GpuUuid, ...]] = {}

    def holdings(self) -> tuple[claimpinning.ClaimHolding, ...]:
        """Who holds which device through the claims the view shows."""
        every = (d for state in self._view.cluster for d in state.devices)
        return claimpinning.claim_holdings(self._view.claims.raw_claims(), every)

    def pinned(self) -> Iterator[GpuUuid]:
        """The devices of the claims pinned a moment ago that the view does not show yet."""
        return (u for devices in self._pins.values() for u in devices)

    def forget(self) -> None:
        """A new leadership term: another replica may have led since, the claims say what
        stands."""
        self._pins.clear()

    async def step(
        self,
        lease: GpuLease,
        owner_pods: Sequence[OwnerPod],
        view: View,
        holdings: Sequence[claimpinning.ClaimHolding],
    ) -> claimpinning.ClaimStep | claimpinning.MarkReclaiming | None:
        """The lease's DRA step, taken and said; None when there is none to take. First, if
        there is one to write, the ``reclaiming`` marks of the devices its reclaim takes back,
        then the next pin or gate lift of its gated pods."""
        marked = {
            (state.node, d.uuid): d.cls.owner
            for state in self._view.cluster
            if state.reclaiming
            for d in state.devices
            if d.uuid in state.reclaiming
        }
        # The other leases matter only to marks that might be cleared: none, none to parse.
        others = self._other_leases(lease) if marked else []
        marks = claimpinning.reclaiming_marks(lease, view.devices, marked, others)
        if marks is not None:
            log.info("lease %s: %s", lease.key, marks.why)
            await self._world.mark_reclaiming(marks)
            return marks
        return await self._pin_or_ungate(lease, owner_pods, view, holdings)

    def _other_leases(self, lease: GpuLease) -> list[GpuLease]:
        """Every GpuLease but ``lease`` that parses (an invalid one is logged at its own step)."""
        out = []
        for key, raw in list(self._leases.items()):
            if key != lease.key:
                with contextlib.suppress(InvalidInput):
                    out.append(parse_gpu_lease(raw))
        return out

    async def _pin_or_ungate(
        self,
        lease: GpuLease,
        owner_pods: Sequence[OwnerPod],
        view: View,
        holdings: Sequence[claimpinning.ClaimHolding],
    ) -> claimpinning.ClaimStep | None:
        """Pin the claim of an owner's gated pod to its lent group, or let the pod go
        (:func:`~extender.leasing.claimpinning.next_claim_step`), and say which; None when no
        gated pod can go yet."""
        claims = self._view.claims
        for key in [k for k in self._pins if _allocated(claims.get(*k))]:
            del self._pins[key]  # the view shows it now
        gated, live = [], set()
        for raw in self._view.pods.raw_pods():
            meta = raw.get("metadata") or {}
            if not meta.get("deletionTimestamp"):
                live.add(str(meta.get("uid", "")))
            if not is_replica(raw, lease):
                continue
            pod = claimpinning.gated_pod(raw)
            if pod is not None:
                gated.append(pod)
        if not gated:
            return None
        pinned = set(self.pinned())
        taken = {u for h in holdings for u in h.devices} | pinned
        owned = {u for p in owner_pods for u in p.devices} | pinned
        by_key = {(c_ns, c_name): c for c_ns, c_name, c in _keyed(claims.raw_claims())}
        step = claimpinning.next_claim_step(
            lease, gated, by_key, view.devices, view.offering, taken, owned, live
        )
        if isinstance(step, claimpinning.Pin):
            meta = step.claim.get("metadata") or {}
            log.info(
                "lease %s: pin claim %s of %s to %s (%s)",
                lease.key,
                meta.get("name"),
                step.pod.key,
                f"standby devices for the group {step.group} lent"
                if step.standby
                else f"the devices {step.group} lent",
                ", ".join(d.uuid for d in step.devices),
            )
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            self._pins[key] = tuple(d.uuid for d in step.devices)
            try:
                await self._world.pin(step, lease)
            except claimpinning.PinRefused as e:
                # Refused (403, 422): retrying cannot help, and the lease must not stop here.
                self._pins.pop(key, None)
                log.error("lease %s: pinning claim %s refused: %s", lease.key, meta.get("name"), e)
                refused = claimpinning.Ungate(
                    step.pod, f"pinning its claim was refused: {e}", warning=True
                )
                await self._world.ungate(refused, lease)
                return refused
            except BaseException:
                self._pins.pop(key, None)  # not written, or not known to be
                raise
        elif isinstance(step, claimpinning.Ungate):
            (log.warning if step.warning else log.info)(
                "lease %s: let %s go: %s", lease.key, step.pod.key, step.why
            )
            await self._world.ungate(step, lease)
        return step


def _allocated(claim: Mapping[str, Any] | None) -> bool:
    """Whether the view shows ``claim`` allocated (or gone: nothing left to wait for)."""
    return claim is None or (claim.get("status") or {}).get("allocation") is not None


def _keyed(claims: Iterable[Mapping[str, Any]]) -> Iterable[tuple[str, str, Mapping[str, Any]]]:
    for c in claims:
        meta = c.get("metadata") or {}
        yield str(meta.get("namespace", "")), str(meta.get("name", "")), c
