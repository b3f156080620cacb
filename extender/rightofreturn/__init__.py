"""Right of return: the GpuLease object (:mod:`.lease`), the pure rules of lending and taking
back (:mod:`.rules`: targets, which replicas go, which devices are tagged, whether a lent device
can come back, the standby pool) and which workloads name their replicas (:mod:`.replicas`).

The bottom of the control plane's right of return: the cluster view, the scheduler, the leasing
controller, prewarm, the planner and the simulator all read leases and decide through these, so
there is one reading of a GpuLease and one implementation of every rule. Imports only common.
"""
