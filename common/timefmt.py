"""Times as Kubernetes writes them, and back: epoch seconds inside, strings on the wire."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(t: float) -> str:
    """metav1.Time: RFC 3339, whole seconds, UTC."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def microtime(t: float) -> str:
    """metav1.MicroTime: RFC 3339 with microseconds, UTC (Lease renewTime and friends)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 string; None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
