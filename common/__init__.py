"""The ground floor: what the extender and the node agent share, and what sits below every one of
the extender's packages.

Shared by both sides: the object and annotation contract (``contract``, ``model``, ``objects``,
``builders``, ``topology``: how a node's GPUs are connected), the formats on the wire between
control plane and node (``heartbeat``, ``hotrestartwire``, ``hotrestartpods``, ``prewarmwire``,
``deviceattributes``, ``checkpointref``, ``availability``), the API client and its loops
(``kubeclient``, ``watches``, ``reconcile``, ``waiting``, ``events``, ``conditions``,
``timefmt``), the bounded HTTP listener and who may call it (``httpserving``,
``delegatedauth``, ``reviewcache``), settings, errors, logging and the ``tidelease`` command
(``coercion``, ``errors``, ``logsetup``, ``cli``).

Below all of the extender's packages, used by the control plane only, here because several of
its packages (and the chart's generators, hack/ and the tests) read them and none of those
packages is low enough to hold them:

* ``tenancy``: who may do what among tenants (owners are namespaced jobs, grants from the admin);
* ``podrequest``: a Pod as the scheduler and the controllers read it;
* ``annotationrules`` and ``admissionpolicy``: the pod authors' annotation rules, and the chart's
  admission policies written from them (``python -m common.admissionpolicy``);
* ``jobclasses``, ``queuerelease``, ``keyfile``: the shared queues' job classes and their
  release proof, with its key;
* ``queryscope``: tenants' PromQL scoped to their namespace (the planner, the queues);
* ``prelaunch``: a node's prelaunch window (the prewarm controller, the planner);
* ``leaderelection``: leader election for the controllers and the orchestrator;
* ``certificates``: the extender's TLS certificates, made and renewed in the cluster.
"""
