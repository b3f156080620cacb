"""Availability of a device from its observed intervals. Pure.

The node agent publishes, per device, the intervals ``[start, end, healthy]`` it observed within
its accounting window (GpuNode ``status.availability``); availability is healthy time over
observed time. The agent assigns tiers from it; ``tidelease ctl`` shows it.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float, bool]  # start, end, healthy


def availability(intervals: Iterable[Interval], now: float, window_s: float) -> float:
    """Healthy time over observed time within ``[now - window_s, now]``; 1.0 if none observed."""
    start = now - window_s
    healthy = observed = 0.0
    for a, b, ok in intervals:
        overlap = min(b, now) - max(a, start)
        if overlap <= 0:
            continue
        observed += overlap
        if ok:
            healthy += overlap
    return 1.0 if observed <= 0 else healthy / observed
