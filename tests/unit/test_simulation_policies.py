"""The policies on a tiny cluster, with outcomes worked out by hand.

Four-GPU H20 nodes. The online job ``recsys`` (replicas of 4 GPUs) starts on nodes ``a`` and
``b`` (seed 1 puts replica 0 on ``a``: equal scores, ties at random); at 01:00 its demand halves
and replica 1 goes, releasing ``b``; at 01:05 two borrowers asking 4 GPUs of at least MA
arrive: the first takes untagged ``d`` (all MA; with right of return it also scores higher
there than on the lent ``b``), the second the only other node that fits, ``b``. At 10:00 the
demand is back:

* with right of return (the leasing controller's own decisions,
  :func:`extender.leasing.decisions.decide`) the borrower on ``b`` gets notice, is evicted 45 s
  later, and ``b`` comes back;
* with tidelease's tiers but no tags, the job takes the only free node, ``c`` (all LA);
* without return (the plain kube-scheduler, blind to tiers) the borrowers take any two of the
  three free nodes, and the job the third, whichever the seed draws;
* without elastic scaling, nothing moves.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from common.model import JobKey, NodeName, Tier
from extender.leasing.decisions import RESYNC_S, STEADY, OwnerPod, SetTags, View, Wait
from extender.leasingsim import controlling
from extender.leasingsim.controlling import Policy, standby_targets
from extender.leasingsim.scenario import (
    BorrowerJob,
    DeviceFailure,
    NodeSpec,
    OnlineJob,
    Role,
    Scenario,
    Trace,
    draw_failures,
)
from extender.leasingsim.scheduling import Scheduler, SchedulerSettings
from extender.leasingsim.simulating import RunResult, SimSettings, simulate
from extender.leasingsim.tides import default_cluster, default_trace
from extender.leasingsim.world import SimCluster

HA, MA, LA = Tier.HA, Tier.MA, Tier.LA


def node(name: str, *tiers: Tier, role: Role = Role.SHARED) -> NodeSpec:
    return NodeSpec(NodeName(name), "H20", tiers, role)


def scenario(
    nodes: list[NodeSpec], failures: tuple[DeviceFailure, ...] = (), tier: Tier = LA
) -> Scenario:
    job = OnlineJob(JobKey("recsys"), "H20", 4, tier, ((0, 8), (60, 4), (600, 8)))
    borrowers = tuple(BorrowerJob(f"ft-{i}", 65, 4, 100_000, 100_000, None, MA) for i in range(2))
    return Scenario(tuple(nodes), Trace(2 * 1440, (job,), borrowers, failures), failures)


def drift_cluster() -> list[NodeSpec]:
    return [
        node("a", HA, HA, HA, MA, role=Role.ONLINE),
        node("b", HA, HA, HA, MA, role=Role.ONLINE),
        node("c", LA, LA, LA, LA),
        node("d", MA, MA, MA, MA),
    ]


def run(policy: Policy, nodes: list[NodeSpec], seed: int = 1, **kw: object) -> RunResult:
    return simulate(scenario(nodes, **kw), SimSettings(policy, seed=seed))  # type: ignore[arg-type]


def held_nodes(result: RunResult) -> Counter[str]:
    return Counter(d.node for d in result.holdings["recsys"])


def at(result: RunResult, minute: int) -> int:
    return result.series.minute.index(minute)


def test_right_of_return_keeps_the_ha_share() -> None:
    r = run(Policy.RIGHT_OF_RETURN, drift_cluster())
    assert held_nodes(r) == {"a": 4, "b": 4}
    s = r.summary
    assert (s.ha_start, s.ha_end, s.ha_min) == (0.75, 0.75, 0.75)
    (reclaim,) = r.reclaims
    assert (reclaim.minute, reclaim.due, reclaim.returned, reclaim.matched) == (600, 4, 4, 4)
    assert (reclaim.evicted, reclaim.forfeited, reclaim.duration_s) == (1, 0, 46.0)  # grace 45 s
    assert reclaim.full
    assert s.evictions == 1
    assert r.stats["reclaim_notices"] == 1


def test_tiers_without_tags_take_the_free_node() -> None:
    r = run(Policy.TIERS_NO_TAGS, drift_cluster())
    assert held_nodes(r) == {"a": 4, "c": 4}
    s = r.summary
    assert (s.ha_start, s.ha_end) == (0.75, 0.375)
    assert s.ha_end <= s.cluster_ha < s.ha_start  # cluster: 6 HA of 16
    assert r.reclaims == []
    assert s.evictions == 0  # it took the free node instead


def test_without_right_of_return_the_plain_scheduler_puts_the_job_anywhere() -> None:
    """The borrowers' MA cannot be asked of the plain kube-scheduler: they and the returning
    replica share the three free nodes at random, and over the seeds the replica lands on
    each of them, the LA node too."""
    second: set[str] = set()
    for seed in range(1, 13):
        r = run(Policy.NO_RETURN, drift_cluster(), seed=seed)
        held = held_nodes(r)
        assert sorted(held.values()) == [4, 4], held
        assert held.keys() & {"a", "b"}, held
        assert r.summary.evictions == 0  # a free node was left
        assert r.reclaims == []
        second.update(held.keys() - {"a"} if "a" in held else held.keys() - {"b"})
    assert second >= {"c", "d"}, second


def test_without_elastic_scaling_nothing_moves() -> None:
    r = run(Policy.NO_SCALING, drift_cluster())
    assert held_nodes(r) == {"a": 4, "b": 4}
    assert set(r.series.online_held) == {8}
    assert r.summary.gpu_hours_lent == 0
    # only d fits a borrower: one runs, one waits all along
    assert set(r.series.running[at(r, 65) :]) == {4}


def test_borrowers_use_lent_gpus_in_the_trough() -> None:
    on = run(Policy.RIGHT_OF_RETURN, drift_cluster())
    static = run(Policy.NO_SCALING, drift_cluster())
    trough = at(on, 300)
    assert on.series.lent[trough] == 4  # b's devices, tagged for recsys
    assert on.series.on_lent[trough] == 4  # and a borrower runs on them
    assert on.series.running[trough] == 8
    assert static.series.running[trough] == 4
    assert on.series.fulfilment()[trough] == 1.0
    assert on.series.fulfilment()[at(on, 700)] == 0.5  # after the reclaim
    assert on.series.lent[at(on, 700)] == 0
    assert on.summary.fulfilment_trough > on.summary.fulfilment_peak
    assert on.summary.on_lent_gpu_hours == pytest.approx(4 * (600 - 65) / 60)


def backfill_cluster() -> list[NodeSpec]:
    # b has a fifth GPU: free at the start, the standby top-up takes it (the only free HA one)
    return [
        node("a", HA, HA, HA, HA, role=Role.ONLINE),
        node("b", HA, HA, HA, HA, HA, role=Role.ONLINE),
        node("c", LA, LA, LA, LA),
        node("d", MA, MA, MA, MA),
    ]


def test_a_failed_lent_device_is_backfilled_from_standby_of_its_type_and_tier() -> None:
    # recsys needs HA. b's GPU 1 fails at 02:00, lent and under the second borrower, and stays
    # down. At 10:00 the replica cannot come back to b's three healthy lent GPUs alone, and
    # nothing else passes or could by evictions (c is LA, d's borrower holds MA): the filter
    # lets the reclaim fill its shortfall from b's standby GPU.
    failure = DeviceFailure(120, NodeName("b"), 1, 10_000)
    sc = scenario(backfill_cluster(), failures=(failure,), tier=HA)
    r = simulate(sc, SimSettings(Policy.RIGHT_OF_RETURN, standby_gpus=1))
    assert r.standby_targets == {("H20", HA): 1}
    assert r.series.standby[at(r, 300)] == 1
    (reclaim,) = r.reclaims
    assert (reclaim.due, reclaim.returned, reclaim.lost) == (4, 3, 1)
    assert (reclaim.backfilled, reclaim.foreign, reclaim.matched, reclaim.forfeited) == (1, 0, 4, 0)
    assert reclaim.full
    got = sorted((d.node, d.index) for d in r.holdings["recsys"])
    assert got == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 2), ("b", 3), ("b", 4)]
    backfill = next(d for d in r.holdings["recsys"] if d.index == 4)
    # on loan: still a standby device (the pool counts it), tagged with the job holding it
    assert (backfill.gpu_type, backfill.tier, backfill.cls.standby) == ("H20", HA, True)
    assert backfill.cls.owner == "online/recsys"
    assert r.series.standby[at(r, 605)] == 1
    # the failed device is still recsys's, lent: it comes back once repaired
    assert r.series.lent[at(r, 700)] == 1
    assert r.summary.ha_end == 1.0


def test_without_standby_a_free_device_of_the_tier_returns_the_lost_one_in_kind() -> None:
    # b's fifth GPU stays an ordinary free GPU: the second borrower takes it with three lent
    # ones, and again after b1 failed under it; the reclaim evicts it and the replica takes
    # b's three healthy lent GPUs and that free one: HA too, so the owner has its four HA GPUs
    # back in kind, though not from the pool
    failure = DeviceFailure(120, NodeName("b"), 1, 10_000)
    sc = scenario(backfill_cluster(), failures=(failure,), tier=HA)
    r = simulate(sc, SimSettings(Policy.RIGHT_OF_RETURN, standby_gpus=0))
    (reclaim,) = r.reclaims
    assert (reclaim.due, reclaim.returned, reclaim.lost, reclaim.backfilled) == (4, 3, 1, 0)
    assert (reclaim.foreign, reclaim.shortfall, reclaim.full, reclaim.evicted) == (1, 0, True, 1)
    assert sorted(d.index for d in r.holdings["recsys"] if d.node == "b") == [0, 2, 3, 4]


def test_standby_targets_split_by_holdings() -> None:
    weights = {("H20", HA): 6, ("H20", MA): 2}
    assert standby_targets(4, weights) == {("H20", HA): 3, ("H20", MA): 1}
    assert standby_targets(3, weights) == {("H20", HA): 2, ("H20", MA): 1}
    assert standby_targets(0, weights) == {("H20", HA): 0, ("H20", MA): 0}


def test_standby_targets_give_each_type_whole_nodes() -> None:
    # 32 GPUs over 4:1 H20:A100 holdings would be 25.6 and 6.4: less than a node of A100
    weights = {("H20", HA): 60, ("H20", MA): 20, ("A100", HA): 15, ("A100", LA): 5}
    out = standby_targets(32, weights, node_gpus=8)
    assert out == {("H20", HA): 18, ("H20", MA): 6, ("A100", HA): 6, ("A100", LA): 2}
    more = standby_targets(36, weights, node_gpus=8)  # 4 left over a node: split too
    assert sum(more.values()) == 36
    assert more[("A100", HA)] + more[("A100", LA)] >= 8


def small_generated() -> Scenario:
    spec = default_cluster(0.04)
    nodes = spec.expand(3)
    trace = default_trace(list(nodes), days=1.5, seed=3)
    return Scenario(nodes, trace, draw_failures(nodes, spec.failure_model, trace.minutes, 3))


@pytest.mark.parametrize("policy", list(Policy), ids=[p.value for p in Policy])
def test_same_seed_same_results(policy: Policy) -> None:
    settings = SimSettings(policy, seed=3, standby_gpus=16)
    first = simulate(small_generated(), settings)
    again = simulate(small_generated(), settings)
    assert first.series == again.series
    assert first.reclaims == again.reclaims
    assert first.holdings == again.holdings
    assert first.stats == again.stats
    timeless = {"elapsed_s": 0.0, "cpu_s": 0.0}
    assert replace(first.summary, **timeless) == replace(again.summary, **timeless)


@pytest.fixture(scope="module")
def figures() -> dict[Policy, RunResult]:
    spec = default_cluster(0.05)  # 63 nodes, 504 GPUs
    nodes = spec.expand(3)
    trace = default_trace(list(nodes), days=4, seed=3)
    sc = Scenario(nodes, trace, draw_failures(nodes, spec.failure_model, trace.minutes, 3))
    return {p: simulate(sc, SimSettings(p, seed=3, standby_gpus=16)) for p in Policy}


def test_fig14_right_of_return_holds_the_ha_share_and_no_return_drifts(
    figures: dict[Policy, RunResult],
) -> None:
    ror = figures[Policy.RIGHT_OF_RETURN].summary
    nor = figures[Policy.NO_RETURN].summary
    nos = figures[Policy.NO_SCALING].summary
    assert ror.ha_start == nor.ha_start == nos.ha_start > ror.cluster_ha + 0.03
    # right of return: within half a point of the pre-lease share, at every step
    assert ror.ha_steps_drift <= 0.005
    assert abs(ror.ha_end - ror.ha_start) <= 0.005
    # without return: the daily peaks lose HA devices, down to the cluster's average (ten
    # online nodes: each peak is a draw of a few nodes, the lowest the telling one)
    assert nor.ha_drift >= 4 * max(ror.ha_drift, 0.005)
    assert nor.ha_min <= nor.cluster_ha + 0.005 < nor.ha_start
    assert (nos.ha_drift, nos.ha_steps_drift) == (0.0, 0.0)


def test_fig10_borrowers_get_more_in_the_troughs(figures: dict[Policy, RunResult]) -> None:
    ror = figures[Policy.RIGHT_OF_RETURN].summary
    nos = figures[Policy.NO_SCALING].summary
    assert ror.fulfilment_trough >= ror.fulfilment_peak + 0.15
    assert ror.fulfilment_trough >= nos.fulfilment_trough + 0.15
    assert abs(nos.fulfilment_trough - nos.fulfilment_peak) < 0.05  # nothing is lent


def test_steady_leases_are_not_judged_again_and_nothing_else_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator skips :func:`decide` for a steady lease whose inputs did not change, keeps
    its tag checks (``View.tag_check``) and its pods as seen up to date instead of redoing them;
    the results must be those of judging every lease at every turn, over pods and a view looked
    at afresh."""
    calls = Counter[str]()
    real = controlling.decide

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[mode] += 1
        return real(*args, **kwargs)

    def every_time(self: controlling.OnlineJobs, job: controlling.JobState, now: float) -> Any:
        world = self.world
        pods = []
        for o, uid in sorted(job.pods.items()):
            node = world.pod_node.get(uid)
            alloc = None if node is None else world.ledger[node].get(uid)
            devices = alloc.devices if alloc else ()
            pods.append(OwnerPod(job.name_of(o), uid, node or "", devices))
        view = View(world.devices, world.holder_of, world.offering)  # no tag check
        return counted(job.lease, job.replicas, pods, view, now)

    monkeypatch.setattr(controlling, "decide", counted)
    settings = SimSettings(Policy.RIGHT_OF_RETURN, seed=3, standby_gpus=16)
    mode = "memo"
    memo = simulate(small_generated(), settings)
    monkeypatch.setattr(controlling.OnlineJobs, "_decide", every_time)
    mode = "plain"
    plain = simulate(small_generated(), settings)
    assert memo.series == plain.series
    assert memo.reclaims == plain.reclaims
    assert memo.reclaims
    assert memo.holdings == plain.holdings
    assert memo.stats == plain.stats
    assert calls["memo"] < 0.8 * calls["plain"]


def test_a_steady_lease_is_judged_again_when_its_lent_devices_lose_their_tags() -> None:
    world = SimCluster(tuple(drift_cluster()))
    sc = scenario(drift_cluster())
    online = controlling.OnlineJobs(
        sc.trace.online,
        sc.nodes,
        world,
        Scheduler(world, SchedulerSettings(), random.Random(0)),
        policy=Policy.RIGHT_OF_RETURN,
        pod_priority=1000,
        evict=lambda holder: False,
    )
    online.start()
    for minute in range(0, 80, 5):  # demand halves at 01:00: replica 1 is lent
        online.step(minute, 60.0 * minute, 300.0)
    job = online.jobs[0]
    assert job.lease.status.phase == "Steady"
    assert job.lease.status.lent
    now = 60.0 * 80
    assert online._decide(job, now) == Wait(now + RESYNC_S, STEADY)
    lent = world.devices[job.lease.status.lent[0]]
    world.set_classes({lent.uuid: lent.cls._replace(owner=None, replica=None)})
    action = online._decide(job, now)
    assert isinstance(action, SetTags)
    assert [(c.uuid, c.owner) for c in action.changes] == [(lent.uuid, "online/recsys")]
