"""The soak run's schedule, drawn from its seed: online jobs and their tides, borrowers, faults.

Everything the runner will do is decided here, before the run, from ``random.Random(seed)``
alone, so a seed names a history: the same seed draws the same jobs, the same tides, the same
borrowers and the same faults at the same moments (the cluster's own timing varies; what the
runner asks of it does not). Pure: no clock, no I/O; the runner executes the plan.

Compressed tides: each online job (a StatefulSet, or a Deployment) with a GpuLease lends part of
its GPUs (``desiredGPUs`` down) and takes them back (up) on a schedule of its own, every
30 to 75 s (so that an hour sees a hundred reclaims and more). Borrowers (low-priority pods)
of a few namespaces arrive at random and finish after a random time. Faults
(:data:`FAULT_KINDS`) strike at random moments; each kind at least once.

Queued borrowers (interactive and batch pods of the shared queues, in a namespace of their own
where the chart's gate policy holds them for the queues controller) are drawn from a generator
of their own of the same seed, so that the rest of the history is what the seed named before
they were added; so are borrower gangs (two or three pods of a Workload, placed and evicted
whole: docs/gangs.md).

With a real kubelet node (``real_node_gpus``), more is drawn from a second generator of the
same seed, so that the rest of the history stays what the seed names without it: an online
StatefulSet of two replicas on the real node with tides of its own, real-node borrowers (one
GPU each, every 20 s or so), and :data:`REAL_NODE_FAULT_KINDS`.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

# What a fault does (the runner does and undoes each itself):
#   controllers-kill: kill -9 of `tidelease controllers`, restarted as it ran
#   extender-kill:    kill -9 of replica ``target``'s extender, restarted as it ran
#   replica-kill:     kill -9 of the leading replica's kube-scheduler and extender (a pod
#                     lost), both started again after ``duration_s``
#   kcm-kill:         kill -9 of kube-controller-manager (the StatefulSet and Deployment
#                     controllers), restarted as it ran
#   etcd-pause:       etcd stopped (SIGSTOP) for ``duration_s``, then continued
#   node-delete:      a kwok GPU node (and its GpuNode) deleted with its pods on it; made
#                     again after ``duration_s``
#   apiserver-kill:   kill -9 of kube-apiserver, restarted as it ran
#   net-delay:        the extenders' traffic with the API server held back ``amount`` seconds
#                     a chunk, each way, for ``duration_s``
#   net-drop:         the API server's replies to the extenders dropped (their connections
#                     closed once the request was served) for ``duration_s``
#   device-unhealthy: device ``target`` of kwok node ``node`` reported Unhealthy on its GpuNode
#                     for ``duration_s``, then Healthy again
#   agent-silent:     kwok node ``node``'s agent heartbeat stopped for ``duration_s``
FAULT_KINDS = (
    "controllers-kill",
    "extender-kill",
    "replica-kill",
    "kcm-kill",
    "etcd-pause",
    "node-delete",
    "apiserver-kill",
    "net-delay",
    "net-drop",
    "device-unhealthy",
    "agent-silent",
)
# With a real node:
#   agent-kill:       kill -9 of the real node's tidelease agent (its device plugin and its
#                     heartbeat), started again as it ran, as its DaemonSet pod's kubelet would
#   disk-full:        the real node's cache disk (the agent's tmpfs) filled by another writer
#                     for ``duration_s``, from a few seconds before a scale-down of the real
#                     node's online job (whose new checkpoint the node then fetches for the
#                     scale-up that follows)
REAL_NODE_FAULT_KINDS = ("agent-kill", "disk-full")


@dataclass(frozen=True)
class OnlineJob:
    name: str
    namespace: str
    kind: str  # StatefulSet or Deployment
    replicas: int
    gpus_per_replica: int
    real: bool = False  # its pods on the real kubelet node

    @property
    def full(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True)
class Tide:
    t: float
    job: str
    desired_gpus: int


@dataclass(frozen=True)
class Borrower:
    t: float
    namespace: str
    name: str
    gpus: int
    lifetime_s: float  # from its creation; a queued one's from its binding
    real: bool = False  # on the real kubelet node
    job_class: str | None = None  # interactive or batch: through the shared queues
    gang: str | None = None  # its gang's Workload (spec.workloadRef), members made together
    gang_size: int = 0


@dataclass(frozen=True)
class Fault:
    t: float
    kind: str
    duration_s: float = 0.0  # how long it lasts (its kind says what that is)
    node: int = -1  # node-delete, device-unhealthy, agent-silent: the kwok node (kwok-gpu-<i>)
    target: int = -1  # extender-kill: the replica; device-unhealthy: the device's index
    amount: float = 0.0  # net-delay: seconds a chunk

    def __str__(self) -> str:
        extra = ""
        if self.kind == "node-delete":
            extra = f" node #{self.node}, back after {self.duration_s:.0f} s"
        elif self.kind == "device-unhealthy":
            extra = f" node #{self.node} device {self.target} for {self.duration_s:.0f} s"
        elif self.kind == "agent-silent":
            extra = f" node #{self.node} for {self.duration_s:.0f} s"
        elif self.kind == "extender-kill":
            extra = f" replica {self.target}"
        elif self.kind == "net-delay":
            extra = f" {self.amount * 1000:.0f} ms for {self.duration_s:.1f} s"
        elif self.duration_s:
            extra = f" for {self.duration_s:.1f} s"
        return f"t={self.t:6.1f} {self.kind}{extra}"


@dataclass(frozen=True)
class Plan:
    seed: int
    duration_s: float
    online_namespaces: tuple[str, ...]
    borrower_namespaces: tuple[str, ...]
    queued_namespace: str  # the shared queues' borrowers, gated at creation
    jobs: tuple[OnlineJob, ...]
    tides: tuple[Tide, ...]
    borrowers: tuple[Borrower, ...]
    faults: tuple[Fault, ...]

    def describe(self) -> list[str]:
        queued = sum(1 for b in self.borrowers if b.job_class)
        gangs = len({b.gang for b in self.borrowers if b.gang})
        lines = [
            f"seed {self.seed}, {self.duration_s / 60:.1f} min: {len(self.jobs)} online jobs, "
            f"{len(self.tides)} tides, {len(self.borrowers)} borrowers "
            f"({', '.join(self.borrower_namespaces)}; {queued} through the shared queues in "
            f"{self.queued_namespace}; {gangs} gangs), {len(self.faults)} faults"
        ]
        for job in self.jobs:
            tides = [t for t in self.tides if t.job == job.name]
            lines.append(
                f"  job {job.namespace}/{job.name}: {job.kind} {job.replicas} x "
                f"{job.gpus_per_replica} GPU{' (real node)' if job.real else ''}, tides "
                + ", ".join(f"t={t.t:.0f}->{t.desired_gpus}" for t in tides)
            )
        lines.append("  fault schedule:")
        lines += [f"    {f}" for f in self.faults]
        return lines


# (replicas, GPUs per replica) of the StatefulSets: at most 8 GPUs each.
_SHAPES = ((3, 2), (2, 4), (3, 1), (4, 2), (2, 2), (4, 1))


TIDE_S = (30.0, 75.0)  # how long a job's tide lasts before it turns, at random in between


def _tides(rng: random.Random, job: OnlineJob, duration: float) -> list[Tide]:
    """``job``'s tides: down to a random part of its replicas, then back up, and so on."""
    tide_lo, tide_hi = TIDE_S
    out: list[Tide] = []
    t = rng.uniform(10.0, tide_lo)
    low = True
    while t < duration - 20.0:
        keep = rng.randint(1, job.replicas - 1)
        desired = keep * job.gpus_per_replica if low else job.full
        out.append(Tide(round(t, 1), job.name, desired))
        low = not low
        t += rng.uniform(tide_lo, tide_hi)
    return out


