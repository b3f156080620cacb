"""The node agent (DaemonSet on GPU nodes): NVML health and availability tiers, the device plugin
that honours the extender's device choice, hot restarts and the peer checkpoint cache.

Not yet built: the extender reads the ``GpuNode`` objects this agent is to publish (see
``common.objects``); until then they are written by hand, by the demo or by tests.
"""
