"""Leasing and right of return: the GpuLease object, the pure rules and decisions,
and the controller that carries them out against the API server."""