def plan(
    seed: int,
    minutes: float,
    *,
    nodes: int = 6,
    real_node_gpus: int = 0,
    queues: bool = True,
    gangs: bool = True,
) -> Plan:
    """The whole schedule of a run of ``minutes`` on ``nodes`` kwok GPU nodes (8 GPUs each)
    and, with ``real_node_gpus``, a real kubelet node of that many GPUs; ``queues``: with the
    shared queues' borrowers; ``gangs``: with borrower gangs."""
    rng = random.Random(seed)
    duration = minutes * 60.0

    online = ("soak-online-0", "soak-online-1")
    borrower_ns = tuple(f"soak-batch-{i}" for i in range(rng.choice((2, 3))))

    jobs: list[OnlineJob] = []
    for i, (replicas, gpus) in enumerate(rng.sample(_SHAPES, 3)):
        jobs.append(OnlineJob(f"online-{i}", online[i % 2], "StatefulSet", replicas, gpus))
    jobs.append(OnlineJob("web-0", online[1], "Deployment", rng.choice((2, 3)), rng.choice((1, 2))))

    tides: list[Tide] = []
    for job in jobs:
        tides += _tides(rng, job, duration)

    borrowers: list[Borrower] = []
    t = rng.uniform(5.0, 15.0)
    n = 0
    while t < duration - 10.0:
        borrowers.append(
            Borrower(
                round(t, 1),
                rng.choice(borrower_ns),
                f"borrow-{n:04d}",
                rng.choice((1, 2, 2, 4, 4)),
                round(rng.uniform(15.0, 90.0), 1),
            )
        )
        n += 1
        t += rng.expovariate(1 / 5.0)

    # Each kind once (in a random order), then more of any kind, 0.9 a minute in all; at random
    # moments between a warm-up and a quiet end, at least 15 s apart (closer in runs too short
    # for every kind so: the faults that last then overlap the next ones).
    count = max(len(FAULT_KINDS), int(minutes * 0.9))
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    kinds += [rng.choice(FAULT_KINDS) for _ in range(count - len(kinds))]
    start, end = 25.0, max(40.0, duration - 35.0)
    gap = min(15.0, (end - start) / count)
    spare = (end - start) - gap * (count - 1)
    offsets = sorted(rng.uniform(0.0, spare) for _ in range(count))
    faults = []
    for i, (offset, kind) in enumerate(zip(offsets, kinds, strict=True)):
        when = round(start + offset + gap * i, 1)
        if kind == "etcd-pause":
            faults.append(Fault(when, kind, duration_s=round(rng.uniform(3.0, 8.0), 1)))
        elif kind == "node-delete":
            faults.append(
                Fault(
                    when, kind, duration_s=round(rng.uniform(60.0, 90.0)), node=rng.randrange(nodes)
                )
            )
        elif kind == "device-unhealthy":
            dur = round(rng.uniform(30.0, 90.0))
            faults.append(
                Fault(when, kind, dur, node=rng.randrange(nodes), target=rng.randrange(8))
            )
        elif kind == "agent-silent":
            lasting = float(round(rng.uniform(30.0, 90.0)))
            faults.append(Fault(when, kind, lasting, node=rng.randrange(nodes)))
        elif kind == "replica-kill":
            faults.append(Fault(when, kind, duration_s=round(rng.uniform(3.0, 10.0), 1)))
        elif kind == "extender-kill":
            faults.append(Fault(when, kind, target=rng.randrange(2)))
        elif kind == "net-delay":
            lasting, amount = round(rng.uniform(20.0, 60.0), 1), round(rng.uniform(0.05, 0.3), 2)
            faults.append(Fault(when, kind, duration_s=lasting, amount=amount))
        elif kind == "net-drop":
            faults.append(Fault(when, kind, duration_s=round(rng.uniform(5.0, 15.0), 1)))
        else:
            faults.append(Fault(when, kind))

    queued_ns = "soak-queued"
    if queues:
        _queued(random.Random(f"{seed}-queues"), borrowers, duration, queued_ns)
    if gangs:
        _gangs(random.Random(f"{seed}-gangs"), borrowers, duration, borrower_ns)
    if real_node_gpus:
        _real_node(
            random.Random(f"{seed}-real"),
            jobs,
            tides,
            borrowers,
            faults,
            duration,
            real_node_gpus,
            online[0],
            borrower_ns,
        )
    tides.sort(key=lambda x: x.t)
    borrowers.sort(key=lambda x: x.t)
    faults.sort(key=lambda x: x.t)
    return Plan(
        seed=seed,
        duration_s=duration,
        online_namespaces=online,
        borrower_namespaces=borrower_ns,
        queued_namespace=queued_ns,
        jobs=tuple(jobs),
        tides=tuple(tides),
        borrowers=tuple(borrowers),
        faults=tuple(faults),
    )


