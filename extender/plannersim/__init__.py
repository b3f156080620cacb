"""How the elastic planner and the shared queues would do against their baselines: the planner's
simulator (``tidelease plan-simulate``), on tidal traces.

The policies are the live code's: the forecast planner is
:func:`extender.planner.autoscaling.plan_online` over :mod:`extender.planner.forecasting` and a
fitted :mod:`extender.planner.throughput` model; the shared queues are
:mod:`extender.queues.mlfq`, :mod:`extender.queues.allocation` and
:mod:`extender.queues.preemptionorder`. What the simulator adds is the traffic, the jobs and the
baselines:

* :mod:`.traces` — the embedded tidal trace: three weeks of per-minute traffic;
* :mod:`.surges` — a daily tide with sharp rises, the autoscaler comparison's trace;
* :mod:`.hpa` — Kubernetes' HorizontalPodAutoscaler: its rules and defaults;
* :mod:`.online` — one online job, minute by minute: forecast planner vs threshold vs static;
* :mod:`.autoscalers` — the autoscaler comparison: forecast planner vs HPA vs static peak on a
  15-second clock, new workers useful only after the prelaunch window;
* :mod:`.sharedpool` — a shared GPU pool under the MLFQ policy, FIFO and strict priority;
* :mod:`.comparison` — all of it, measured in one run: tables, JSON and files;
* :mod:`.figures` — the PNGs;
* :mod:`.cli` — the command.

Only :mod:`.comparison`, :mod:`.figures` and :mod:`.cli` do I/O (files, clock, plots); the
modules that say they are pure are checked by tests/unit/test_layers.py. The autoscaler
comparison repeats the one in the paper the planner follows (forecast planner against the HPA);
the MLFQ policy (multi-level feedback queue) is the one of the paper the shared queues follow.
The leasing simulator is :mod:`extender.leasingsim`; neither imports the other.

Reference: kale (autoscaler comparison), cornucopia (MLFQ policy) (docs/references.md).
"""
