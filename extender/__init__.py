"""The control plane: a kube-scheduler extender doing right-of-return GPU placement."""
