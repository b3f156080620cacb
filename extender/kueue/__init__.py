"""tidelease with Kueue (issue 37): lent GPUs as capacity Kueue admits into, through an
admission check; :mod:`extender.kueue.capacity` decides whether the GPUs lent now can hold a
workload."""
