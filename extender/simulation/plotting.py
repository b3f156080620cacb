"""PNG plots of a comparison: HA share, fulfilment, online demand against held GPUs, sizing.

Figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from common.errors import InvalidInput
from extender.simulation.simulating import RunResult
from extender.simulation.sizing import Sizing

# matplotlib is the optional extra "plots": the images of the extender and the agent leave it out.
try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ModuleNotFoundError as e:
    raise InvalidInput(
        f"the PNG plots need matplotlib ({e}): pip install 'tidelease[plots]', or pass"
        " --no-plots (the tables and summary.json are written without it)"
    ) from e

COLORS = {"right-of-return": "tab:green", "no-return": "tab:red", "no-scaling": "tab:gray"}


def _days(result: RunResult) -> list[float]:
    return [m / 1440.0 for m in result.series.minute]


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _label(r: RunResult) -> str:
    s = r.summary
    return f"{s.policy} (standby {s.standby_gpus})" if s.policy == "right-of-return" else s.policy


def ha_share(results: Sequence[RunResult], path: Path) -> Path:
    """weflex fig. 14: the HA share of the online jobs' GPUs at each day's online peak, per
    policy; for right of return also at every step (its GPUs are the same all day: held, on
    loan or lent), against the pre-lease share and the cluster's average."""
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    values: list[float] = []
    for r in sorted(results, key=lambda r: r.summary.policy == "right-of-return"):  # on top
        color = COLORS.get(r.summary.policy)
        days = _days(r)
        share = [100 * x for x in r.series.ha_share()]
        if r.summary.policy == "right-of-return":
            ax.plot(days, share, lw=0.7, alpha=0.5, color=color, label=f"{_label(r)}, every step")
            values.extend(share)
        peaks = r.series.daily_peaks()
        baseline = r.summary.policy == "no-scaling"
        ax.plot(
            [days[i] for i in peaks],
            [share[i] for i in peaks],
            marker="s" if baseline else "o",
            ms=4 if baseline else 6,
            ls="--" if baseline else "-",
            lw=1.0 if baseline else 1.8,
            color=color,
            label=f"{_label(r)}, at daily peaks",
        )
        values.extend(share[i] for i in peaks)
    if results:
        avg = 100 * results[0].summary.cluster_ha
        ax.axhline(avg, ls="--", color="black", lw=1, label=f"cluster average {avg:.1f}%")
        start = 100 * results[0].summary.ha_start
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


def fulfilment(results: Sequence[RunResult], path: Path) -> Path:
    """weflex fig. 10: borrowers' request fulfilment over time, against the online demand."""
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    if results:
        twin = ax.twinx()
        twin.fill_between(
            _days(results[0]),
            results[0].series.online_demand,
            color="tab:blue",
            alpha=0.12,
            lw=0,
        )
        twin.set_ylabel("online demand (GPUs, shaded)")
        twin.set_ylim(0, 1.05 * max(results[0].series.online_demand, default=1))
        ax.set_zorder(twin.get_zorder() + 1)
        ax.patch.set_visible(False)
    for r in results:
        s = r.summary
        ax.plot(
            _days(r),
            [100 * x for x in r.series.fulfilment()],
            lw=1.0,
            color=COLORS.get(s.policy),
            label=f"{_label(r)}: troughs {100 * s.fulfilment_trough:.0f}%, "
            f"peaks {100 * s.fulfilment_peak:.0f}%",
        )
    ax.set_xlabel("day")
    ax.set_ylabel("borrowers' fulfilment (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Borrowers' request fulfilment and the online tide (cf. weflex fig. 10)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def demand(results: Sequence[RunResult], path: Path) -> Path:
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    if results:
        ax.plot(
            _days(results[0]),
            results[0].series.online_demand,
            lw=1.6,
            color="tab:blue",
            label="online demand (trace)",
        )
    for r in results:
        ax.plot(
            _days(r),
            r.series.online_held,
            lw=0.9,
            color=COLORS.get(r.summary.policy),
            label=f"held: {_label(r)}",
        )
    ax.set_xlabel("day")
    ax.set_ylabel("GPUs")
    ax.set_title("Online demand and GPUs held by the online jobs")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def sizing(result: Sizing, path: Path) -> Path:
    fig = Figure(figsize=(6.5, 4))
    ax = fig.add_subplot()
    sizes = [p.size for p in result.points]
    ax.plot(sizes, [100 * p.ratio for p in result.points], marker="o", color="tab:green")
    ax.axhline(100 * result.target, ls="--", color="black", lw=1, label="target")
    if result.answer is not None:
        ax.axvline(result.answer, ls=":", color="tab:green", lw=1, label=f"{result.answer} GPUs")
    ax.set_xlabel("standby pool (GPUs)")
    ax.set_ylabel("reclaims full (%)")
    ax.set_title("Standby pool sizing")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def write_all(results: Sequence[RunResult], sweep: Sizing | None, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        ha_share(results, out / "ha_share.png"),
        fulfilment(results, out / "fulfilment.png"),
        demand(results, out / "online_demand.png"),
    ]
    if sweep is not None and sweep.points:
        paths.append(sizing(sweep, out / "standby_sizing.png"))
    return paths
