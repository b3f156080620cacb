"""Capped exponential backoff with jitter, for retried commands. Pure: the random source is
injected (a ``random.Random().random`` in production, a constant in tests)."""

from __future__ import annotations

from collections.abc import Callable


def backoff_s(attempt: int, initial_s: float, max_s: float, rand: Callable[[], float]) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 for the first issue).

    The ceiling doubles per attempt from ``initial_s`` up to ``max_s``; the wait is drawn
    uniformly from its upper half ("equal jitter"): never shorter than half the ceiling, so
    retries still back off, and spread out, so many failed commands do not retry in step.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    # min() before the power: attempt 2,000 must not overflow a float.
    ceiling = min(max_s, initial_s * 2.0 ** min(attempt - 1, 64))
    r = min(max(rand(), 0.0), 1.0)
    return ceiling / 2 + r * ceiling / 2
