"""Figures of the planner's simulator (PNG, matplotlib's Agg canvas: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from common.errors import InvalidInput
from extender.plannersim.autoscalers import AutoscalerResult
from extender.plannersim.online import TRUE_MODEL, OnlineResult
from extender.plannersim.sharedpool import QueueResult
from extender.plannersim.traces import Trace

# matplotlib is the optional extra "plots": the images of the extender and the agent leave it out.
try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ModuleNotFoundError as e:
    raise InvalidInput(
        f"the planner's plots need matplotlib ({e}): pip install 'tidelease[plots]'"
    ) from e


def plot_online(trace: Trace, results: Sequence[OnlineResult], path: Path) -> Path:
    shown = [
        r for r in results
        if r.policy.startswith("forecast planner") or r.policy.startswith("threshold")
    ]  # fmt: skip
    title = "Evaluated week of the embedded tidal trace (Mon-Sun, UTC)"
    return _week(trace, title, results, shown, "capacity", path)


def plot_autoscalers(trace: Trace, results: Sequence[AutoscalerResult], path: Path) -> Path:
    """The autoscaler comparison: traffic and capacity, GPUs held, lag against the 20-minute SLO."""
    title = "Kale comparison: the evaluated week (Mon-Sun, UTC)"
    return _week(trace, title, results, results[:2], "capacity held", path)


def _week(
    trace: Trace,
    title: str,
    results: Sequence[OnlineResult | AutoscalerResult],
    capacity_of: Sequence[OnlineResult | AutoscalerResult],
    capacity_label: str,
    path: Path,
) -> Path:
    """The evaluated week: traffic with the capacity of ``capacity_of``, GPUs held, lag."""
    fig = Figure(figsize=(12, 8), layout="constrained")
    FigureCanvasAgg(fig)
    rate = trace.rate[trace.eval_start :]
    days = np.arange(rate.size) / 1440.0
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    ax1.plot(days, rate / 1000, color="0.3", lw=0.6, label="traffic")
    ax1.set_ylabel("samples/s (k)")
    ax1.set_title(title)
    for r in capacity_of:
        capacity = np.array([TRUE_MODEL.predict(int(w)) for w in r.workers]) / 1000
        ax1.plot(days, capacity, lw=0.8, label=f"{capacity_label}: {r.policy}")
    for r in results:
        ax2.plot(days, r.workers, lw=0.8, label=r.policy)
        ax3.plot(days, r.lag_min, lw=0.8, label=r.policy)
    ax1.legend(loc="upper left", fontsize=8)
    ax2.set_ylabel("GPUs held")
    ax2.legend(loc="upper left", fontsize=8, ncol=2)
    ax3.axhline(20, color="red", ls="--", lw=0.8, label="SLO: 20 min")
    ax3.set_ylabel("lag (min)")
    ax3.set_xlabel("day of the week")
    ax3.legend(loc="upper left", fontsize=8, ncol=2)
    fig.savefig(path, dpi=110)
    return path


def plot_queues(results: Sequence[QueueResult], path: Path) -> Path:
    fig = Figure(figsize=(12, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    names = [r.policy for r in results]
    x = np.arange(len(names))
    ax1.bar(x, [r.interactive_queue_s / 60 for r in results], color="tab:orange")
    ax1.set_title("interactive queuing, mean (min)")
    ax2.bar(x - 0.2, [r.jct_s / 3600 for r in results], 0.4, label="all jobs")
    ax2.bar(x + 0.2, [r.batch_jct_s / 3600 for r in results], 0.4, label="batch")
    ax2.set_title("mean JCT (h)")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.set_xticks(x, names, fontsize=8)
    for r in results:
        ax3.plot(np.arange(len(r.busy)) / 6.0, r.busy, lw=0.8, label=r.policy)
    ax3.set_title("GPUs in use (of 64)")
    ax3.set_xlabel("hours")
    ax3.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path
