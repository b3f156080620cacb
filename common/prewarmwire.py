"""The prewarm wire format on GpuNode objects, shared by the control plane and the node agent.
Pure: parsing and formatting, no I/O.

- ``spec.prewarm`` (written by :mod:`extender.prewarm.controller`): one :class:`Directive` per
  lease that wants this node to fetch images and a checkpoint ahead of a scale-up.
- ``status.prewarm.items`` (written by the node agent, :mod:`nodeagent.prewarm`): one
  :class:`ItemStatus` per item of those directives.

Entries that do not parse are left out: the controller rewrites its own, the agent ignores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from common.timefmt import epoch, microtime

Role = Literal["Lent", "Standby"]
ItemKind = Literal["image", "checkpoint"]
ItemState = Literal["Pending", "Done", "Failed"]
ITEM_STATES: tuple[ItemState, ...] = ("Pending", "Done", "Failed")


@dataclass(frozen=True, slots=True)
class Directive:
    """One lease's prewarm directive for one node."""

    lease: str  # namespace/name of the GpuLease
    role: Role  # why this node: it holds lent devices, or stands by for those that cannot return
    images: tuple[str, ...]
    checkpoints: tuple[str, ...]
    not_before: float  # start fetching at this time (T_scale - W - margin)
    deadline: float  # T_scale: everything should be local by then
    window_s: float  # W of the node for these items, when decided

    def to_json(self) -> dict[str, Any]:
        return {
            "lease": self.lease,
            "role": self.role,
            "images": list(self.images),
            "checkpoints": list(self.checkpoints),
            "notBefore": microtime(self.not_before),
            "deadline": microtime(self.deadline),
            "windowSeconds": round(self.window_s, 3),
        }


def parse_directives(value: object) -> tuple[Directive, ...]:
    """``spec.prewarm`` of a GpuNode; entries that do not parse are left out (the controller
    rewrites them, the agent ignores them)."""
    out: list[Directive] = []
    for entry in value if isinstance(value, list) else []:
        if not isinstance(entry, dict):
            continue
        lease, role = entry.get("lease"), entry.get("role", "Lent")
        not_before, deadline = epoch(entry.get("notBefore")), epoch(entry.get("deadline"))
        images, checkpoints = entry.get("images") or [], entry.get("checkpoints") or []
        window = entry.get("windowSeconds", 0.0)
        if (
            not isinstance(lease, str)
            or role not in ("Lent", "Standby")
            or not_before is None
            or deadline is None
            or not isinstance(images, list)
            or not isinstance(checkpoints, list)
            or not all(isinstance(i, str) for i in images + checkpoints)
            or not isinstance(window, int | float)
        ):
            continue
        out.append(
            Directive(
                lease, role, tuple(images), tuple(checkpoints), not_before, deadline, float(window)
            )
        )
    return tuple(sorted(out, key=lambda d: d.lease))


@dataclass(frozen=True, slots=True)
class ItemStatus:
    """The agent's report on one item of one directive (``status.prewarm.items[]``)."""

    lease: str
    kind: ItemKind
    name: str
    state: ItemState
    reason: str = ""
    seconds: float | None = None  # fetch time, when finished
    finished_at: float | None = None
    deadline: float | None = None  # the directive's, to tell the lead time

    @property
    def key(self) -> tuple[str, ItemKind, str]:
        return (self.lease, self.kind, self.name)

    @property
    def lead_s(self) -> float | None:
        """Seconds between done and the scale-up (negative: late)."""
        if self.state != "Done" or self.finished_at is None or self.deadline is None:
            return None
        return self.deadline - self.finished_at

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "lease": self.lease,
            "kind": self.kind,
            "name": self.name,
            "state": self.state,
            "reason": self.reason[:1024],
        }
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 3)
        if self.finished_at is not None:
            out["finishedAt"] = microtime(self.finished_at)
        if self.deadline is not None:
            out["deadline"] = microtime(self.deadline)
        return out


def parse_items(value: object) -> tuple[ItemStatus, ...]:
    """``status.prewarm`` of a GpuNode; malformed items are left out."""
    items = value.get("items") if isinstance(value, dict) else None
    out: list[ItemStatus] = []
    for e in items if isinstance(items, list) else []:
        if not isinstance(e, dict):
            continue
        lease, kind, name, state = e.get("lease"), e.get("kind"), e.get("name"), e.get("state")
        seconds = e.get("seconds")
        if (
            not isinstance(lease, str)
            or kind not in ("image", "checkpoint")
            or not isinstance(name, str)
            or state not in ITEM_STATES
        ):
            continue
        out.append(
            ItemStatus(
                lease,
                kind,
                name,
                state,
                str(e.get("reason", "")),
                float(seconds) if isinstance(seconds, int | float) else None,
                epoch(e.get("finishedAt")),
                epoch(e.get("deadline")),
            )
        )
    return tuple(out)


def directives_json(directives: Sequence[Directive]) -> list[dict[str, Any]] | None:
    """The value of spec.prewarm (None removes it in a merge patch)."""
    return [d.to_json() for d in directives] or None
