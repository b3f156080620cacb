"""Run one policy over a scenario: the event loop.

Per step (``trace.step`` simulated minutes), in this order: repairs, failures (a borrower whose
device fails is evicted and queues again), borrower completions, borrowers that give up; the
standby pool is topped up (right of return, every ``topup_every`` minutes); arrivals join the
queue and pending borrowers are placed (kube-scheduler places a pending pod within seconds of
devices freeing, so the online jobs do not find them idle); the online jobs scale (every
release of the step before any scale-up); the standby pool is topped up and pending borrowers
placed again, on what the online jobs released; the step is sampled.

Work per step is proportional to what happens in it, not to the cluster's size: events come
from a heap, placement asks the filter only about nodes with enough free devices, and the
``ClusterState`` answers each distinct node state once per request shape.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from common.model import Device, GpuUuid, Holder, Tier
from extender.leasingsim.borrowers import Borrowers
from extender.leasingsim.clock import EventQueue, Kind, SimClock
from extender.leasingsim.controlling import (
    OnlineJobs,
    Policy,
    ReclaimRecord,
    standby_targets,
)
from extender.leasingsim.metrics import Series, Summary, summarize
from extender.leasingsim.scenario import Scenario
from extender.leasingsim.scheduling import Scheduler, SchedulerSettings
from extender.leasingsim.world import SimCluster


@dataclass(frozen=True, slots=True)
class SimSettings:
    policy: Policy
    seed: int = 1
    standby_gpus: int = 0  # right of return: the standby pool's size
    topup_every: int = 1  # minutes between standby top-ups (the controller: every minute)
    grace_s: int = 45  # the leases' notice to borrowers before eviction
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    online_pod_priority: int = 100000  # tidelease-online
    borrower_pod_priority: int = 1000  # tidelease-borrower


@dataclass(slots=True)
class RunResult:
    settings: SimSettings
    summary: Summary
    series: Series
    reclaims: list[ReclaimRecord]
    holdings: dict[str, tuple[Device, ...]]  # each online job's devices at the end
    standby_targets: dict[tuple[str, Tier], int]
    stats: dict[str, int]


def simulate(
    scenario: Scenario,
    settings: SimSettings,
    *,
    timer: Callable[[], float] = time.perf_counter,
) -> RunResult:
    started = timer()
    cpu_started = time.process_time()
    trace = scenario.trace
    world = SimCluster(scenario.nodes)
    scheduler = Scheduler(
        world,
        settings.scheduler,
        random.Random(f"scheduler/{settings.seed}"),
        settings.policy.profile,
    )
    events = EventQueue()
    clock = SimClock(trace.start, trace.step)
    borrowers = Borrowers(trace.borrowers, world, scheduler, events, settings.borrower_pod_priority)

    def evict(holder: Holder) -> bool:
        if not borrowers.owns(holder.pod_uid):
            return False  # gone already
        borrowers.evict(holder, clock.minute)
        return True

    online = OnlineJobs(
        trace.online,
        scenario.nodes,
        world,
        scheduler,
        policy=settings.policy,
        pod_priority=settings.online_pod_priority,
        evict=evict,
        grace_s=settings.grace_s,
    )
    online.start()
    ha_start = online.held_tiers[Tier.HA] / online.held if online.held else 0.0
    right_of_return = settings.policy is Policy.RIGHT_OF_RETURN
    if right_of_return:
        node_gpus = max((n.gpus for n in scenario.nodes), default=1)
        online.standby_targets = standby_targets(
            settings.standby_gpus, online.held_by_type_tier(), node_gpus
        )
        online.topup()
    topup_every = max(settings.topup_every, trace.step)

    failures = scenario.failures
    failed_uuid: list[GpuUuid] = []
    for i, f in enumerate(failures):
        failed_uuid.append(world.by_node[f.node][f.index].uuid)
        events.push(f.at, Kind.FAILURE, i)

    series = Series()
    for minute in clock.ticks(trace.steps):
        for kind, subject, token in events.due(minute):
            if kind is Kind.COMPLETION:
                borrowers.complete(subject, token)
            elif kind is Kind.ABANDON:
                borrowers.give_up(subject, token)
            elif kind is Kind.FAILURE:
                uuid = failed_uuid[subject]
                dev = world.devices[uuid]
                if not dev.cls.healthy:
                    continue  # already down: this failure overlaps the last one
                world.set_classes({uuid: dev.cls._replace(healthy=False)})
                events.push(minute + failures[subject].repair, Kind.REPAIR, subject)
                holder = world.holder_of.get(uuid)
                if holder is not None and borrowers.owns(holder.pod_uid):
                    borrowers.evict(holder, minute, failed=True)
            elif kind is Kind.REPAIR:
                uuid = failed_uuid[subject]
                dev = world.devices[uuid]
                world.set_classes({uuid: dev.cls._replace(healthy=True)})
        topup = right_of_return and minute % topup_every < trace.step
        if topup:
            online.topup()
        borrowers.arrive_until(minute)
        borrowers.schedule(minute)
        online.step(minute, clock.now, 60.0 * trace.step, partial(borrowers.schedule, minute))
        if topup:
            online.topup()
        borrowers.schedule(minute)
        own = online.own_tiers()
        series.minute.append(minute)
        series.online_demand.append(online.demand)
        series.online_wanted.append(online.wanted_gpus)
        series.online_held.append(online.held)
        series.online_own.append(sum(own.values()))
        series.online_ha.append(own[Tier.HA])
        series.requested.append(borrowers.requested)
        series.running.append(borrowers.running)
        series.on_lent.append(borrowers.on_lent)
        series.lent.append(online.lent_devices)
        series.standby.append(sum(world.standby_pool().values()) if right_of_return else 0)
        series.unhealthy.append(world.unhealthy)

    all_devices = list(world.devices.values())
    cluster_ha = sum(1 for d in all_devices if d.tier is Tier.HA) / max(1, len(all_devices))
    elapsed = timer() - started
    cpu = time.process_time() - cpu_started
    summary = summarize(
        policy=settings.policy.value,
        standby_gpus=settings.standby_gpus if right_of_return else 0,
        series=series,
        ha_start=ha_start,
        cluster_ha=cluster_ha,
        reclaims=online.reclaims,
        peak_gpus=online.peak_gpus,
        total_gpus=world.total,
        step=trace.step,
        evictions=borrowers.stats.evicted,
        finished=borrowers.stats.finished,
        gave_up=borrowers.stats.gave_up,
        elapsed_s=elapsed,
        cpu_s=cpu,
    )
    stats = {
        "placed": scheduler.stats.placed,
        "unschedulable": scheduler.stats.unschedulable,
        "preemptions": scheduler.stats.preemptions,
        "filter_calls": scheduler.stats.filter_calls,
        "choose_victims_calls": scheduler.stats.choose_victims_calls,
        "borrowers_arrived": borrowers.stats.arrived,
        "borrowers_started": borrowers.stats.started,
        "borrowers_failed": borrowers.stats.failed,
        "borrower_gpus_evicted": borrowers.stats.evicted_gpus,
        "device_failures": len(failures),
        "reclaim_notices": online.notices,
    }
    return RunResult(
        settings=settings,
        summary=summary,
        series=series,
        reclaims=online.reclaims,
        holdings=online.holdings(),
        standby_targets=online.standby_targets,
        stats=stats,
    )
