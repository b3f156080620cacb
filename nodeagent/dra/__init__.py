"""Dynamic Resource Allocation (DRA) on the node: the kubelet plugin of tidelease's GPU driver.

The kubelet calls the plugin (``kubeletplugin.py``; the DRA v1 and plugin registration protos,
generated modules from ``hack/gen-proto.sh``) to prepare the ResourceClaims of a pod before its
containers start: the plugin reads each claim (``claims.py``), decides which of the node's GPUs
it gives and how (``preparing.py``, pure), writes a CDI spec the container runtime injects
(``cdi.py``) and checkpoints what it prepared. Run it with
:func:`nodeagent.dra.kubeletplugin.run_kubelet_plugin`.
"""
