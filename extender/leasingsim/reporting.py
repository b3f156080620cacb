"""The printed report: what was simulated, a row per policy, and the standby sizing. Pure.

Each policy comes as its summaries, one per seed. With one seed every figure prints as it is;
with several, as the mean over the seeds ``±`` the half-width of its 95 % t interval
(:mod:`~extender.leasingsim.estimating`), and the standby answer with its interval.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from extender.leasingsim.estimating import LEVEL, Estimate, estimate
from extender.leasingsim.metrics import Summary, over_seeds
from extender.leasingsim.scenario import Scenario
from extender.leasingsim.sizing import CAP_SHARE, SizeEstimate, Sizing


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _n(count: int, thing: str) -> str:
    return f"{count:,} {thing}" + ("" if count == 1 else "s")


def _pe(e: Estimate, digits: int = 1) -> str:
    """A share over the seeds: ``74.0%``, or ``74.0% ±0.3`` (points) with several seeds."""
    text = f"{100 * e.mean:.{digits}f}%"
    return f"{text} ±{100 * e.half:.{digits}f}" if e.spread else text


def _ne(e: Estimate, fmt: str = ",.0f", spread_fmt: str | None = None) -> str:
    """A number over the seeds: ``213``, or ``212.7 ±4.1`` with several seeds."""
    if not e.spread:
        return format(e.mean, fmt)
    f = spread_fmt or fmt
    return f"{format(e.mean, f)} ±{format(e.half, f)}"


def _ci(e: Estimate, digits: int = 2) -> str:
    return f"[{100 * e.low:.{digits}f}%, {100 * e.high:.{digits}f}%]"


def _span(values: Sequence[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


def _seeds(seeds: Sequence[int]) -> str:
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{len(seeds)} seeds, {seeds[0]}-{seeds[-1]}"
    return f"{len(seeds)} seeds, " + ", ".join(str(k) for k in seeds)


def seeds_note(seeds: Sequence[int], level: float = LEVEL) -> str:
    """The line that says how to read figures over several seeds."""
    return (
        f"Figures over {_seeds(seeds)}: mean ±half-width of the {100 * level:g}% Student-t "
        "confidence interval of the mean over the seeds (tiers, tides, borrowers and failures "
        "drawn per seed)."
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def describe(scenarios: Scenario | Sequence[Scenario], seeds: int | Sequence[int]) -> str:
    """What was simulated; over several seeds, the counts that differ as ranges."""
    runs = [scenarios] if isinstance(scenarios, Scenario) else list(scenarios)
    chosen = [seeds] if isinstance(seeds, int) else list(seeds)
    nodes = runs[0].nodes
    gpus: Counter[str] = Counter()
    for n in nodes:
        gpus[n.gpu_type] += n.gpus
    trace = runs[0].trace
    peak = _span([sum(j.peak for j in r.trace.online) for r in runs])
    types = ", ".join(f"{t} {g:,}" for t, g in sorted(gpus.items(), key=lambda kv: -kv[1]))

    def counted(values: Sequence[int], thing: str) -> str:
        if min(values) == max(values):
            return _n(values[0], thing)
        return f"{_span(values)} {thing}s"

    return (
        f"cluster: {len(nodes):,} nodes, {sum(gpus.values()):,} GPUs ({types}); "
        f"trace: {trace.minutes / 1440:g} days in {trace.step}-minute steps, "
        f"{_n(len(trace.online), 'online job')} (peak {peak} GPUs), "
        f"{counted([len(r.trace.borrowers) for r in runs], 'borrower job')}, "
        f"{counted([len(r.failures) for r in runs], 'device failure')} "
        f"({_seeds(chosen)})"
    )


def _groups(summaries: Sequence[Summary] | Sequence[Sequence[Summary]]) -> list[list[Summary]]:
    """Per policy its summaries, one per seed (a flat list: one seed each)."""
    return [[s] if isinstance(s, Summary) else list(s) for s in summaries]


def policy_table(summaries: Sequence[Summary] | Sequence[Sequence[Summary]]) -> str:
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
    groups = _groups(summaries)
    for group in groups:
        s = group[0]

        def e(name: str, runs: list[Summary] = group) -> Estimate:
            return over_seeds(runs, name)

        reclaimed = any(r.reclaims for r in group)
        to = " to " if len(group) > 1 else "-"
        met = f"{_pe(e('reclaims_full_ratio'), 2)} of {_ne(e('reclaims'))}" if reclaimed else "-"
        rows.append(
            [
                s.policy,
                str(s.standby_gpus) if s.policy == "right-of-return" else "-",
                f"{_pe(e('ha_start'))} / {_pe(e('ha_min'))}{to}{_pe(e('ha_max'))} / "
                f"{_pe(e('ha_end'))}",
                f"{_pe(e('fulfilment_trough'))} / {_pe(e('fulfilment_peak'))}",
                met,
                _ne(e("shortfall"), ".0f", ".1f") if reclaimed else "-",
                _ne(e("gpu_hours_lent")),
                _ne(e("on_lent_gpu_hours")),
                _pe(e("utilisation")),
                _ne(e("evictions")),
                f"{e('elapsed_s').mean:.1f}",
                f"{e('cpu_s').mean:.1f}",
            ]
        )
    lines = _table(header, rows)
    summaries = [g[0] for g in groups]
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
            "reclaims full: every device asked back matched in kind (itself, another own lent "
            "device, standby on loan or any other: same type, equal or better tier) within "
            "grace + 10 s; shortfall: devices asked back without a match."
        )
        lines.append(
            "GPU-h lent: held below the online peak; on lent: borrower GPU-hours on devices "
            "tagged for return; evictions: borrower pods evicted by reclaims and preemption; "
            "run s / cpu s: wall and CPU time of the simulation (one core each)"
            + ("; mean over the seeds." if len(groups[0]) > 1 else ".")
        )
    return "\n".join(lines)


def _size_label(size: int, total_gpus: int) -> str:
    return f"{size} ({100 * size / total_gpus:.2f}%)" if total_gpus else str(size)


def sizing_table(sizing: Sizing, total_gpus: int) -> str:
    several = sizing.seeds > 1
    header = [
        "standby GPUs",
        "reclaims",
        "full",
        *([f"full {100 * sizing.level:g}% CI"] if several else []),
        "timely",
        "shortfall",
        "lost",
        "backfilled",
        "foreign",
        "forfeited",
    ]
    rows = [
        [
            _size_label(p.size, total_gpus),
            _ne(p.of("reclaims")),
            _pe(p.full, 2),
            *([_ci(p.full)] if several else []),
            _ne(p.of("timely")),
            _ne(p.of("shortfall"), ".0f", ".1f"),
            _ne(p.of("lost"), ".0f", ".1f"),
            _ne(p.of("backfilled")),
            _ne(p.of("foreign"), ",.0f", ",.1f"),
            _ne(p.of("forfeited"), ".0f", ".1f"),
        ]
        for p in sizing.sizes
    ]
    title = (
        f"Standby pool sizing (right of return; target: >= {100 * sizing.target:g}% of reclaims "
        "full under the failure model"
    )
    if several:
        title += (
            f"; over {sizing.seeds} seeds a size meets it when the lower bound of its "
            f"{100 * sizing.level:g}% confidence interval does"
        )
    lines = [
        title + ")",
        *_table(header, rows),
        "timely: done within grace + 10 s; shortfall: devices asked back without a match; lost: "
        "asked back but unhealthy; backfilled: standby devices taken on loan; foreign: other "
        "devices taken; forfeited: asked back, neither back nor still lent.",
    ]
    if sizing.answer is None:
        text = f"No standby pool up to {sizing.largest} GPUs meets the target"
        best = _best(sizing.sizes)
        if several and best is not None:
            text += (
                f" (by the lower bound of its {100 * sizing.level:g}% interval); the highest "
                f"lower bound, {100 * best.full.low:.2f}%, is at {best.size} GPUs (full "
                f"{_pe(best.full, 2)}, {_ci(best.full)})"
            )
        lines.append(text + "." + _late(sizing) + _capped(sizing, total_gpus))
    else:
        share = sizing.answer / total_gpus if total_gpus else 0.0
        larger = [p.size for p in sizing.points if p.size > sizing.answer]
        confirmed = (
            f"the next size swept, {min(larger)}, meets it too"
            if larger
            else "the largest size swept: none larger confirms it"
        )
        if several:
            chosen = next(p for p in sizing.sizes if p.size == sizing.answer)
            lines.append(
                f"Smallest standby pool meeting the target with the lower bound of its "
                f"{100 * sizing.level:g}% interval over {sizing.seeds} seeds: {sizing.answer} GPUs "
                f"({100 * share:.2f}% of the cluster; full {_pe(chosen.full, 2)}, "
                f"{_ci(chosen.full)}; {confirmed})."
            )
        else:
            lines.append(
                f"Smallest standby pool meeting the target: {sizing.answer} GPUs "
                f"({100 * share:.2f}% of the cluster; {confirmed})."
            )
    nearest = sizing.nearest()
    if nearest is not None:
        lines.append(_more_seeds(sizing, nearest))
    return "\n".join(lines)


def _late(sizing: Sizing) -> str:
    """Where the largest size swept is short of no device, the reclaims it misses by are late:
    a larger pool does not make them timely."""
    largest = sizing.sizes[-1] if sizing.sizes else None
    if largest is None or any(p.shortfall for p in largest.points):
        return ""
    late = sum(p.reclaims - p.timely for p in largest.points)
    if not late:
        return ""
    return (
        f" At {largest.size} GPUs no device asked back is short: the reclaims it misses by "
        f"({late} over its runs) ended after their grace + 10 s, which no larger pool cures."
    )


def _capped(sizing: Sizing, total_gpus: int) -> str:
    """Why the sweep stopped without an answer, when it stopped at the default sweep's cap."""
    if not total_gpus or sizing.largest < CAP_SHARE * total_gpus:
        return ""
    return (
        f" The sweep stops at {100 * CAP_SHARE:g}% of the cluster: a standby device is one no "
        "borrower may use, and a larger pool would hold back as much as leases lend (17% of "
        "the built-in cluster); the answer is more than that."
    )


