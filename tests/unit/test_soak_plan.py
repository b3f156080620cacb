"""The soak run's plan (tests/soak/workload.py): a seed names one schedule, with every fault."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tests.soak.mutations import MUTATIONS
from tests.soak.workload import FAULT_KINDS, REAL_NODE_FAULT_KINDS, Borrower, plan


@pytest.mark.parametrize(("seed", "minutes"), [(1, 4), (2, 4), (7, 60), (42, 15)])
def test_a_seed_draws_one_plan_with_every_fault_kind_in_time(seed: int, minutes: float) -> None:
    p = plan(seed, minutes)
    assert plan(seed, minutes) == p
    assert {f.kind for f in p.faults} == set(FAULT_KINDS)
    times = [f.t for f in p.faults]
    assert times == sorted(times)
    assert all(20 <= t <= p.duration_s - 30 for t in times), times
    assert all(b - a >= 14.9 for a, b in itertools.pairwise(times)), times
    if minutes >= 60:  # what issue 33's hour asks: at least 50 faults (and 100 reclaims)
        assert len(p.faults) >= 50
        assert (
            sum(
                1
                for t in p.tides
                if t.desired_gpus == next(j.full for j in p.jobs if j.name == t.job)
            )
            >= 100
        )
    for job in p.jobs:
        tides = [t.desired_gpus for t in p.tides if t.job == job.name]
        assert tides, job  # every job lends at least once
        assert tides[0] < job.full
        assert tides[1::2] == [job.full] * len(tides[1::2])  # lend, take back, lend...
    assert p.borrowers
    assert len({b.namespace for b in p.borrowers}) >= 2


def test_other_seeds_draw_other_plans() -> None:
    assert plan(1, 4).faults != plan(2, 4).faults


@pytest.mark.parametrize(("seed", "minutes"), [(1, 6), (7, 60)])
def test_a_real_node_adds_its_share_and_leaves_the_rest_of_the_seeds_history(
    seed: int, minutes: float
) -> None:
    """With a real node the seed still names the same kwok history (drawn first, from the
    same generator): the real node's job, borrowers and agent kills come on top."""
    base, real = plan(seed, minutes), plan(seed, minutes, real_node_gpus=8)
    assert plan(seed, minutes, real_node_gpus=8) == real
    assert [j for j in real.jobs if not j.real] == list(base.jobs)
    assert [b for b in real.borrowers if not b.real] == list(base.borrowers)
    assert [f for f in real.faults if f.kind not in REAL_NODE_FAULT_KINDS] == list(base.faults)
    kwok_jobs = {j.name for j in base.jobs}
    assert [t for t in real.tides if t.job in kwok_jobs] == list(base.tides)

    (job,) = [j for j in real.jobs if j.real]
    assert (job.kind, job.replicas, job.gpus_per_replica) == ("StatefulSet", 2, 2)
    assert [t.desired_gpus for t in real.tides if t.job == job.name][:2] == [2, 4]
    ours = [b for b in real.borrowers if b.real]
    assert ours
    assert {b.gpus for b in ours} == {1}
    assert {b.namespace for b in ours} <= set(base.borrower_namespaces)
    kills = [f for f in real.faults if f.kind == "agent-kill"]
    assert len(kills) == max(1, round(minutes / 10))
    # Its tides on whole minutes (its lease's daily schedule), and the full cache disk from a
    # few seconds before a scale-down (a new checkpoint to prewarm for the scale-up that
    # follows), one every ten minutes.
    mine = [t for t in real.tides if t.job == job.name]
    assert all(t.t % 60 == 0 for t in mine)
    fulls = [f for f in real.faults if f.kind == "disk-full"]
    assert len(fulls) == max(1, round(minutes / 10))
    for f in fulls:
        down, up = [t for t in mine if t.t > f.t][:2]
        assert down.desired_gpus < job.full
        assert up.desired_gpus == job.full
        assert 1.0 <= down.t - f.t <= 5.0 + 0.1
        assert 30.0 <= f.duration_s <= 60.0
    for field in (real.tides, real.borrowers, real.faults):
        assert [x.t for x in field] == sorted(x.t for x in field)


@pytest.mark.parametrize(("seed", "minutes"), [(1, 4), (7, 60)])
def test_queued_borrowers_come_on_top_of_the_seeds_history(seed: int, minutes: float) -> None:
    """The shared queues' borrowers, interactive and batch, in their gated namespace, drawn from
    a generator of their own: the other borrowers are the seed's own draw, whatever their
    number."""
    p = plan(seed, minutes)
    queued = [b for b in p.borrowers if b.job_class]
    assert {b.job_class for b in queued} == {"interactive", "batch"}
    assert {b.namespace for b in queued} == {p.queued_namespace}
    assert p.queued_namespace not in p.borrower_namespaces
    assert all(b.namespace != p.queued_namespace for b in p.borrowers if not b.job_class)
    assert {b.gpus for b in queued} <= {1, 2}
    assert len({b.name for b in p.borrowers}) == len(p.borrowers)
    assert len(queued) >= minutes * 60 / 15 / 3  # one every 15 s on average, give or take
    # The rest of the history is the seed's without them.
    plain = plan(seed, minutes, queues=False)
    assert [b for b in p.borrowers if not b.job_class] == list(plain.borrowers)
    assert (p.jobs, p.tides, p.faults) == (plain.jobs, plain.tides, plain.faults)


@pytest.mark.parametrize(("seed", "minutes"), [(1, 4), (7, 60)])
def test_borrower_gangs_come_whole_on_top_of_the_seeds_history(seed: int, minutes: float) -> None:
    """Borrower gangs: two or three pods each, made together, of one size and lifetime, in
    one borrower namespace; drawn from a generator of their own."""
    p = plan(seed, minutes)
    gangs: dict[str, list[Borrower]] = {}
    for b in p.borrowers:
        if b.gang:
            gangs.setdefault(b.gang, []).append(b)
    assert len(gangs) >= minutes * 60 / 30 / 3  # one every 30 s on average, give or take
    for gang, members in gangs.items():
        assert len(members) == members[0].gang_size in (2, 3), gang
        assert len({(b.t, b.namespace, b.gpus, b.lifetime_s) for b in members}) == 1, gang
        assert members[0].namespace in p.borrower_namespaces
        assert [b.name for b in members] == [f"{gang}-{i}" for i in range(len(members))]
    plain = plan(seed, minutes, gangs=False)
    assert [b for b in p.borrowers if not b.gang] == list(plain.borrowers)
    assert (p.jobs, p.tides, p.faults) == (plain.jobs, plain.tides, plain.faults)


def test_the_mutations_of_the_agent_are_the_ones_its_hook_patches_into_the_agent() -> None:
    """tests/hooks/sitecustomize.py patches AGENT_MUTATIONS into ``tidelease agent`` and the
    others into the extenders and controllers; hack/soak.py asks --real-node for the former."""
    source = Path(__file__).resolve().parents[1] / "hooks" / "sitecustomize.py"
    tree = ast.parse(source.read_text())
    (value,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "AGENT_MUTATIONS" for t in node.targets)
    ]
    assert isinstance(value, ast.Call)
    agent = ast.literal_eval(value.args[0])
    assert agent == {name for name, m in MUTATIONS.items() if m.real_node}
    assert agent  # sticky-full
