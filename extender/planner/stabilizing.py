"""Calibrate an autoscaling plan so that short-lived changes are not made. Pure.

The plan is a series of worker counts ``R = r0..rn``, one per planning step of ``step_s``
seconds. Walking it, wherever two successive counts differ by at least ``rho``, the run of equal
counts that starts after the change is measured (CALCDURATION); if it lasts less than ``tau_s``
its counts are replaced by the larger of the counts just before and just after it (CALIBRATE,
``max(r_start, r_end)``). The paper's loop bound (``i < n - 1``) is kept: a run that reaches the
end of the series has no "after" and is never calibrated. Defaults are the paper's: ``rho = 1``,
``tau = 10 min``.

Reference: kale 3.4.2, Algorithm 1 (CALCDURATION, CALIBRATE) (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_RHO = 1
DEFAULT_TAU_S = 600.0


@dataclass(frozen=True, slots=True)
class Calibration:
    start: int  # index of the count before the short run
    end: int  # index of the count after it
    value: int  # what the run became
    duration_s: float


def calc_duration(plan: Sequence[int], i: int, step_s: float) -> tuple[float, int, int]:
    """CALCDURATION(R, i): how long the count ``plan[i + 1]`` lasts, with the indices of the
    counts around that run (``end == len(plan)`` when the run reaches the end)."""
    start = i
    end = i + 1
    while end < len(plan) and plan[end] == plan[i + 1]:
        end += 1
    return (end - start - 1) * step_s, start, end


def stabilize_with_reasons(
    plan: Sequence[int],
    step_s: float,
    *,
    rho: int = DEFAULT_RHO,
    tau_s: float = DEFAULT_TAU_S,
) -> tuple[tuple[int, ...], tuple[Calibration, ...]]:
    """The calibrated plan and each calibration made (kale Algorithm 1)."""
    r = list(plan)
    n = len(r) - 1  # the paper's R = {r0, ..., rn}
    done: list[Calibration] = []
    i = 0
    while i < n - 1:
        if abs(r[i] - r[i + 1]) >= rho:
            duration, start, end = calc_duration(r, i, step_s)
            if duration < tau_s and end < len(r):
                smooth = max(r[start], r[end])
                for k in range(start + 1, end):  # CALIBRATE(R, start, end, smooth_value)
                    r[k] = smooth
                done.append(Calibration(start, end, smooth, duration))
        i += 1
    return tuple(r), tuple(done)


def stabilize(
    plan: Sequence[int], step_s: float, *, rho: int = DEFAULT_RHO, tau_s: float = DEFAULT_TAU_S
) -> tuple[int, ...]:
    """The calibrated plan (kale Algorithm 1)."""
    return stabilize_with_reasons(plan, step_s, rho=rho, tau_s=tau_s)[0]
