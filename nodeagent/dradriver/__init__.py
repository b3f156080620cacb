"""tidelease's DRA driver on the node (Dynamic Resource Allocation, driver ``gpu.tidelease.io``):
the node's ResourceSlice, mirrored from its GpuNode (``slices.py``), and the kubelet plugin
that prepares the GPUs the kubelet's ResourceClaims got.

The kubelet calls the plugin (``kubeletplugin.py``; the DRA v1 and plugin registration protos,
generated modules from ``hack/gen-proto.sh``) to prepare the ResourceClaims of a pod before its
containers start: the plugin reads each claim (``claims.py``), decides which of the node's GPUs
it gives and how (``preparing.py``, pure), writes a CDI spec the container runtime injects
(``cdi.py``) and checkpoints what it prepared. Run it with
:func:`nodeagent.dradriver.kubeletplugin.run_kubelet_plugin`.
"""
