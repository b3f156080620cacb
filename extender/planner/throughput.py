"""How many samples/s an online training job processes with ``w`` workers: the model, fitted by
non-negative least squares (NNLS) to measured pairs. Pure.

With the worker-to-parameter-server ratio held constant (as the paper does), the throughput of
``w`` workers is, for synchronous training (every step waits for all workers; ``M`` the global
batch size)::

    f_sync(w) = M / (theta0 + theta1/w + theta2/w^2 + theta3*w)

and for asynchronous training (workers step independently; ``scale`` the per-worker batch)::

    f_async(w) = scale * w / (theta0 + theta1/w + theta2*w)

Both are linear in theta once inverted (``scale/f = theta*x(w)`` and
``scale*w/f = theta*x(w)``), so the non-negative theta are found by non-negative least squares
on observed (workers, samples/s) pairs. :func:`min_workers` answers the planner's question: the
fewest workers whose predicted throughput exceeds a traffic rate.

Reference: kale 3.3 (eq. 4, 6 and 9), 3.4.1 (eq. 10) (docs/references.md).
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from common.errors import InvalidInput


class Form(enum.Enum):
    SYNC = "sync"  # synchronous training (kale eq. 6)
    ASYNC = "async"  # asynchronous training (kale eq. 9)


def _features(form: Form, w: float) -> tuple[float, ...]:
    if form is Form.SYNC:
        return (1.0, 1.0 / w, 1.0 / (w * w), w)
    return (1.0, 1.0 / w, w)


@dataclass(frozen=True, slots=True)
class ThroughputModel:
    """The fitted throughput function of the worker count (samples/s; kale 3.3)."""

    form: Form
    theta: tuple[float, ...]
    scale: float = 1.0  # global batch M for sync (kale eq. 4), the per-worker batch for async

    def predict(self, workers: int) -> float:
        if workers <= 0:
            return 0.0
        features = _features(self.form, workers)
        denominator = sum(t * x for t, x in zip(self.theta, features, strict=True))
        if denominator <= 0.0:
            return math.inf
        numerator = self.scale if self.form is Form.SYNC else self.scale * workers
        return numerator / denominator


@dataclass(frozen=True, slots=True)
class Observation:
    workers: int
    throughput: float  # samples/s


@dataclass(frozen=True, slots=True)
class Fit:
    model: ThroughputModel
    residual: float  # NNLS residual norm in the linearised space
    mape: float  # mean absolute percentage error of the fitted throughputs, in %


def fit_throughput(obs: Sequence[Observation], form: Form, scale: float = 1.0) -> Fit:
    """theta >= 0 by NNLS (scipy.optimize.nnls) on the linearised form; InvalidInput when the data
    cannot determine them."""
    good = [o for o in obs if o.workers > 0 and o.throughput > 0.0]
    problems = []
    n_params = 4 if form is Form.SYNC else 3
    if len({o.workers for o in good}) < n_params:
        problems.append(
            f"{form.value} model needs observations at {n_params} distinct worker counts, "
            f"got {len({o.workers for o in good})}"
        )
    if scale <= 0:
        problems.append("scale must be positive")
    if problems:
        raise InvalidInput(problems)
    a = np.array([_features(form, o.workers) for o in good], dtype=float)
    w = np.array([o.workers for o in good], dtype=float)
    y = np.array([o.throughput for o in good], dtype=float)
    b = scale / y if form is Form.SYNC else scale * w / y
    # Scale the columns so that 1/w^2 and w terms weigh alike; NNLS is invariant to it.
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    theta_scaled, residual = nnls(a / norms, b)
    theta = theta_scaled / norms
    model = ThroughputModel(form, tuple(float(t) for t in theta), scale)
    predicted = np.array([model.predict(o.workers) for o in good])
    mape = float(np.mean(np.abs(predicted - y) / y) * 100.0)
    return Fit(model=model, residual=float(residual), mape=mape)


def min_workers(
    model: ThroughputModel, traffic: float, *, lowest: int = 1, highest: int = 1024
) -> int | None:
    """The fewest workers in ``lowest..highest`` with ``f(w) > traffic`` (kale eq. 10); ``None``
    when no count in range is enough (the caller then holds ``highest``)."""
    for w in range(max(1, lowest), highest + 1):
        if model.predict(w) > traffic:
            return w
    return None


@dataclass(frozen=True, slots=True)
class CapacityTable:
    """Eq. 10 answered by bisection: the running maximum of ``f(1..highest)``. The first count
    whose running maximum exceeds a rate is the first count whose own throughput does."""

    lowest: int
    peaks: tuple[float, ...]  # peaks[k] = max f(lowest..lowest + k)

    @classmethod
    def build(cls, model: ThroughputModel, lowest: int, highest: int) -> CapacityTable:
        peaks: list[float] = []
        best = -math.inf
        for w in range(max(1, lowest), highest + 1):
            best = max(best, model.predict(w))
            peaks.append(best)
        return cls(max(1, lowest), tuple(peaks))

    def min_workers(self, traffic: float) -> int | None:
        k = bisect.bisect_right(self.peaks, traffic)
        return None if k >= len(self.peaks) else self.lowest + k
