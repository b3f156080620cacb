"""Topology-aware orchestration (commands that respect the roles of a job's pods and the order they
must start in): a framework's YAML dependency file becomes a DAG of commands; commands are issued
into the job's pods only once their preconditions hold, exactly once, with capped exponential
backoff; elastic Horovod jobs get a ``discover_hosts`` script kept current from their ready workers.
docs/orchestration.md describes the format and the controller.

Pure modules: :mod:`.depfile` (format and validation), :mod:`.graph` (DAG), :mod:`.snapshot`
(pod readiness by role), :mod:`.evaluation`, :mod:`.records`, :mod:`.backoff`,
:mod:`.rendering` and :mod:`.jobs`. Adapters: :mod:`.executing` (pods/exec),
:mod:`.storing` (records and host lists in the API server) and :mod:`.controller`.

Reference: weflex 3.4 (docs/references.md).
"""
