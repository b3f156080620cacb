"""The preempt verb evicts no borrower of the preemptor's own lent devices without its reclaim
notice (extender.scheduler.victims.noticed_only). Found by the short soak: the extender's view
sent a returning replica home to a group the leasing controller had judged unable to come back
(its node's agent silent a moment earlier in the controller's view), and kube-scheduler
preempted the group's borrower, which had no notice."""

from __future__ import annotations

from dataclasses import replace

from common import builders
from common.model import Allocation, Holder, Priority
from common.podrequest import parse_pod
from extender.scheduler.victims import choose_victims, noticed_only
from tests.unit.cluster import holder


def node() -> tuple[list, list[Allocation], Holder, Holder]:  # type: ignore[type-arg]
    """Node n: devices 0-3 lent by recsys (held by a borrower), 4-7 plain (another borrower)."""
    lent = builders.devices("n", 4, owner="recsys")
    plain = builders.devices("n", 4, start=4)
    on_lent, on_plain = holder("on-lent"), holder("on-plain")
    allocations = [
        Allocation(on_lent, tuple(d.uuid for d in lent)),
        Allocation(on_plain, tuple(d.uuid for d in plain)),
    ]
    return lent + plain, allocations, on_lent, on_plain


def returning() -> object:
    pod = builders.pod("recsys-1", 4, priority=Priority.HIGH, owner="recsys", pod_priority=1000)
    return replace(parse_pod(pod), reclaim=True, lent_group=None)


def test_a_borrower_of_the_preemptors_lent_devices_goes_only_with_its_notice() -> None:
    devices, allocations, on_lent, _ = node()
    req = returning()
    assert choose_victims(devices, allocations, req) == (on_lent,)  # type: ignore[arg-type]
    unwarned = noticed_only(choose_victims, lambda h: False)
    assert unwarned(devices, allocations, req) is None  # type: ignore[arg-type]
    warned = noticed_only(choose_victims, lambda h: h.name == "on-lent")
    assert warned(devices, allocations, req) == (on_lent,)  # type: ignore[arg-type]


def test_other_victims_need_no_notice() -> None:
    """A pod that is not the owner's (no lent device of its job there) preempts as before."""
    devices, allocations, *_ = node()
    other = parse_pod(builders.pod("x", 4, priority=Priority.HIGH, owner="other", pod_priority=9))
    unwarned = noticed_only(choose_victims, lambda h: False)
    chosen = choose_victims(devices, allocations, other)
    assert chosen
    assert unwarned(devices, allocations, other) == chosen
