"""What a simulation runs on, as typed values: the cluster description and the trace. Pure.

Time in a trace is whole minutes from its start (``start``, UTC epoch seconds, is minute 0).

* A **cluster** is a list of nodes, each with a GPU type and one reliability tier per GPU. Nodes
  are given one by one (:class:`NodeSpec`) or as groups with a tier mix (:class:`NodeGroup`,
  expanded deterministically from a seed). A node's ``role`` says whether it starts out held by
  the online jobs (``online``: the pre-lease placement) or by nobody (``shared``).
* A **trace** holds the online jobs (each with its demand over time, or a daily schedule), the
  borrowers' arrivals (low-priority jobs: GPUs, running time, patience), and device failures
  (node, index, time, repair time). Failures may instead be drawn from the cluster's
  :class:`FailureModel`.

A device's tier is assessed from its availability over a two-week window; a trace is at most a
window long, so a device keeps its tier for the whole run. Failures change its health, not its
tier.

Reference: weflex 3.5 (docs/references.md).
"""

from __future__ import annotations

import bisect
import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from common.model import JobKey, NodeName, Tier
from extender.rightofreturn.rules import ScheduleEntry

MINUTES_PER_DAY = 24 * 60


class Role(enum.Enum):
    SHARED = "shared"  # starts free
    ONLINE = "online"  # starts held by the online jobs at their peak (pre-lease placement)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: NodeName
    gpu_type: str
    tiers: tuple[Tier, ...]  # one per GPU, in index order
    role: Role = Role.SHARED

    @property
    def gpus(self) -> int:
        return len(self.tiers)


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """``count`` nodes named ``<name>-0000``...; their GPUs get tiers in the exact proportions
    of ``tier_mix`` (largest remainder), shuffled over the group from the seed."""

    name: str
    count: int
    gpu_type: str
    gpus_per_node: int = 8
    tier_mix: tuple[tuple[Tier, float], ...] = ((Tier.HA, 1.0),)
    role: Role = Role.SHARED

    def expand(self, seed: int) -> list[NodeSpec]:
        total = self.count * self.gpus_per_node
        tiers = _apportion(total, self.tier_mix)
        random.Random(f"{seed}/{self.name}").shuffle(tiers)
        width = max(4, len(str(self.count - 1)))
        g = self.gpus_per_node
        return [
            NodeSpec(
                NodeName(f"{self.name}-{i:0{width}d}"),
                self.gpu_type,
                tuple(tiers[i * g : (i + 1) * g]),
                self.role,
            )
            for i in range(self.count)
        ]


def _apportion(total: int, mix: Sequence[tuple[Tier, float]]) -> list[Tier]:
    """``total`` tiers in the proportions of ``mix`` (largest remainder, ties by tier)."""
    weight = sum(share for _, share in mix) or 1.0
    exact = [(tier, total * share / weight) for tier, share in mix]
    counts = {tier: int(x) for tier, x in exact}
    left = total - sum(counts.values())
    by_remainder = sorted(exact, key=lambda tx: (-(tx[1] - int(tx[1])), -int(tx[0])))
    for tier, _ in by_remainder[:left]:
        counts[tier] += 1
    return [tier for tier in sorted(counts, reverse=True) for _ in range(counts[tier])]


@dataclass(frozen=True, slots=True)
class FailureModel:
    """Device failures drawn per device: a Poisson process with a rate per tier (failures per
    device-day), each followed by a repair of uniform length in ``repair_hours``.

    The rates hold both of weflex fig. 5's figures with the tiers kept: 70 % of the GPUs fully
    available over two weeks, 58 % over a month. A device that was HA over the last two weeks
    stays so over the next 16 days with 58/70: ln(70/58)/16 = 0.0117 a day; LA 0.08; MA between
    (0.03). The model then has 76 % of the GPUs fully available over two weeks and 59 % over a
    month (docs/simulator.md).
    """

    rates_per_day: tuple[tuple[Tier, float], ...] = (
        (Tier.HA, 0.0117),
        (Tier.MA, 0.03),
        (Tier.LA, 0.08),
    )
    repair_hours: tuple[float, float] = (4.0, 24.0)

    def rate(self, tier: Tier) -> float:
        return dict(self.rates_per_day).get(tier, 0.0)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...] = ()
    groups: tuple[NodeGroup, ...] = ()
    failure_model: FailureModel = field(default_factory=FailureModel)
    seed: int | None = None  # tier shuffling of the groups; None: the run's seed

    def expand(self, seed: int) -> tuple[NodeSpec, ...]:
        """Every node, explicit ones first, then the groups' in order."""
        s = self.seed if self.seed is not None else seed
        return self.nodes + tuple(n for g in self.groups for n in g.expand(s))


