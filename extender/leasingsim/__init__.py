"""What lending with right of return yields on a cluster, and how large the standby pool must be:
a trace-driven cluster simulator that decides through the extender's own policy code
(``tidelease simulate``).

Nothing here re-implements a rule. Nodes are chosen by
:func:`extender.scheduler.filtering.filter_nodes` and
:func:`extender.scheduler.scoring.prioritize_nodes` over a
:class:`extender.cluster.state.ClusterState` (as kube-scheduler with the extender would), devices
by :func:`extender.scheduler.placement.pick_devices`, victims by
:func:`extender.scheduler.victims.choose_victims`; the leasing controller's every step (lend,
tag, scale, notice, evict, clear tags) is :func:`extender.leasing.decisions.decide`, executed on
the simulated world (:func:`extender.leasing.execution.execute`), and the standby pool is topped
up by :func:`extender.rightofreturn.rules.standby_changes`. What the simulator adds is time,
load and bookkeeping:

* :mod:`.scenario` — typed inputs: the cluster description and the trace;
* :mod:`.tides` — the built-in 10,000-GPU cluster and two-week trace, generated from a seed;
* :mod:`.loading` — the admin's own cluster (YAML/JSON) and trace (YAML/JSON/CSV) files;
* :mod:`.clock` — simulated time and the event queue (no real sleeps);
* :mod:`.world` — devices, ledgers and pods, kept in step with a ``ClusterState``;
* :mod:`.scheduling` — kube-scheduler's cycle: filter, prioritize, bind, preempt;
* :mod:`.borrowers` — low-priority jobs: queue, placement, completion, eviction;
* :mod:`.controlling` — the online jobs' StatefulSets and GpuLeases, under each policy;
* :mod:`.tagging` — the leasing controller's tag check, kept up to date as devices change;
* :mod:`.simulating` — the loop that runs one policy over a scenario;
* :mod:`.metrics` — what is measured, per minute and per run;
* :mod:`.sizing` — the standby-pool sweep and its answer;
* :mod:`.estimating` — figures over several seeds: means and their confidence intervals;
* :mod:`.executing` — several runs in worker processes;
* :mod:`.reporting` — the table;
* :mod:`.plotting` — the PNGs;
* :mod:`.cli` — the command.

Only :mod:`.loading`, :mod:`.plotting`, :mod:`.executing` and :mod:`.cli` do I/O (files,
processes, plots); the modules that say they are pure are checked by tests/unit/test_layers.py.
The elastic planner's simulator is :mod:`extender.plannersim`; neither imports the other.
"""
