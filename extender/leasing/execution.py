"""Carrying out the leasing decisions' actions: one dispatch of an
:data:`~extender.leasing.decisions.Action` to whoever carries it out. Pure.

Two carry them out: the leasing controller, against the API server
(:class:`extender.leasing.controller.LeaseController`), and the cluster simulator, on its
simulated world (:mod:`extender.leasingsim.controlling`). Each gives :func:`execute` an
:class:`Executor` with one method per kind of action; what a method returns is the executor's
own (the controller's are coroutines, awaited; the simulator's return nothing).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from extender.leasing.decisions import (
    Action,
    Evict,
    MarkRelease,
    Notify,
    ScaleTo,
    SetTags,
    Wait,
    WriteStatus,
)

R_co = TypeVar("R_co", covariant=True)


class Executor(Protocol[R_co]):
    """What carries out each kind of action (for one lease)."""

    def write_status(self, action: WriteStatus) -> R_co:
        """Store the lease's new status."""
        ...

    def set_tags(self, action: SetTags) -> R_co:
        """Write the devices' owner tags and standby flags."""
        ...

    def mark_release(self, action: MarkRelease) -> R_co:
        """Set the pods' pod-deletion-cost before a scale-down."""
        ...

    def scale(self, action: ScaleTo) -> R_co:
        """Scale the lease's workload."""
        ...

    def notify(self, action: Notify) -> R_co:
        """Give the borrowers notice, then store ``action.then`` (the status recording it)."""
        ...

    def evict(self, action: Evict) -> R_co:
        """Evict the borrowers whose notice is over."""
        ...

    def wait(self, action: Wait) -> R_co:
        """Nothing to do until ``action.until``."""
        ...


def execute(action: Action, executor: Executor[R_co]) -> R_co:
    """Hand ``action`` to the executor's method for its kind."""
    if isinstance(action, WriteStatus):
        return executor.write_status(action)
    if isinstance(action, SetTags):
        return executor.set_tags(action)
    if isinstance(action, MarkRelease):
        return executor.mark_release(action)
    if isinstance(action, ScaleTo):
        return executor.scale(action)
    if isinstance(action, Notify):
        return executor.notify(action)
    if isinstance(action, Evict):
        return executor.evict(action)
    return executor.wait(action)