@dataclass(frozen=True, slots=True)
class OnlineJob:
    """An online training job: high priority, elastic, ``gpus_per_replica`` GPUs per replica.

    Its demand is either ``demand`` — (minute, GPUs) points of a step function, the value holding
    until the next point — or a daily ``schedule`` (UTC times of day), as the leasing
    controller reads it (:func:`extender.rightofreturn.rules.target_gpus`).
    """

    name: JobKey
    gpu_type: str
    gpus_per_replica: int = 8
    min_tier: Tier = Tier.LA
    demand: tuple[tuple[int, int], ...] = ()
    schedule: tuple[ScheduleEntry, ...] = ()
    source: str = field(default="", compare=False)  # where it was read, for messages

    @property
    def peak(self) -> int:
        values = [g for _, g in self.demand] + [e.gpus for e in self.schedule]
        return max(values, default=0)

    def demand_at(self, minute: int) -> int:
        """The demand series at ``minute`` (0 before its first point)."""
        i = bisect.bisect_right(self.demand, (minute, 1 << 62)) - 1
        return self.demand[i][1] if i >= 0 else 0


@dataclass(frozen=True, slots=True)
class BorrowerJob:
    """A low-priority job: asks ``gpus`` GPUs on one node for ``duration`` minutes of running.

    It waits at most ``patience`` minutes while pending (then it gives up); when evicted it
    queues again with the running time it still needs.
    """

    name: str
    arrival: int
    gpus: int
    duration: int
    patience: int = MINUTES_PER_DAY
    gpu_type: str | None = None
    min_tier: Tier = Tier.LA
    source: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class DeviceFailure:
    at: int
    node: NodeName
    index: int
    repair: int  # minutes until the device is healthy again
    source: str = field(default="", compare=False)


DEFAULT_START = 1767571200.0  # 2026-01-05T00:00:00Z, a Monday


@dataclass(frozen=True, slots=True)
class Trace:
    minutes: int
    online: tuple[OnlineJob, ...] = ()
    borrowers: tuple[BorrowerJob, ...] = ()
    failures: tuple[DeviceFailure, ...] | None = None  # None: drawn from the failure model
    start: float = DEFAULT_START
    step: int = 5  # minutes per simulated step

    @property
    def steps(self) -> int:
        return max(1, -(-self.minutes // self.step))


@dataclass(frozen=True, slots=True)
class Scenario:
    """A cluster and a trace, ready to run: groups expanded, failures drawn."""

    nodes: tuple[NodeSpec, ...]
    trace: Trace
    failures: tuple[DeviceFailure, ...]


def draw_failures(
    nodes: Sequence[NodeSpec], model: FailureModel, minutes: int, seed: int
) -> tuple[DeviceFailure, ...]:
    """Failures of every device over ``minutes``, from the model; deterministic in ``seed``."""
    rng = random.Random(f"failures/{seed}")
    lo, hi = model.repair_hours
    out: list[DeviceFailure] = []
    for node in nodes:
        for index, tier in enumerate(node.tiers):
            rate = model.rate(tier) / MINUTES_PER_DAY
            if rate <= 0:
                continue
            t = rng.expovariate(rate)
            while t < minutes:
                repair = max(1, round(rng.uniform(lo, hi) * 60))
                out.append(DeviceFailure(int(t), node.name, index, repair))
                t += repair + rng.expovariate(rate)
    out.sort(key=lambda f: (f.at, f.node, f.index))
    return tuple(out)


def check(nodes: Sequence[NodeSpec], trace: Trace) -> list[str]:
    """Every problem of a trace against a cluster (names the record and where it was read)."""
    problems: list[str] = []
    names: set[str] = set()
    size: dict[str, int] = {}
    by_name: dict[str, NodeSpec] = {}
    for n in nodes:
        if n.name in names:
            problems.append(f"cluster: node {n.name!r} is listed twice")
        names.add(n.name)
        by_name[n.name] = n
        size[n.gpu_type] = max(size.get(n.gpu_type, 0), n.gpus)
    if not nodes:
        problems.append("cluster: no nodes")
    largest = max(size.values(), default=0)

    def at(source: str) -> str:
        return f"{source}: " if source else "trace: "

    seen: set[str] = set()
    for job in trace.online:
        where = at(job.source) + f"online job {job.name!r}"
        if job.name in seen:
            problems.append(f"{where}: listed twice")
        seen.add(job.name)
        if job.gpu_type not in size:
            problems.append(f"{where}: no node has GPU type {job.gpu_type!r}")
        elif job.gpus_per_replica > size[job.gpu_type]:
            problems.append(
                f"{where}: {job.gpus_per_replica} GPUs per replica, but its nodes have at most "
                f"{size[job.gpu_type]}"
            )
        if job.demand and job.schedule:
            problems.append(f"{where}: give a demand series or a schedule, not both")
        if not job.demand and not job.schedule:
            problems.append(f"{where}: no demand (a series or a schedule)")
    for b in trace.borrowers:
        where = at(b.source) + f"borrower {b.name!r}"
        cap = largest if b.gpu_type is None else size.get(b.gpu_type)
        if cap is None:
            problems.append(f"{where}: no node has GPU type {b.gpu_type!r}")
        elif b.gpus > cap:
            problems.append(f"{where}: asks {b.gpus} GPUs, but no node has more than {cap}")
    for f in trace.failures or ():
        where = at(f.source) + "failure"
        node = by_name.get(f.node)
        if node is None:
            problems.append(f"{where}: node {f.node!r} is not in the cluster")
        elif not 0 <= f.index < node.gpus:
            problems.append(f"{where}: node {f.node!r} has no GPU {f.index} (it has {node.gpus})")
    return problems