def _more_seeds(sizing: Sizing, size: SizeEstimate) -> str:
    """What more seeds could confirm: a smaller size whose mean meets the target."""
    text = (
        f"{size.size} GPUs meets the target on average (full {_pe(size.full, 2)}, "
        f"{_ci(size.full)}), but its interval over {sizing.seeds} seeds reaches below it"
    )
    need = size.seeds_to_meet(sizing.target)
    if need is None:
        return text + "; no number of seeds up to 100 would confirm it at this spread."
    return text + f"; about {need} seeds would confirm it if the spread holds (--seeds {need})."


def _best(sizes: Sequence[SizeEstimate]) -> SizeEstimate | None:
    """The size with the highest lower bound (the smallest of equals)."""
    return max(sizes, key=lambda p: (p.full.low, -p.size), default=None)


def _diff(e: Estimate) -> str:
    """A difference in points: ``+19.0 pp``, or ``+19.0 ±1.2 pp`` with several seeds."""
    text = f"{100 * e.mean:+.1f}"
    return f"{text} ±{100 * e.half:.1f} pp" if e.spread else f"{text} pp"


def _apart(ror: Estimate, nor: Estimate, level: float = LEVEL) -> str:
    """Whether right of return's end share and no return's differ beyond their intervals."""
    apart = ror.low > nor.high or nor.low > ror.high
    verdict = "do not overlap: the difference is significant" if apart else "overlap"
    return (
        f"at the end, right of return {_ci(ror, 1)} against no return {_ci(nor, 1)}: the "
        f"{100 * level:g}% intervals {verdict}."
    )


