"""PNG plots of a comparison: HA share, fulfilment, online demand against held GPUs, sizing.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, no display). Each
policy comes as its runs, one per seed; with several seeds a line is the mean over the seeds
and the shaded band around it the 95 % t interval of that mean
(:mod:`~extender.leasingsim.estimating`), step by step (or day by day, or size by size).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from common.errors import InvalidInput
from extender.leasingsim.estimating import band
from extender.leasingsim.simulating import RunResult
from extender.leasingsim.sizing import Sizing

# matplotlib is the optional extra "plots": the images of the extender and the agent leave it out.
try:
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ModuleNotFoundError as e:
    raise InvalidInput(
        f"the PNG plots need matplotlib ({e}): pip install 'tidelease[plots]', or pass"
        " --no-plots (the tables and summary.json are written without it)"
    ) from e

COLORS = {
    "right-of-return": "tab:green",
    "no-return": "tab:red",
    "tiers-no-tags": "tab:orange",
    "no-scaling": "tab:gray",
}


Runs = Sequence[RunResult]  # one policy's runs, one per seed


def _groups(results: Sequence[RunResult] | Sequence[Runs]) -> list[list[RunResult]]:
    return [[r] if isinstance(r, RunResult) else list(r) for r in results]


def _days(result: RunResult) -> list[float]:
    return [m / 1440.0 for m in result.series.minute]


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _label(runs: Runs) -> str:
    s = runs[0].summary
    name = f"{s.policy} (standby {s.standby_gpus})" if s.policy == "right-of-return" else s.policy
    return name if len(runs) == 1 else f"{name}, mean of {len(runs)} seeds"


def _mean_band(
    ax: Axes,
    x: Sequence[float],
    rows: Sequence[Sequence[float]],
    color: str | None,
    **line: object,
) -> list[float]:
    """The mean of ``rows`` (one per seed) as a line, with its interval as a band when there
    are several; the values drawn (for the axis limits)."""
    mean, low, high = band(rows)
    ax.plot(x, mean, color=color, **line)  # type: ignore[arg-type]
    if len(rows) > 1:
        ax.fill_between(x, low, high, color=color, alpha=0.2, lw=0)
        return [*low.tolist(), *high.tolist()]
    return list(mean.tolist())


def ha_share(results: Sequence[RunResult] | Sequence[Runs], path: Path) -> Path:
    """The HA share of the online jobs' GPUs at each day's online peak, per policy; for right
    of return also at every step (its GPUs are the same all day: held, on loan or lent),
    against the pre-lease share and the cluster's average (as weflex fig. 14 plots it)."""
    groups = _groups(results)
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    values: list[float] = []
    for runs in sorted(groups, key=lambda g: g[0].summary.policy == "right-of-return"):  # on top
        first = runs[0]
        color = COLORS.get(first.summary.policy)
        days = _days(first)
        shares = [[100 * x for x in r.series.ha_share()] for r in runs]
        if first.summary.policy == "right-of-return":
            values.extend(
                _mean_band(
                    ax, days, shares, color, lw=0.7, alpha=0.5, label=f"{_label(runs)}, every step"
                )
            )
        peaks = [r.series.daily_peaks() for r in runs]
        count = min(len(p) for p in peaks)
        baseline = first.summary.policy == "no-scaling"
        values.extend(
            _mean_band(
                ax,
                [days[i] for i in peaks[0][:count]],
                [[share[i] for i in p[:count]] for share, p in zip(shares, peaks, strict=True)],
                color,
                marker="s" if baseline else "o",
                ms=4 if baseline else 6,
                ls="--" if baseline else "-",
                lw=1.0 if baseline else 1.8,
                label=f"{_label(runs)}, at daily peaks",
            )
        )
    if groups:
        summaries = [r.summary for r in groups[0]]
        avg = 100 * sum(s.cluster_ha for s in summaries) / len(summaries)
        ax.axhline(avg, ls="--", color="black", lw=1, label=f"cluster average {avg:.1f}%")
        start = 100 * sum(s.ha_start for s in summaries) / len(summaries)
        ax.axhline(start, ls=":", color="tab:blue", lw=1, label=f"pre-lease {start:.1f}%")
        values.extend((avg, start))
        ax.set_ylim(min(values) - 1.5, max(values) + 1.5)
    ax.set_xlabel("day")
    ax.set_ylabel("HA share of the online jobs' GPUs (%)")
    ax.set_title(
        "HA share of the online jobs' GPUs, with and without right of return (cf. weflex fig. 14)"
    )
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def fulfilment(results: Sequence[RunResult] | Sequence[Runs], path: Path) -> Path:
    """Borrowers' request fulfilment over time, against the online demand (as weflex fig. 10
    plots it)."""
    groups = _groups(results)
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    if groups:
        twin = ax.twinx()
        demand, _, _ = band([r.series.online_demand for r in groups[0]])
        twin.fill_between(_days(groups[0][0]), demand, color="tab:blue", alpha=0.12, lw=0)
        twin.set_ylabel("online demand (GPUs, shaded)" + (", mean" if len(groups[0]) > 1 else ""))
        twin.set_ylim(0, 1.05 * max(demand.tolist(), default=1))
        ax.set_zorder(twin.get_zorder() + 1)
        ax.patch.set_visible(False)
    for runs in groups:
        n = len(runs)
        trough = 100 * sum(r.summary.fulfilment_trough for r in runs) / n
        peak = 100 * sum(r.summary.fulfilment_peak for r in runs) / n
        _mean_band(
            ax,
            _days(runs[0]),
            [[100 * x for x in r.series.fulfilment()] for r in runs],
            COLORS.get(runs[0].summary.policy),
            lw=1.0,
            label=f"{_label(runs)}: troughs {trough:.0f}%, peaks {peak:.0f}%",
        )
    ax.set_xlabel("day")
    ax.set_ylabel("borrowers' fulfilment (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Borrowers' request fulfilment and the online tide (cf. weflex fig. 10)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def demand(results: Sequence[RunResult] | Sequence[Runs], path: Path) -> Path:
    groups = _groups(results)
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    if groups:
        several = len(groups[0]) > 1
        _mean_band(
            ax,
            _days(groups[0][0]),
            [r.series.online_demand for r in groups[0]],
            "tab:blue",
            lw=1.6,
            label="online demand (trace" + (", mean of the seeds)" if several else ")"),
        )
    for runs in groups:
        _mean_band(
            ax,
            _days(runs[0]),
            [r.series.online_held for r in runs],
            COLORS.get(runs[0].summary.policy),
            lw=0.9,
            label=f"held: {_label(runs)}",
        )
    ax.set_xlabel("day")
    ax.set_ylabel("GPUs")
    ax.set_title("Online demand and GPUs held by the online jobs")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def sizing(result: Sizing, path: Path) -> Path:
    """Full reclaims against the standby pool's size; over several seeds the mean, its
    interval as a band, each seed's share as a dot, and the answer by the lower bound."""
    fig = Figure(figsize=(6.5, 4))
    ax = fig.add_subplot()
    sizes = result.sizes
    x = [p.size for p in sizes]
    several = result.seeds > 1
    ax.plot(
        x,
        [100 * p.full.mean for p in sizes],
        marker="o",
        color="tab:green",
        label=f"mean of {result.seeds} seeds" if several else None,
    )
    if several:
        ax.fill_between(
            x,
            [100 * p.full.low for p in sizes],
            [100 * p.full.high for p in sizes],
            color="tab:green",
            alpha=0.2,
            lw=0,
            label=f"{100 * result.level:g}% confidence interval",
        )
        ax.scatter(
            [p.size for p in result.points],
            [100 * p.ratio for p in result.points],
            s=10,
            color="tab:gray",
            alpha=0.7,
            label="one seed",
            zorder=3,
        )
    ax.axhline(100 * result.target, ls="--", color="black", lw=1, label="target")
    if result.answer is not None:
        ax.axvline(result.answer, ls=":", color="tab:green", lw=1, label=f"{result.answer} GPUs")
    ax.set_xlabel("standby pool (GPUs)")
    ax.set_ylabel("reclaims full (%)")
    ax.set_title("Standby pool sizing" + (f" over {result.seeds} seeds" if several else ""))
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def write_all(
    results: Sequence[RunResult] | Sequence[Runs], sweep: Sizing | None, out: Path
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        ha_share(results, out / "ha_share.png"),
        fulfilment(results, out / "fulfilment.png"),
        demand(results, out / "online_demand.png"),
    ]
    if sweep is not None and sweep.points:
        paths.append(sizing(sweep, out / "standby_sizing.png"))
    return paths
