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
        "HA share start / daily peaks min-max / end",
        "fulfilment trough/peak",
        "reclaims full",
        "shortfall",
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
                f"{_pct(s.ha_start)} / {_pct(s.ha_min)}-{_pct(s.ha_max)} / {_pct(s.ha_end)}",
                f"{_pct(s.fulfilment_trough)} / {_pct(s.fulfilment_peak)}",
                met,
                str(s.shortfall) if s.reclaims else "-",
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
            "HA share: HA devices among the online jobs' GPUs (held, not on loan from standby, or "
            "lent with right of return), before lending (start) and at each day's online peak; "
            "cluster average "
            f"{_pct(summaries[0].cluster_ha)}."
        )
        lines.append(
            "fulfilment: GPUs held by borrowers / GPUs they ask, mean over the steps where the "
            "online demand is in its lowest (trough) and highest (peak) quarter."
        )
        lines.append(
            "reclaims full: every device asked back matched (itself, another own lent device, or "
            "standby on loan; same type, equal or better tier) within grace + 10 s; shortfall: "
            "devices asked back without a match."
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
        "full",
        "timely",
        "shortfall",
        "lost",
        "backfilled",
        "foreign",
        "forfeited",
    ]
    rows = [
        [
            f"{p.size} ({100 * p.size / total_gpus:.2f}%)" if total_gpus else str(p.size),
            f"{p.reclaims:,}",
            f"{100 * p.ratio:.2f}%",
            f"{p.timely:,}",
            str(p.shortfall),
            str(p.lost),
            f"{p.backfilled:,}",
            f"{p.foreign:,}",
            str(p.forfeited),
        ]
        for p in sizing.points
    ]
    lines = [
        f"Standby pool sizing (right of return; target: >= {100 * sizing.target:g}% of reclaims "
        "full under the failure model)",
        *_table(header, rows),
        "timely: done within grace + 10 s; shortfall: devices asked back without a match; lost: "
        "asked back but unhealthy; backfilled: standby devices taken on loan; foreign: other "
        "devices taken; forfeited: asked back, neither back nor still lent.",
    ]
    if sizing.answer is None:
        largest = max((p.size for p in sizing.points), default=0)
        lines.append(f"No standby pool up to {largest} GPUs meets the target.")
    else:
        share = sizing.answer / total_gpus if total_gpus else 0.0
        larger = [p.size for p in sizing.points if p.size > sizing.answer]
        confirmed = (
            f"the next size swept, {min(larger)}, meets it too"
            if larger
            else "the largest size swept: none larger confirms it"
        )
        lines.append(
            f"Smallest standby pool meeting the target: {sizing.answer} GPUs "
            f"({100 * share:.2f}% of the cluster; {confirmed})."
        )
    return "\n".join(lines)


def findings(summaries: Sequence[Summary], sizing: Sizing | None, total_gpus: int) -> str:
    """The results in words: weflex figures 14 and 10, and the standby answer."""
    by = {s.policy: s for s in summaries}
    lines = ["Findings:"]
    ror, nor, nos = by.get("right-of-return"), by.get("no-return"), by.get("no-scaling")
    if summaries:
        s0 = summaries[0]
        parts = [f"pre-lease {_pct(s0.ha_start)}, cluster average {_pct(s0.cluster_ha)}"]
        if ror is not None:
            parts.append(
                f"right of return {_pct(ror.ha_min)}-{_pct(ror.ha_max)} at the daily peaks "
                f"(at most {100 * ror.ha_drift:.2f} pp off, {100 * ror.ha_steps_drift:.2f} pp "
                "at any step)"
            )
        if nor is not None:
            parts.append(
                f"no return drifts to {_pct(nor.ha_end)} ({100 * (nor.ha_end - nor.ha_start):+.1f} "
                f"pp; {_pct(nor.ha_min)} at its lowest daily peak)"
            )
        if nos is not None:
            parts.append(f"no scaling {_pct(nos.ha_end)}")
        lines.append("  fig. 14, HA share of the online jobs' GPUs: " + "; ".join(parts) + ".")
    if ror is not None or nor is not None:
        leased = ror or nor
        assert leased is not None
        text = (
            f"  fig. 10, borrowers' fulfilment: {_pct(leased.fulfilment_trough)} in the online "
            f"troughs against {_pct(leased.fulfilment_peak)} at the online peaks "
            f"({100 * (leased.fulfilment_trough - leased.fulfilment_peak):+.1f} pp, "
            f"{leased.policy})"
        )
        if nos is not None:
            text += f"; {_pct(nos.fulfilment_mean)} throughout without elastic scaling"
        lines.append(text + ".")
    if ror is not None and ror.reclaims:
        lines.append(
            f"  reclaims: {100 * ror.reclaims_full_ratio:.2f}% of {ror.reclaims:,} full with "
            f"{ror.standby_gpus} standby GPUs."
        )
    if sizing is not None:
        if sizing.answer is None:
            largest = max((p.size for p in sizing.points), default=0)
            lines.append(
                f"  standby for >= {100 * sizing.target:g}% full reclaims: none up to {largest} "
                "GPUs."
            )
        else:
            lines.append(
                f"  standby for >= {100 * sizing.target:g}% full reclaims: {sizing.answer} GPUs "
                f"({100 * sizing.answer / max(1, total_gpus):.2f}% of {total_gpus:,})."
            )
    return "\n".join(lines)
