"""The elastic planner (docs/planner.md): how many GPUs each job should hold, and from whom to
take them.

Online jobs (kale 3.2-3.4): :mod:`forecasting` (traffic), :mod:`throughput` (NNLS fit of the
resource-throughput model), :mod:`stabilizing` (Algorithm 1), :mod:`autoscaling` (the plan with
its lag fallback) and :mod:`directives` (the GpuLease spec change the leasing controller applies).

Shared queues (cornucopia 4): :mod:`jobclasses` (annotations), :mod:`mlfq` (three queues with
adaptive thresholds), :mod:`profiling` (ramp-up scaling factors), :mod:`allocation`
(Algorithm 2) and :mod:`preempting` (Algorithm 3 and the preempt-verb hook).

Every module above is pure. :mod:`traces`, :mod:`onlinesim`, :mod:`queuesim`,
:mod:`simulation`, :mod:`plotting` and :mod:`command` run the same functions on an embedded
tidal trace (``tidelease plan-simulate``).
"""
