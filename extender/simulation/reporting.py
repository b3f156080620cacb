"""The printed report: what was simulated, a row per policy, and the standby sizing. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from extender.simulation.metrics import Summary
from extender.simulation.scenario import Scenario
from extender.simulation.sizing import Sizing


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _n(count: int, thing: str) -> str:
    return f"{count:,} {thing}" + ("" if count == 1 else "s")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def describe(scenario: Scenario, seed: int) -> str:
    nodes = scenario.nodes
    gpus: Counter[str] = Counter()
    for n in nodes:
        gpus[n.gpu_type] += n.gpus
    trace = scenario.trace
    peak = sum(j.peak for j in trace.online)
    types = ", ".join(f"{t} {g:,}" for t, g in sorted(gpus.items(), key=lambda kv: -kv[1]))
    return (
        f"cluster: {len(nodes):,} nodes, {sum(gpus.values()):,} GPUs ({types}); "
        f"trace: {trace.minutes / 1440:g} days in {trace.step}-minute steps, "
        f"{_n(len(trace.online), 'online job')} (peak {peak:,} GPUs), "
        f"{_n(len(trace.borrowers), 'borrower job')}, "
        f"{_n(len(scenario.failures), 'device failure')} "
        f"(seed {seed})"
    )


def policy_table(summaries: Sequence[Summary]) -> str:
    header = [
        "policy",
        "standby",
        "HA share start/end/min",
        "fulfilment trough/peak",
        "reclaims fully met",
        "shortfall",
        "forfeited",
        "GPU-h lent",
        "on lent",
        "utilisation",
        "evictions",
        "run s",
        "cpu s",
    ]
    rows = []
    for s in summaries:
        met = f"{100 * s.reclaims_full_ratio:.2f}% of {s.reclaims:,}" if s.reclaims else "-"
        rows.append(
            [
                s.policy,
                str(s.standby_gpus) if s.policy == "right-of-return" else "-",
                f"{_pct(s.ha_start)} / {_pct(s.ha_end)} / {_pct(s.ha_min)}",
                f"{_pct(s.fulfilment_trough)} / {_pct(s.fulfilment_peak)}",
                met,
                str(s.shortfall) if s.reclaims else "-",
                f"{s.forfeited:,}" if s.reclaims else "-",
                f"{s.gpu_hours_lent:,.0f}",
                f"{s.on_lent_gpu_hours:,.0f}",
                _pct(s.utilisation),
                f"{s.evictions:,}",
                f"{s.elapsed_s:.1f}",
                f"{s.cpu_s:.1f}",
            ]
        )
    lines = _table(header, rows)
    if summaries:
        lines.append(
            f"HA share: of the GPUs the online jobs hold, at the start (pre-lease) and at each "
            f"day's peak (end: the last; min: the lowest); cluster average "
            f"{_pct(summaries[0].cluster_ha)}."
        )
        lines.append(
            "fulfilment: GPUs held by borrowers / GPUs they ask, mean over the steps where the "
            "online demand is in its lowest (trough) and highest (peak) quarter."
        )
        lines.append(
            "reclaims fully met: as many lent devices back (or standby stand-ins) as the new "
            "replicas hold; shortfall: devices missing; forfeited: lent devices untagged "
            "without coming back."
        )
        lines.append(
            "GPU-h lent: held below the online peak; on lent: borrower GPU-hours on devices "
            "tagged for return; evictions: borrower pods evicted by reclaims and preemption; "
            "run s / cpu s: wall and CPU time of the simulation (one core each)."
        )
    return "\n".join(lines)


def sizing_table(sizing: Sizing, total_gpus: int) -> str:
    header = [
        "standby GPUs",
        "reclaims",
        "fully met",
        "shortfall",
        "lost",
        "backfilled",
        "forfeited",
    ]
    rows = [
        [
            str(p.size),
            f"{p.reclaims:,}",
            f"{100 * p.ratio:.2f}%",
            str(p.shortfall),
            str(p.lost),
            str(p.backfilled),
            f"{p.forfeited:,}",
        ]
        for p in sizing.points
    ]
    lines = [
        f"Standby pool sizing (right of return; target: >= {100 * sizing.target:g}% of reclaims "
        "fully met under the failure model)",
        *_table(header, rows),
        "shortfall: devices due back that neither came back nor had a standby stand-in; lost: "
        "lent devices that failed before the reclaim; backfilled: standby devices given; "
        "forfeited: lent devices whose tag a reclaim cleared without their coming back.",
    ]
    if sizing.answer is None:
        largest = max((p.size for p in sizing.points), default=0)
        lines.append(f"No standby pool up to {largest} GPUs meets the target.")
    else:
        share = sizing.answer / total_gpus if total_gpus else 0.0
        lines.append(
            f"Smallest standby pool meeting the target: {sizing.answer} GPUs "
            f"({100 * share:.1f}% of the cluster)."
        )
    return "\n".join(lines)
