"""Figures over several seeds: the mean and its Student-t confidence interval. Pure.

A run of ``tidelease simulate --seeds N`` repeats every simulation for the seeds ``--seed``,
``--seed + 1``, ..., ``--seed + N - 1``; each seed draws its own tier placement, tides,
borrowers and failures (what a given trace fixes stays fixed). Each figure is then reported as
the mean over the seeds of its per-seed value, with a two-sided Student-t interval at ``LEVEL``
(95 %): ``mean ± t(n - 1) · s / √n``, ``s`` the sample standard deviation over the seeds. The
seeds are independent replications, so the interval is an honest one for the mean of a figure
over what the seeds draw, including a ratio near 100 % (its per-seed values are averaged, not
pooled into one binomial: a seed's reclaims are not independent of each other). Shares are
clipped to [0, 1]. With one seed there is no interval: low = high = the value itself, so a
one-seed run reads exactly as a run without seeds did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

LEVEL = 0.95
DEFAULT_SEEDS = 3


def seeds_from(first: int, count: int) -> tuple[int, ...]:
    """The seeds of a run: ``first``, ``first + 1``, ..., ``count`` of them."""
    return tuple(first + i for i in range(max(1, count)))


def t_quantile(n: int, level: float = LEVEL) -> float:
    """The two-sided Student-t quantile for ``n`` values (``n - 1`` degrees of freedom)."""
    if n < 2:
        return 0.0
    return float(stats.t.ppf((1.0 + level) / 2.0, n - 1))


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    half: float  # half-width of the interval around the mean (0 with one value)
    low: float  # mean - half, clipped to the figure's range
    high: float  # mean + half, clipped
    n: int  # how many values (seeds)

    @property
    def spread(self) -> bool:
        """Whether there is an interval to show (more than one value)."""
        return self.n > 1


def estimate(
    values: Sequence[float],
    level: float = LEVEL,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Estimate:
    """The mean of ``values`` and its t interval at ``level``, clipped to ``bounds``."""
    n = len(values)
    if n == 0:
        return Estimate(0.0, 0.0, 0.0, 0.0, 0)
    if n == 1:
        x = float(values[0])
        return Estimate(x, 0.0, x, x, 1)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n, level) * sd / math.sqrt(n)
    lo, hi = bounds
    return Estimate(mean, half, max(lo, mean - half), min(hi, mean + half), n)


def share(values: Sequence[float], level: float = LEVEL) -> Estimate:
    """:func:`estimate` of a share (clipped to [0, 1])."""
    return estimate(values, level, (0.0, 1.0))


def seeds_for(
    values: Sequence[float], bound: float, level: float = LEVEL, most: int = 100
) -> int | None:
    """How many seeds would put the lower bound of the interval at or above ``bound``, were the
    mean and standard deviation of ``values`` to hold as more seeds come: the smallest ``n``
    (at least ``len(values)``, at most ``most``) with ``mean - t(n - 1) · s / √n >= bound``;
    ``None`` with fewer than two values (no spread to project), where the mean is below
    ``bound`` (no number of seeds would do) or where it takes more than ``most``. A projection,
    not a promise: more seeds move the mean too."""
    n = len(values)
    if n < 2:
        return None
    e = estimate(values, level)
    if e.mean < bound:
        return None
    if e.low >= bound:
        return n
    sd = e.half * math.sqrt(n) / t_quantile(n, level)
    for k in range(n + 1, most + 1):
        if e.mean - t_quantile(k, level) * sd / math.sqrt(k) >= bound:
            return k
    return None


def band(
    rows: Sequence[Sequence[float]], level: float = LEVEL
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Per column of ``rows`` (one row per seed, equally long): mean, low and high of the t
    interval; with one row low and high are the row itself."""
    data = np.asarray(rows, dtype=np.float64)
    mean = data.mean(axis=0)
    if data.shape[0] < 2:
        return mean, mean.copy(), mean.copy()
    half = t_quantile(data.shape[0], level) * data.std(axis=0, ddof=1) / math.sqrt(data.shape[0])
    return mean, mean - half, mean + half
