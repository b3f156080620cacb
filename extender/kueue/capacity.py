"""Whether the GPUs lent now can hold a Kueue workload: the decision behind tidelease's Kueue
admission check (issue 37). Pure.

Lent capacity is, per node, the free devices that carry a right-of-return tag
(:attr:`~common.model.DeviceClass.owner`: lent by an online job, taken back at its scale-up),
less those already kept for workloads admitted earlier and not yet placed. A workload fits when
every pod of every pod set gets its GPUs on one node, by the extender's own rule for one node
(:func:`extender.scheduler.placement.plan_node`: GPU type, tier, tags), so that what is admitted
is exactly what the filter will later accept. Pods are taken largest first, each onto the node
where it leaves the fewest lent devices (best fit), so that whole nodes stay whole for larger
pods.

The answer is a concrete :class:`Reservation` (per pod: the node and the device classes it
takes), which is subtracted before the next workload is judged: an admission never counts a
lent device twice, so the workloads admitted never hold more borrowed GPUs than are lent. Best
fit is a heuristic: it never admits what cannot be placed, and may, rarely, leave Pending a
workload that a cleverer packing would fit (checked against exhaustive search in
tests/unit/test_kueue_capacity.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.model import Device, DeviceClass, GpuUuid, JobKey, NodeName, PodRequest
from extender.scheduler.placement import plan_node

Capacity = Mapping[NodeName, Mapping[DeviceClass, int]]  # node -> free devices per class


@dataclass(frozen=True, slots=True)
class PodSetNeed:
    """``count`` pods alike, each asking what ``request`` asks (GPUs, type, tier)."""

    name: str
    count: int
    request: PodRequest


@dataclass(frozen=True, slots=True)
class PodPlacement:
    pod_set: str
    node: NodeName
    take: tuple[tuple[DeviceClass, int], ...]

    @property
    def gpus(self) -> int:
        return sum(n for _, n in self.take)


@dataclass(frozen=True, slots=True)
class Reservation:
    """The lent devices kept for one workload, pod by pod."""

    workload: str  # namespace/name of the Kueue Workload
    pods: tuple[PodPlacement, ...]

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pods)

    def by_node(self) -> dict[NodeName, dict[DeviceClass, int]]:
        out: dict[NodeName, dict[DeviceClass, int]] = {}
        for p in self.pods:
            node = out.setdefault(p.node, {})
            for cls, n in p.take:
                node[cls] = node.get(cls, 0) + n
        return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """A reservation, or why there is none."""

    reservation: Reservation | None
    reason: str

    @property
    def fits(self) -> bool:
        return self.reservation is not None


def lent_capacity(
    free: Capacity, reclaiming: Collection[JobKey] = ()
) -> dict[NodeName, dict[DeviceClass, int]]:
    """The lent part of each node's free devices: healthy, tagged by an owner, not standby, and
    not of an owner taking its devices back now (``reclaiming``: no borrower may take those)."""
    out: dict[NodeName, dict[DeviceClass, int]] = {}
    for node, classes in free.items():
        lent = {
            c: n
            for c, n in classes.items()
            if n > 0
            and c.owner is not None
            and c.owner not in reclaiming
            and c.healthy
            and not c.standby
        }
        if lent:
            out[node] = lent
    return out


def less(
    capacity: Capacity, reservations: Iterable[Reservation]
) -> dict[NodeName, dict[DeviceClass, int]]:
    """``capacity`` without what ``reservations`` keep (never below zero)."""
    out = {node: dict(classes) for node, classes in capacity.items()}
    for r in reservations:
        for node, taken in r.by_node().items():
            have = out.get(node)
            if have is None:
                continue
            for cls, n in taken.items():
                if cls in have:
                    have[cls] = max(0, have[cls] - n)
    return out


def fit(workload: str, needs: Sequence[PodSetNeed], capacity: Capacity) -> Verdict:
    """A reservation of ``capacity`` (lent and not kept, :func:`lent_capacity`, :func:`less`)
    for every pod of ``needs``, or why there is none."""
    left = {node: {c: n for c, n in classes.items() if n > 0} for node, classes in capacity.items()}
    pods = [(need.name, need.request) for need in needs for _ in range(max(0, need.count))]
    # Largest first; a pod set's name breaks ties, so that the answer does not depend on order.
    pods.sort(key=lambda p: (-p[1].gpus, p[0]))
    placed: list[PodPlacement] = []
    for i, (name, req) in enumerate(pods):
        if req.gpus <= 0:
            placed.append(PodPlacement(name, NodeName(""), ()))
            continue
        best: tuple[int, NodeName, tuple[tuple[DeviceClass, int], ...]] | None = None
        for node in sorted(left):
            plan = plan_node(left[node], req)
            if not plan.fits:
                continue
            remaining = sum(left[node].values()) - plan.taken
            if best is None or remaining < best[0]:  # the first node by name among equals
                best = (remaining, node, plan.take)
        if best is None:
            need_gpus = sum(r.gpus for _, r in pods[i:])
            lent = sum(sum(c.values()) for c in left.values())
            return Verdict(
                None,
                f"{len(pods) - i} of {len(pods)} pod(s) do not fit the lent GPUs left "
                f"({need_gpus} GPU(s) still needed, {lent} lent and free; a pod's GPUs must "
                f"be on one node, of its type and tier)",
            )
        _, node, take = best
        for cls, n in take:
            left[node][cls] -= n
        placed.append(PodPlacement(name, node, take))
    reservation = Reservation(workload, tuple(placed))
    return Verdict(reservation, f"{reservation.gpus} lent GPU(s) kept for its {len(pods)} pod(s)")


def kept_devices(
    reservations: Iterable[tuple[str, Reservation]],
    free: Mapping[NodeName, Sequence[Device]],
    before: Mapping[NodeName, Mapping[GpuUuid, str]] | None = None,
) -> dict[NodeName, dict[GpuUuid, str]]:
    """The devices to mark kept (common/keptmarks.py) for each ``(owner key, reservation)``:
    per node, as many free devices of each class as the reservation takes there. ``free``: the
    free devices of each node; ``before``: the marks now, so that an owner keeps the devices it
    was given while they stay free (then by UUID). A reservation is of what is free, so each
    class has enough; a device is never given twice."""
    before = before or {}
    out: dict[NodeName, dict[GpuUuid, str]] = {}
    for owner, r in reservations:
        for node, take in r.by_node().items():
            marked = out.setdefault(node, {})
            was = before.get(node, {})
            for cls, n in take.items():
                pool = [d.uuid for d in free.get(node, ()) if d.cls == cls and d.uuid not in marked]
                # its own first, then unmarked ones, another owner's last
                pool.sort(key=lambda u: (0 if was.get(u) == owner else 2 if u in was else 1, u))
                for uuid in pool[:n]:
                    marked[uuid] = owner
    return {node: marks for node, marks in out.items() if marks}