INTERACTIVE_SHARE = 0.3  # of the queued borrowers; the rest are batch


def _queued(rng: random.Random, borrowers: list[Borrower], duration: float, namespace: str) -> None:
    """Borrowers of the shared queues, added to the list: one every 15 s or so, of one or two
    GPUs, interactive or batch."""
    t, n = rng.uniform(5.0, 20.0), 0
    while t < duration - 10.0:
        job_class = "interactive" if rng.random() < INTERACTIVE_SHARE else "batch"
        borrowers.append(
            Borrower(
                round(t, 1),
                namespace,
                f"queued-{n:04d}",
                rng.choice((1, 2)),
                round(rng.uniform(15.0, 90.0), 1),
                job_class=job_class,
            )
        )
        n += 1
        t += rng.expovariate(1 / 15.0)


GANG_EVERY_S = 30.0  # a gang's arrival, on average
# A gang runs longer than a lone borrower (distributed training): a member evicted alone then
# leaves the others running past the gang-whole checker's bound, not just to their end.
GANG_LIFETIME_S = (90.0, 240.0)


def _gangs(
    rng: random.Random, borrowers: list[Borrower], duration: float, namespaces: tuple[str, ...]
) -> None:
    """Borrower gangs, added to the list: one every 30 s or so, of two or three pods of one or
    two GPUs each, made together and finished together, after 90 to 240 s."""
    t, n = rng.uniform(10.0, 30.0), 0
    while t < duration - 10.0:
        size, gpus = rng.choice((2, 3)), rng.choice((1, 2))
        namespace = rng.choice(namespaces)
        lifetime = round(rng.uniform(*GANG_LIFETIME_S), 1)
        gang = f"gang-{n:04d}"
        for i in range(size):
            borrowers.append(
                Borrower(
                    round(t, 1), namespace, f"{gang}-{i}", gpus, lifetime, gang=gang, gang_size=size
                )
            )
        n += 1
        t += rng.expovariate(1 / GANG_EVERY_S)


