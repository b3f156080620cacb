"""Status conditions in the standard shape (``metav1.Condition``). Pure.

A condition's ``lastTransitionTime`` is when its status last changed, not when it was last
written: :func:`set_condition` keeps it while the status stays, so a reader can tell how long a
node has been unhealthy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from common.timefmt import rfc3339

Status = Literal["True", "False", "Unknown"]


def set_condition(
    previous: Iterable[Mapping[str, Any]] | None,
    type_: str,
    status: Status,
    reason: str,
    message: str,
    now: float,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """The conditions with ``type_`` set (others kept, in order; a new one appended)."""
    out: list[dict[str, Any]] = []
    found = False
    for old in previous or ():
        if not isinstance(old, Mapping):
            continue
        if old.get("type") == type_:
            found = True
            out.append(_condition(type_, status, reason, message, now, observed_generation, old))
        else:
            out.append(dict(old))
    if not found:
        out.append(_condition(type_, status, reason, message, now, observed_generation, None))
    return out


def _condition(
    type_: str,
    status: Status,
    reason: str,
    message: str,
    now: float,
    observed_generation: int | None,
    old: Mapping[str, Any] | None,
) -> dict[str, Any]:
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since if isinstance(since, str) else rfc3339(now),
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    return condition
