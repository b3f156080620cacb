"""A trace-driven cluster simulator that decides through the extender's own policy code.

Nothing here re-implements a rule. Nodes are chosen by
:func:`extender.scheduler.filtering.filter_nodes` and
:func:`extender.scheduler.scoring.prioritize_nodes` over a
:class:`extender.cluster.state.ClusterState` (as kube-scheduler with the extender would), devices
by :func:`extender.scheduler.placement.pick_devices`, victims by
:func:`extender.scheduler.preemption.choose_victims`; the leasing controller's every step (lend,
tag, scale, notice, evict, clear tags) is :func:`extender.leasing.decisions.decide`, executed on
the simulated world, and the standby pool is topped up by
:func:`extender.leasing.rules.standby_topup`. What the simulator adds is time, load and bookkeeping:

* :mod:`.scenario` — typed inputs: the cluster description and the trace;
* :mod:`.tides` — the built-in 10,000-GPU cluster and two-week trace, generated from a seed;
* :mod:`.loading` — the admin's own cluster (YAML/JSON) and trace (YAML/JSON/CSV) files;
* :mod:`.clock` — simulated time and the event queue (no real sleeps);
* :mod:`.world` — devices, ledgers and pods, kept in step with a ``ClusterState``;
* :mod:`.scheduling` — kube-scheduler's cycle: filter, prioritize, bind, preempt;
* :mod:`.borrowers` — low-priority jobs: queue, placement, completion, eviction;
* :mod:`.controlling` — the online jobs' StatefulSets and GpuLeases, under each policy;
* :mod:`.simulating` — the loop that runs one policy over a scenario;
* :mod:`.metrics`, :mod:`.sizing` — what is measured, and the standby-pool sweep;
* :mod:`.estimating` — figures over several seeds: means and their confidence intervals;
* :mod:`.executing` — several runs in worker processes;
* :mod:`.reporting`, :mod:`.plotting`, :mod:`.cli` — the table, the PNGs, the command.

The elastic planner's simulations (``tidelease plan-simulate``) live here too, on tidal traces
(:mod:`.traces` embedded, :mod:`.surges` generated with kale's sharp rises): :mod:`.online` (one
online job under the forecast planner and baselines, among them :mod:`.hpa`, Kubernetes' HPA
rules), :mod:`.queues` (the shared queues under cornucopia and two baselines), :mod:`.planner`
(all of it, measured in one run), :mod:`.plannerplots` and :mod:`.plannercli`.

Only :mod:`.loading`, :mod:`.plotting`, :mod:`.executing`, :mod:`.cli` and the planner's
:mod:`.planner`, :mod:`.plannerplots` and :mod:`.plannercli` do I/O (files, processes, plots);
the modules that say they are pure are checked by tests/unit/test_layers.py.
"""