def _real_node(
    rng: random.Random,
    jobs: list[OnlineJob],
    tides: list[Tide],
    borrowers: list[Borrower],
    faults: list[Fault],
    duration: float,
    gpus: int,
    online_namespace: str,
    borrower_namespaces: tuple[str, ...],
) -> None:
    """The real node's share of the plan, added to the lists: an online StatefulSet of two
    replicas of a quarter of its GPUs each, its tides, borrowers of one GPU, agent kills."""
    job = OnlineJob("online-real", online_namespace, "StatefulSet", 2, max(1, gpus // 4), True)
    jobs.append(job)
    tides += _scheduled_tides(rng, job, duration)
    t, n = rng.uniform(5.0, 20.0), 0
    while t < duration - 10.0:
        lifetime = round(rng.uniform(15.0, 90.0), 1)
        name = f"real-{n:04d}"
        borrowers.append(
            Borrower(round(t, 1), rng.choice(borrower_namespaces), name, 1, lifetime, True)
        )
        n += 1
        t += rng.expovariate(1 / 20.0)
    start, end = 25.0, max(40.0, duration - 35.0)
    for _ in range(max(1, round(duration / 600.0))):  # one every ten minutes
        faults.append(Fault(round(rng.uniform(start, end), 1), "agent-kill"))
    _disk_full(rng, job, tides, faults, duration)


def _scheduled_tides(rng: random.Random, job: OnlineJob, duration: float) -> list[Tide]:
    """``job``'s tides on whole minutes of the run, a minute or two each: the real node's job
    follows a daily schedule of its GpuLease (``spec.schedule``, HH:MM), so that its scale-ups
    are known ahead and its node prewarms for them (the runner starts the run on a minute)."""
    out: list[Tide] = []
    minute, low = 1, True
    while minute * 60.0 < duration - 20.0:
        desired = rng.randint(1, job.replicas - 1) * job.gpus_per_replica if low else job.full
        out.append(Tide(minute * 60.0, job.name, desired))
        low = not low
        minute += rng.choice((1, 2))
    return out


def _disk_full(
    rng: random.Random, job: OnlineJob, tides: list[Tide], faults: list[Fault], duration: float
) -> None:
    """The real node's disk-full faults: one every ten minutes (at least one), each for a
    scale-up of ``job`` that follows a scale-down, from a few seconds before that scale-down
    for 30-60 s. At the scale-down the job writes a new checkpoint, and the next schedule entry
    is the scale-up: the prewarm controller has the node fetch the checkpoint then (a cold
    node's prelaunch window is longer than the tide), into the full disk; the agent tries again
    15 and 30 s later."""
    mine = sorted((x for x in tides if x.job == job.name), key=lambda x: x.t)
    downs = [a for a, b in itertools.pairwise(mine) if b.desired_gpus > a.desired_gpus]
    for down in rng.sample(downs, min(len(downs), max(1, round(duration / 600.0)))):
        lasting = round(rng.uniform(30.0, 60.0), 1)
        faults.append(Fault(round(down.t - rng.uniform(1.0, 5.0), 1), "disk-full", lasting))
