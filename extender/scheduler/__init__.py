"""The kube-scheduler extender proper: the wire format, the HTTP server, and the
filter, prioritize, bind and preempt decisions: which GPUs a pod may take, device by device
(lent devices back to their owner, standby devices only for reclaims).

Reference: weflex Algorithm 1 (docs/references.md).
"""
