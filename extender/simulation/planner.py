"""Both halves of the planner on the embedded traces, measured in one run: tables and figures.

Online job: forecast planner vs a threshold (HPA-like) policy vs static peak provisioning (and
the planner with kale's eq. 10 as written, without headroom). Shared queue: cornucopia vs FIFO
vs strict priority. ``tidelease plan-simulate`` (:mod:`command`) calls :func:`run`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from extender.planner.autoscaling import OnlineSettings
from extender.simulation.online import (
    OnlineResult,
    fitted_model,
    forecast_error,
    run_forecast,
    run_static,
    run_threshold,
)
from extender.simulation.queues import QueueResult, QueueSettings, run_all
from extender.simulation.traces import Trace, tidal_trace

# The settings of the published tables (docs/planner.md): W = 10 min, a 30 s re-form pause,
# tau = 30 min (kale fig. 5's upper value), 15 % headroom over the forecast.
ONLINE = OnlineSettings(
    step_s=300.0,
    horizon_steps=24,
    lead_s=600.0,
    pause_s=30.0,
    rho=1,
    tau_s=1800.0,
    max_workers=96,
    lag_threshold_s=120.0,
    drain_s=900.0,
    headroom=0.15,
)


@dataclass(frozen=True, slots=True)
class Report:
    trace: Trace
    online: tuple[OnlineResult, ...]
    reasons: dict[str, int]
    fit_theta: tuple[float, ...]
    fit_mape: float
    forecast_mape: float
    queues: tuple[QueueResult, ...]
    seconds: float


def run(seed: int = 7, settings: OnlineSettings = ONLINE) -> Report:
    started = time.monotonic()
    trace = tidal_trace(seed)
    fit = fitted_model(seed)
    forecast, reasons = run_forecast(trace, settings, fit.model)
    as_written, _ = run_forecast(trace, replace(settings, headroom=0.0), fit.model)
    short_tau, _ = run_forecast(trace, replace(settings, tau_s=600.0), fit.model)
    online = (
        forecast,
        replace(short_tau, policy="forecast, tau = 10 min"),
        replace(as_written, policy="forecast, no headroom"),
        run_threshold(trace, settings, fit.model),
        run_static(trace, settings, fit.model),
    )
    queues = run_all(seed, QueueSettings())
    return Report(
        trace=trace,
        online=online,
        reasons=reasons,
        fit_theta=fit.model.theta,
        fit_mape=fit.mape,
        forecast_mape=forecast_error(trace),
        queues=queues,
        seconds=time.monotonic() - started,
    )


def online_table(report: Report) -> str:
    rows = [
        "| policy | accumulated lag (min) | SLO violation (lag > 20 min) | max lag (min) "
        "| GPU hours | scaling actions | downtime (min) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report.online:
        rows.append(
            f"| {r.policy} | {r.accumulated_lag_min:,.0f} | {r.slo_violation * 100:.2f} % "
            f"| {float(r.lag_min.max()):.1f} | {r.gpu_hours:,.0f} | {r.actions} "
            f"| {r.downtime_min:.0f} |"
        )
    return "\n".join(rows)


def queue_table(report: Report) -> str:
    rows = [
        "| policy | interactive queuing, mean (s) | p95 (s) | mean JCT (min) "
        "| batch JCT (min) | interactive JCT (min) | GPUs taken / jobs evicted | utilisation |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for q in report.queues:
        rows.append(
            f"| {q.policy} | {q.interactive_queue_s:,.0f} | {q.interactive_queue_p95_s:,.0f} "
            f"| {q.jct_s / 60:,.0f} | {q.batch_jct_s / 60:,.0f} | {q.interactive_jct_s / 60:,.0f} "
            f"| {q.preemptions} | {q.utilisation * 100:.1f} % |"
        )
    return "\n".join(rows)


def summary(report: Report) -> str:
    theta = ", ".join(f"{t:.4g}" for t in report.fit_theta)
    return "\n".join(
        [
            "## Online job (one week after two of history)",
            "",
            online_table(report),
            "",
            f"NNLS fit (sync, eq. 6): θ = ({theta}), MAPE {report.fit_mape:.2f} %; "
            f"forecast MAPE one step ahead: {report.forecast_mape:.2f} %; "
            f"planner decisions: {report.reasons}",
            "",
            "## Shared queue (64 GPUs, 36 h of arrivals)",
            "",
            queue_table(report),
            "",
            f"run time: {report.seconds:.1f} s",
        ]
    )


def write(report: Report, out: Path) -> list[Path]:
    from extender.simulation.plannerplots import plot_online, plot_queues

    out.mkdir(parents=True, exist_ok=True)
    (out / "planner.md").write_text(summary(report) + "\n")
    data = {
        "online": [
            {
                "policy": r.policy,
                "accumulated_lag_min": r.accumulated_lag_min,
                "slo_violation": r.slo_violation,
                "gpu_hours": r.gpu_hours,
                "actions": r.actions,
                "downtime_min": r.downtime_min,
            }
            for r in report.online
        ],
        "queues": [
            {
                "policy": q.policy,
                "interactive_queue_s": q.interactive_queue_s,
                "interactive_queue_p95_s": q.interactive_queue_p95_s,
                "jct_s": q.jct_s,
                "batch_jct_s": q.batch_jct_s,
                "interactive_jct_s": q.interactive_jct_s,
                "preemptions": q.preemptions,
                "utilisation": q.utilisation,
            }
            for q in report.queues
        ],
        "seconds": report.seconds,
    }
    (out / "planner.json").write_text(json.dumps(data, indent=2) + "\n")
    return [
        out / "planner.md",
        out / "planner.json",
        plot_online(report.trace, report.online, out / "planner-online.png"),
        plot_queues(report.queues, out / "planner-queues.png"),
    ]
