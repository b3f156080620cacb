"""The leasing controller's tag check, kept up to date as devices change instead of redone. Pure.

At nearly every step of a lease the controller checks that every lent device carries its owner's
tag and its group's replica (:func:`extender.leasing.decisions.stale_tags`): a look at every lent
device, hundreds per lease. In the simulator the answer changes only where a device changes
class, so :class:`TagChecks` keeps it per owner and per lent group, and looks again only at the
groups with a device that changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.model import JobKey
from extender.leasing.decisions import TagChange, View, stale_tags
from extender.leasingsim.world import SimCluster
from extender.rightofreturn.lease import LentGroup


@dataclass(slots=True)
class _Checked:
    """One owner's last check: the groups, each group's answer, and the whole answer."""

    groups: Sequence[LentGroup]
    per_group: dict[LentGroup, tuple[TagChange, ...]]
    answer: tuple[TagChange, ...]


class TagChecks:
    """:func:`~extender.leasing.decisions.stale_tags` per owner, answered from the last check
    (a ``View.tag_check``).

    The answer is the groups' answers in their order, and a group's answer reads, of each of its
    devices, only whether its owner and replica tags are the owner's and the group's, and its
    node and UUID (which never change). A device whose class changes while tagged with neither
    the owner before nor after needed a tag before and needs the same one after; every other
    change is in ``world.retouched[owner]``, which the check takes. So a group checked last time
    with none of its devices retouched since has the same answer (no device ever leaves the
    simulated cluster), and for the same groups (statuses are replaced, never changed: the same
    tuple) with nothing retouched, so has the whole.
    """

    def __init__(self, world: SimCluster) -> None:
        self.world = world
        self._checked: dict[JobKey, _Checked] = {}

    def __call__(
        self, groups: Sequence[LentGroup], view: View, owner: JobKey
    ) -> tuple[TagChange, ...]:
        touched = self.world.retouched.pop(owner, None)
        last = self._checked.get(owner)
        if last is not None and last.groups is groups and not touched:
            return last.answer
        known = last.per_group if last is not None else {}
        per_group: dict[LentGroup, tuple[TagChange, ...]] = {}
        out: list[TagChange] = []
        for g in groups:
            found = known.get(g)
            if found is None or (touched and not touched.isdisjoint(g.devices)):
                found = stale_tags((g,), view, owner)
            per_group[g] = found
            out.extend(found)
        answer = tuple(out)
        self._checked[owner] = _Checked(groups, per_group, answer)
        return answer
