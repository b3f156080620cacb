"""Text for ``tidelease ctl``: tables as kubectl prints them, or the same data as JSON/YAML. Pure.

Tables: upper-case headers, columns two spaces apart, ``-`` for nothing. Colour (health, agent,
phase) only when asked for: the command asks on a terminal, unless NO_COLOR is set.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import yaml

from extender.ctl.explain import Explanation
from extender.ctl.view import ClusterSummary, DeviceView, LeaseView, NodeView

_RED, _YELLOW, _GREEN = "31", "33", "32"
_COLOURS = {
    "Unhealthy": _RED,
    "Silent": _RED,
    "Unknown": _YELLOW,
    "NoLease": _YELLOW,
    "Reclaiming": _YELLOW,
    "Degraded": _RED,
    "no": _RED,
    "fits": _GREEN,
}


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], colour: bool = False) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        padded = [_paint(c.ljust(w), colour) for c, w in zip(row, widths, strict=True)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _paint(text: str, on: bool) -> str:
    code = _COLOURS.get(text.split(" ", 1)[0])
    return f"\033[{code}m{text}\033[0m" if on and code else text


def data(value: Any) -> Any:
    """The JSON form of a view: dataclasses as objects (a device with its state)."""
    if isinstance(value, DeviceView):
        return {**dataclasses.asdict(value), "state": value.state}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [data(v) for v in value]
    return value


def dump(value: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data(value), indent=2, sort_keys=False) + "\n"
    return yaml.safe_dump(data(value), sort_keys=False)


def status(s: ClusterSummary, colour: bool = False) -> str:
    out = [f"GPU nodes: {s.nodes}"]
    if s.silent_nodes:
        out.append(f"  agent silent ({len(s.silent_nodes)}): {', '.join(s.silent_nodes)}")
    if s.unreadable_nodes:
        unreadable = ", ".join(s.unreadable_nodes)
        out.append(f"  GpuNode unreadable ({len(s.unreadable_nodes)}): {unreadable}")
    out.append("")
    out.append("GPUs")
    rows = [
        (
            c.type,
            c.tier,
            c.total,
            c.healthy,
            c.unhealthy,
            c.unknown,
            c.free,
            c.held,
            c.lent,
            c.borrowed,
            f"{c.standby_free}/{c.standby_on_loan}",
        )
        for c in s.gpus
    ]
    out.append(
        table(
            (
                "TYPE",
                "TIER",
                "TOTAL",
                "HEALTHY",
                "UNHEALTHY",
                "UNKNOWN",
                "FREE",
                "HELD",
                "LENT",
                "BORROWED",
                "STANDBY(FREE/ON-LOAN)",
            ),
            rows,
            colour,
        ).rstrip("\n")
    )
    out.append("")
    out.append("Leases")
    out.append(leases(s.leases, colour).rstrip("\n") if s.leases else "  none")
    return "\n".join(out) + "\n"


def nodes(views: Sequence[NodeView], colour: bool = False) -> str:
    rows = []
    for n in views:
        by_state = [d.state for d in n.devices]
        rows.append(
            (
                n.name,
                n.agent,
                len(n.devices),
                by_state.count("free"),
                by_state.count("held"),
                by_state.count("borrowed"),
                sum(d.owner is not None for d in n.devices),
                sum(d.standby for d in n.devices),
                sum(d.health != "Healthy" for d in n.devices),
                n.problem,
            )
        )
    headers = ("NAME", "AGENT", "GPUS", "FREE", "HELD", "BORROWED", "LENT", "STANDBY")
    return table((*headers, "NOT-HEALTHY", "PROBLEM"), rows, colour)


def node(n: NodeView, colour: bool = False) -> str:
    head = f"Node: {n.name}\nAgent: {_paint(n.agent, colour)}\n"
    if n.problem:
        return head + f"Problem: {n.problem}\n"
    rows = [
        (
            d.index,
            d.uuid,
            d.type,
            d.tier,
            d.health,
            None if d.availability is None else f"{d.availability:.2%}",
            d.state,
            d.holder,
            d.owner,
            d.replica,
            d.standby,
            d.reason,
        )
        for d in n.devices
    ]
    headers = ("INDEX", "UUID", "TYPE", "TIER", "HEALTH", "AVAILABILITY", "STATE", "POD")
    return head + "\n" + table((*headers, "OWNER", "REPLICA", "STANDBY", "REASON"), rows, colour)


def leases(views: Sequence[LeaseView], colour: bool = False) -> str:
    rows = [
        (
            v.namespace,
            v.name,
            v.owner,
            v.phase or "Invalid",
            v.desired_gpus,
            v.held_gpus,
            v.lent_gpus,
            v.reclaims,
            None if v.last_reclaim_seconds is None else f"{v.last_reclaim_seconds:g}s",
            v.problem,
        )
        for v in views
    ]
    headers = ("NAMESPACE", "NAME", "OWNER", "PHASE", "DESIRED", "HELD", "LENT", "RECLAIMS")
    return table((*headers, "LAST-RECLAIM", "PROBLEM"), rows, colour)


def lease(v: LeaseView, colour: bool = False) -> str:
    if v.problem:
        return f"Lease: {v.namespace}/{v.name}\nProblem: {v.problem}\n"
    lines = [
        f"Lease: {v.namespace}/{v.name}",
        f"Owner: {v.owner}",
        f"Phase: {_paint(v.phase, colour)}",
        f"GPUs: desired {v.desired_gpus}, held {v.held_gpus}, lent {v.lent_gpus}",
        f"Target replicas: {_cell(v.target_replicas)}",
        f"Reclaims: {v.reclaims} (devices returned {v.returned}, backfilled from standby "
        f"{v.backfilled}); the last took "
        + ("-" if v.last_reclaim_seconds is None else f"{v.last_reclaim_seconds:g} s"),
    ]
    if v.reclaim_deadline:
        lines.append(f"Borrowers' notice ends: {v.reclaim_deadline}")
        lines.append(f"Given notice: {', '.join(v.noticed) or '-'}")
    lines.append("")
    rows = [(replica, b.device, b.node, b.pod) for replica, group in v.lent for b in group]
    lines.append(
        table(("REPLICA", "DEVICE", "NODE", "BORROWER"), rows, colour).rstrip("\n")
        if rows
        else "Lent devices: none"
    )
    return "\n".join(lines) + "\n"


def explain(e: Explanation, colour: bool = False) -> str:
    lines = [f"Pod: {e.pod}", f"Request: {e.request}"]
    if e.bound_to:
        lines.append(f"Bound to {e.bound_to}: nothing to explain.")
        return "\n".join(lines) + "\n"
    if e.invalid:
        lines.append(f"Not placed: {e.invalid}")
        return "\n".join(lines) + "\n"
    lines.append(f"Nodes that fit: {e.fitting} of {len(e.nodes)}")
    lines.append("")
    rows = [(n.node, n.verdict, n.score, n.reason) for n in e.nodes]
    lines.append(table(("NODE", "VERDICT", "SCORE", "REASON"), rows, colour).rstrip("\n"))
    return "\n".join(lines) + "\n"