def findings(
    summaries: Sequence[Summary] | Sequence[Sequence[Summary]],
    sizing: Sizing | None,
    total_gpus: int,
) -> str:
    """The results in words: the online jobs' HA share by policy, the borrowers' fulfilment in
    the online troughs and peaks (the report's "fig. 14" and "fig. 10" lines: weflex figures 14
    and 10), the reclaims, and the standby answer."""
    groups = _groups(summaries)
    by = {g[0].policy: g for g in groups}
    lines = ["Findings:"]
    ror, nor, nos = by.get("right-of-return"), by.get("no-return"), by.get("no-scaling")
    tiers = by.get("tiers-no-tags")

    def e(group: list[Summary], name: str) -> Estimate:
        return over_seeds(group, name)

    def diff(group: list[Summary], a: str, b: str) -> Estimate:
        return estimate([getattr(s, a) - getattr(s, b) for s in group])

    if groups:
        g0 = groups[0]
        parts = [f"pre-lease {_pe(e(g0, 'ha_start'))}, cluster average {_pe(e(g0, 'cluster_ha'))}"]
        if ror is not None:
            to = " to " if len(ror) > 1 else "-"
            parts.append(
                f"right of return {_pe(e(ror, 'ha_min'))}{to}{_pe(e(ror, 'ha_max'))} at the daily "
                f"peaks (at most {100 * max(s.ha_drift for s in ror):.2f} pp off, "
                f"{100 * max(s.ha_steps_drift for s in ror):.2f} pp at any step)"
            )
        if nor is not None:
            drift = _diff(diff(nor, "ha_end", "ha_start"))
            off = _diff(diff(nor, "ha_end", "cluster_ha"))
            parts.append(
                f"no return (plain kube-scheduler) ends at {_pe(e(nor, 'ha_end'))} ({drift}; "
                f"{off} from the cluster average; {_pe(e(nor, 'ha_min'))} at its lowest daily "
                "peak)"
            )
        if tiers is not None:
            parts.append(f"tiers without tags ends at {_pe(e(tiers, 'ha_end'))}")
        if nos is not None:
            parts.append(f"no scaling {_pe(e(nos, 'ha_end'))}")
        lines.append("  fig. 14, HA share of the online jobs' GPUs: " + "; ".join(parts) + ".")
        if ror is not None and nor is not None and len(ror) > 1 and len(nor) > 1:
            lines.append("  " + _apart(e(ror, "ha_end"), e(nor, "ha_end")))
    if ror is not None or nor is not None:
        leased = ror or nor
        assert leased is not None
        gap = diff(leased, "fulfilment_trough", "fulfilment_peak")
        text = (
            f"  fig. 10, borrowers' fulfilment: {_pe(e(leased, 'fulfilment_trough'))} in the "
            f"online troughs against {_pe(e(leased, 'fulfilment_peak'))} at the online peaks "
            f"({_diff(gap)}, {leased[0].policy})"
        )
        if nos is not None:
            text += f"; {_pe(e(nos, 'fulfilment_mean'))} throughout without elastic scaling"
        lines.append(text + ".")
    if ror is not None and any(s.reclaims for s in ror):
        lines.append(
            f"  reclaims: {_pe(e(ror, 'reclaims_full_ratio'), 2)} of {_ne(e(ror, 'reclaims'))} "
            f"full with {ror[0].standby_gpus} standby GPUs."
        )
    if sizing is not None:
        several = sizing.seeds > 1
        how = (
            f" (lower bound of the {100 * sizing.level:g}% interval over {sizing.seeds} seeds)"
            if several
            else ""
        )
        if sizing.answer is None:
            text = (
                f"  standby for >= {100 * sizing.target:g}% full reclaims{how}: more than "
                f"{sizing.largest} GPUs"
            )
            best = _best(sizing.sizes)
            if several and best is not None:
                text += f"; best: {best.size} GPUs, full {_pe(best.full, 2)} {_ci(best.full)}"
            lines.append(text + ".")
        else:
            text = (
                f"  standby for >= {100 * sizing.target:g}% full reclaims{how}: {sizing.answer} "
                f"GPUs ({100 * sizing.answer / max(1, total_gpus):.2f}% of {total_gpus:,}"
            )
            if several:
                chosen = next(p for p in sizing.sizes if p.size == sizing.answer)
                text += f"; full {_pe(chosen.full, 2)} {_ci(chosen.full)}"
            lines.append(text + ").")
    return "\n".join(lines)
