"""What a run measures: time series sampled every step, and their summary. Pure.

* **HA share** of the online jobs (does lending cost them reliable devices?): of *the online
  jobs' GPUs*, the share of HA tier (high availability: never down in the tier window). Their
  GPUs are the devices their pods hold, but standby devices on loan (the pool's, standing in for
  lent devices that could not come back yet), plus the devices they have lent with right of
  return (tagged with their name, due back), each device once. Under right of return this
  is the set they held before lending, whatever the tide; without it (no return, no scaling) it is
  what they hold. How good the stand-ins are is measured by the reclaims. *start*: the pre-lease
  placement. It is compared at each day's online peak (the step where the jobs hold the most
  GPUs), where every policy holds (nearly) all of its GPUs: *end* is the last day's, *min* and
  *max* the extremes over the days, *drift* the largest distance from *start*. *steps drift*: the
  largest distance from *start* over every step (for right of return the share is flat through the
  day too; without it, the share of what is held moves with the tide).
* **Fulfilment** of the borrowers (how much of what they ask they get): GPUs their running pods hold
  over GPUs asked by every borrower that is pending or running. *trough*: mean over the steps where
  the online demand is in its lowest quarter; *peak*: in its highest quarter.
* **Reclaims** (:class:`~.controlling.ReclaimRecord`): a reclaim asks back the devices of the
  lent groups it takes back (*due*); it is *full* when each due device is matched, by the same
  device or another of the owner's lent devices or a standby device on loan, of the same GPU
  type and an equal or better tier, and it completed within the grace period + 10 s.
  *shortfall*: due devices without a match; *returned*, *backfilled*, *foreign*: what the new
  pods got (own lent devices, standby, anything else); *lost*: due devices unhealthy (or their
  node gone) when the reclaim completed; *forfeited*: due devices neither back nor still lent.
* **GPU hours lent**: GPU-hours the online jobs held below their peak (released to the
  platform); **on lent**: borrower GPU-hours on devices tagged by an online job.
* **Utilisation**: GPUs held by any pod over all GPUs.

Over several seeds each figure of a :class:`Summary` is the mean of its per-seed values with
a t interval (:func:`over_seeds`, :mod:`~extender.leasingsim.estimating`).

Reference: weflex fig. 14 (HA share), fig. 10 (fulfilment) (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from extender.leasingsim.controlling import ReclaimRecord
from extender.leasingsim.estimating import LEVEL, Estimate, estimate, share
from extender.leasingsim.scenario import MINUTES_PER_DAY


@dataclass(slots=True)
class Series:
    minute: list[int] = field(default_factory=list)
    online_demand: list[int] = field(default_factory=list)  # GPUs the jobs' targets ask
    online_wanted: list[int] = field(default_factory=list)  # GPUs of the replicas they run
    online_held: list[int] = field(default_factory=list)  # GPUs the jobs' pods hold
    online_own: list[int] = field(default_factory=list)  # the jobs' GPUs: own held + lent
    online_ha: list[int] = field(default_factory=list)  # of those, HA
    requested: list[int] = field(default_factory=list)  # borrowers: pending + running GPUs
    running: list[int] = field(default_factory=list)  # borrowers: GPUs held
    on_lent: list[int] = field(default_factory=list)  # borrowers: on owner-tagged devices
    lent: list[int] = field(default_factory=list)  # devices tagged (lent) by online jobs
    standby: list[int] = field(default_factory=list)  # healthy standby devices
    unhealthy: list[int] = field(default_factory=list)

    def ha_share(self) -> list[float]:
        pairs = zip(self.online_ha, self.online_own, strict=True)
        return [ha / held if held else 0.0 for ha, held in pairs]

    def fulfilment(self) -> list[float]:
        pairs = zip(self.running, self.requested, strict=True)
        return [run / req if req else 1.0 for run, req in pairs]

    def daily_peaks(self) -> list[int]:
        """Per simulated day, the first step where the online jobs hold the most GPUs."""
        best: dict[int, int] = {}
        for i, (m, held) in enumerate(zip(self.minute, self.online_held, strict=True)):
            day = m // MINUTES_PER_DAY
            j = best.get(day)
            if j is None or held > self.online_held[j]:
                best[day] = i
        return [best[d] for d in sorted(best)]


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    standby_gpus: int
    ha_start: float
    ha_end: float
    ha_min: float
    ha_max: float
    ha_drift: float  # largest |share at a daily peak - start|
    ha_steps_drift: float  # largest |share at any step - start|
    cluster_ha: float  # HA share of all the cluster's devices
    fulfilment_trough: float
    fulfilment_peak: float
    fulfilment_mean: float
    reclaims: int
    reclaims_full: int
    reclaims_timely: int
    due: int
    shortfall: int  # due devices without a match
    returned: int  # own lent devices the new pods got
    backfilled: int  # standby devices they got (on loan)
    foreign: int  # other devices they got
    lost: int
    forfeited: int
    reclaim_evictions: int  # borrower pods evicted by reclaims' notices
    gpu_hours_lent: float
    borrower_gpu_hours: float
    on_lent_gpu_hours: float
    utilisation: float
    evictions: int
    borrowers_finished: int
    borrowers_gave_up: int
    elapsed_s: float  # wall time of the run
    cpu_s: float  # CPU time of the run (one core: the simulation is single-threaded)

    @property
    def reclaims_full_ratio(self) -> float:
        return self.reclaims_full / self.reclaims if self.reclaims else 1.0


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _quantile(xs: Sequence[int], q: float) -> float:
    s = sorted(xs)
    if not s:
        return 0.0
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(
    *,
    policy: str,
    standby_gpus: int,
    series: Series,
    ha_start: float,
    cluster_ha: float,
    reclaims: Sequence[ReclaimRecord],
    peak_gpus: int,
    total_gpus: int,
    step: int,
    evictions: int,
    finished: int,
    gave_up: int,
    elapsed_s: float,
    cpu_s: float = 0.0,
) -> Summary:
    reclaims = [r for r in reclaims if r.due > 0]  # scale-ups with nothing lent: no reclaim
    share = series.ha_share()
    peaks = [share[i] for i in series.daily_peaks()]
    fulfil = series.fulfilment()
    lo = _quantile(series.online_demand, 0.25)
    hi = _quantile(series.online_demand, 0.75)
    trough = [f for f, d in zip(fulfil, series.online_demand, strict=True) if d <= lo]
    peak = [f for f, d in zip(fulfil, series.online_demand, strict=True) if d >= hi]
    hours = step / 60.0
    used = [h + r for h, r in zip(series.online_held, series.running, strict=True)]
    return Summary(
        policy=policy,
        standby_gpus=standby_gpus,
        ha_start=ha_start,
        ha_end=peaks[-1] if peaks else ha_start,
        ha_min=min(peaks, default=ha_start),
        ha_max=max(peaks, default=ha_start),
        ha_drift=max((abs(x - ha_start) for x in peaks), default=0.0),
        ha_steps_drift=max((abs(x - ha_start) for x in share), default=0.0),
        cluster_ha=cluster_ha,
        fulfilment_trough=_mean(trough),
        fulfilment_peak=_mean(peak),
        fulfilment_mean=_mean(fulfil),
        reclaims=len(reclaims),
        reclaims_full=sum(1 for r in reclaims if r.full),
        reclaims_timely=sum(1 for r in reclaims if r.timely),
        due=sum(r.due for r in reclaims),
        shortfall=sum(r.shortfall for r in reclaims),
        returned=sum(r.returned for r in reclaims),
        backfilled=sum(r.backfilled for r in reclaims),
        foreign=sum(r.foreign for r in reclaims),
        lost=sum(r.lost for r in reclaims),
        forfeited=sum(r.forfeited for r in reclaims),
        reclaim_evictions=sum(r.evicted for r in reclaims),
        gpu_hours_lent=sum(max(0, peak_gpus - h) for h in series.online_held) * hours,
        borrower_gpu_hours=sum(series.running) * hours,
        on_lent_gpu_hours=sum(series.on_lent) * hours,
        utilisation=_mean([u / total_gpus for u in used]) if total_gpus else 0.0,
        evictions=evictions,
        borrowers_finished=finished,
        borrowers_gave_up=gave_up,
        elapsed_s=elapsed_s,
        cpu_s=cpu_s,
    )


# Summary fields (and properties) that are shares, clipped to [0, 1] over the seeds.
SHARES = frozenset(
    {
        "ha_start",
        "ha_end",
        "ha_min",
        "ha_max",
        "cluster_ha",
        "fulfilment_trough",
        "fulfilment_peak",
        "fulfilment_mean",
        "utilisation",
        "reclaims_full_ratio",
    }
)


def over_seeds(summaries: Sequence[Summary], name: str, level: float = LEVEL) -> Estimate:
    """One figure of a policy's summaries (one per seed): its mean and t interval."""
    values = [float(getattr(s, name)) for s in summaries]
    return share(values, level) if name in SHARES else estimate(values, level)
