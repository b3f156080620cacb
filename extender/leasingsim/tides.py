"""The built-in cluster and trace, generated deterministically from a seed. Pure.

**Cluster**: 1,250 nodes of 8 GPUs (10,000 GPUs): 1,000 H20 nodes and 250 A100 nodes. About 48 %
of the GPUs start out held by online jobs, as in the paper's production cluster; those nodes are
a little more reliable than the rest (74 % HA against a cluster average of 70 %, as measured
there).

**Online demand** (:func:`tide`): per job, a daily tide with its trough around 04:00 and a broad
high from late morning to the evening, lower at weekends, with slow multiplicative noise (an
AR(1) process); the trough is 16-24 % of the peak, so the peak is at least 4x the trough.

**Borrowers**: Poisson arrivals of low-priority jobs (1, 2, 4 or 8 GPUs; running times
log-normal around 12 h; patience a day), plus a backlog already waiting at minute 0, enough that
borrowers get well under half of what they ask at the online peak (the paper saw about 40 %).

**Failures**: drawn from the cluster's failure model (:func:`~.scenario.draw_failures`): LA
devices fail most often, HA least.

Reference: weflex 4.3.1 (48 %), 4.3.2 (40 %), 4.7 and fig. 5 (74 %, 70 %) (docs/references.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from common.model import JobKey, Tier
from extender.leasingsim.scenario import (
    MINUTES_PER_DAY,
    BorrowerJob,
    ClusterSpec,
    FailureModel,
    NodeGroup,
    NodeSpec,
    OnlineJob,
    Role,
    Trace,
)

DEFAULT_DAYS = 14.0
ONLINE_TIERS = ((Tier.HA, 0.74), (Tier.MA, 0.20), (Tier.LA, 0.06))
SHARED_TIERS = ((Tier.HA, 0.663), (Tier.MA, 0.24), (Tier.LA, 0.097))
JOB_NAMES = (
    "recsys",
    "ads-rank",
    "feeds",
    "search",
    "video-rec",
    "news",
    "shop",
    "music",
    "games",
    "live",
    "maps",
    "mail",
    "notes",
    "pay",
    "kids",
    "sports",
)


def default_cluster(scale: float = 1.0) -> ClusterSpec:
    """The built-in cluster; ``scale`` shrinks it (tests, quick looks), keeping its mix."""

    def n(count: int) -> int:
        return max(1, round(count * scale))

    return ClusterSpec(
        groups=(
            NodeGroup("h20-online", n(480), "H20", 8, ONLINE_TIERS, Role.ONLINE),
            NodeGroup("h20", n(520), "H20", 8, SHARED_TIERS, Role.SHARED),
            NodeGroup("a100-online", n(120), "A100", 8, ONLINE_TIERS, Role.ONLINE),
            NodeGroup("a100", n(130), "A100", 8, SHARED_TIERS, Role.SHARED),
        ),
        failure_model=FailureModel(),
    )


@dataclass(frozen=True, slots=True)
class TideModel:
    trough: tuple[float, float] = (0.16, 0.24)  # trough as a share of the peak, per job
    trough_hour: float = 4.0  # UTC hour of the daily low
    phase_hours: float = 1.5  # jobs' tides are shifted by up to this much either way
    sharpness: float = 0.6  # < 1: a broad daytime high, a short night trough
    weekend: tuple[float, float] = (0.88, 0.82)  # Saturday, Sunday: share of the weekday high
    noise: float = 0.03  # standard deviation of the multiplicative noise
    noise_memory: float = 0.98  # AR(1) coefficient per step


@dataclass(frozen=True, slots=True)
class BorrowerModel:
    jobs_per_hour: float = 120.0
    backlog_gpus: int = 9_000  # asked by borrowers already waiting at minute 0
    gpus: tuple[tuple[int, float], ...] = ((1, 0.15), (2, 0.2), (4, 0.3), (8, 0.35))
    median_hours: float = 10.0
    sigma: float = 0.9
    hours: tuple[float, float] = (0.5, 72.0)
    patience_hours: float = 24.0
    typed: float = 0.3  # share that asks for one GPU type (in proportion to the cluster's)


def tide(
    minutes: int,
    step: int,
    *,
    peak: int,
    trough: float,
    phase: float,
    model: TideModel,
    rng: np.random.Generator,
) -> np.ndarray:
    """Demand in GPUs per step: peak at the weekday high, ``trough * peak`` at the daily low."""
    t = np.arange(0, minutes, step, dtype=float)
    hours = t / 60.0
    daily = 0.5 - 0.5 * np.cos(2 * math.pi * (hours - model.trough_hour - phase) / 24.0)
    daily = daily**model.sharpness
    # the week's days change at the daily low, where the shift does not show
    low = (model.trough_hour + phase) * 60.0
    weekday = ((t - low) // MINUTES_PER_DAY).astype(int) % 7
    week = np.ones_like(t)
    week[weekday == 5] = model.weekend[0]
    week[weekday == 6] = model.weekend[1]
    shape = trough + (1.0 - trough) * daily * week
    noise = np.empty_like(t)
    level = 0.0
    innovation = model.noise * math.sqrt(1 - model.noise_memory**2)
    for i, e in enumerate(rng.normal(0.0, innovation, size=len(t))):
        level = model.noise_memory * level + e
        noise[i] = level
    shape = np.clip(shape * (1.0 + noise), 0.0, 1.0)
    demand: np.ndarray = np.rint(shape * peak).astype(int)
    return demand


def _online_jobs(
    nodes: list[NodeSpec], minutes: int, step: int, seed: int, model: TideModel
) -> list[OnlineJob]:
    rng = np.random.default_rng([seed, 1])
    capacity: dict[str, int] = {}
    for n in nodes:
        if n.role is Role.ONLINE:
            capacity[n.gpu_type] = capacity.get(n.gpu_type, 0) + n.gpus
    # about one job per 400 GPUs of online capacity, at least one per type, at most 16 in all
    per_type = {t: max(1, round(gpus / 400)) for t, gpus in capacity.items()}
    total = sum(per_type.values())
    while total > len(JOB_NAMES):
        largest = max(per_type, key=lambda k: per_type[k])
        per_type[largest] -= 1
        total -= 1
    jobs: list[OnlineJob] = []
    names = iter(JOB_NAMES)
    for gpu_type in sorted(capacity, key=lambda k: -capacity[k]):
        count = per_type[gpu_type]
        replicas = capacity[gpu_type] // 8
        weights = rng.dirichlet(np.full(count, 4.0))
        sizes = [max(1, int(w * replicas)) for w in weights]
        sizes[int(np.argmax(weights))] += replicas - sum(sizes)
        for size in sizes:
            if size <= 0:
                continue
            trough = float(rng.uniform(*model.trough))
            phase = float(rng.uniform(-model.phase_hours, model.phase_hours))
            series = tide(
                minutes, step, peak=size * 8, trough=trough, phase=phase, model=model, rng=rng
            )
            points: list[tuple[int, int]] = []
            for i, gpus in enumerate(series.tolist()):
                if not points or points[-1][1] != gpus:
                    points.append((i * step, int(gpus)))
            jobs.append(OnlineJob(JobKey(next(names)), gpu_type, 8, Tier.LA, tuple(points)))
    return jobs


def _borrowers(
    nodes: list[NodeSpec], minutes: int, seed: int, model: BorrowerModel
) -> list[BorrowerJob]:
    rng = np.random.default_rng([seed, 2])
    types: dict[str, int] = {}
    for n in nodes:
        types[n.gpu_type] = types.get(n.gpu_type, 0) + n.gpus
    type_names = sorted(types)
    type_p = np.array([types[t] for t in type_names], dtype=float)
    type_p /= type_p.sum()
    sizes = np.array([g for g, _ in model.gpus])
    size_p = np.array([p for _, p in model.gpus], dtype=float)
    size_p /= size_p.sum()
    largest = max(n.gpus for n in nodes)
    mean_gpus = float((sizes * size_p).sum())
    backlog = int(model.backlog_gpus * sum(types.values()) / 10_000 / mean_gpus)
    rate = model.jobs_per_hour * sum(types.values()) / 10_000 / 60.0  # per minute
    arrivals = [0] * backlog
    t = 0.0
    while rate > 0:
        t += float(rng.exponential(1.0 / rate))
        if t >= minutes:
            break
        arrivals.append(int(t))
    out: list[BorrowerJob] = []
    lo, hi = model.hours
    for i, at in enumerate(arrivals):
        gpus = int(min(largest, rng.choice(sizes, p=size_p)))
        hours = float(np.clip(rng.lognormal(math.log(model.median_hours), model.sigma), lo, hi))
        gpu_type = None
        if rng.random() < model.typed:
            gpu_type = str(rng.choice(type_names, p=type_p))
        out.append(
            BorrowerJob(
                name=f"job-{i:05d}",
                arrival=at,
                gpus=gpus,
                duration=max(1, round(hours * 60)),
                patience=round(model.patience_hours * 60),
                gpu_type=gpu_type,
            )
        )
    return out


def default_trace(
    nodes: list[NodeSpec],
    *,
    days: float = DEFAULT_DAYS,
    seed: int = 1,
    step: int = 5,
    tides: TideModel | None = None,
    load: BorrowerModel | None = None,
) -> Trace:
    """Online jobs sized to the cluster's ``online`` nodes, borrowers scaled to its size."""
    minutes = max(step, round(days * MINUTES_PER_DAY))
    return Trace(
        minutes=minutes,
        online=tuple(_online_jobs(nodes, minutes, step, seed, tides or TideModel())),
        borrowers=tuple(_borrowers(nodes, minutes, seed, load or BorrowerModel())),
        failures=None,
        step=step,
    )
