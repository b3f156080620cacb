"""Hot restart on the node: in-place restart of one container inside its existing pod sandbox,
so that the pod keeps its GPUs, IP and volumes. The control plane's side is the operator,
:mod:`extender.hotrestart`; the pod annotations between them are :mod:`common.hotrestartwire`.

- :mod:`.planning` (pure): the new container's configuration, pull decisions, the outcome record
  and its reasons.
- :mod:`.insandbox`: the direct CRI path for sandboxes without a kubelet: pre-pull, stop, remove,
  create, start, with rollback to the old configuration when a step after the stop fails.
- :mod:`.restartdecision` (pure): the pod annotation contract (request and status) and the node
  agent's decision for kubelet-managed pods.
- :mod:`.podwatch`: the node agent's loop for kubelet-managed pods: pre-pull through CRI, then
  patch the pod's image and let the kubelet restart the container in its sandbox.

Reference: weflex 3.3 (docs/references.md).
"""
