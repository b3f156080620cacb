"""Prewarming ahead of a scale-up: the pure plan (which nodes fetch what, when) and the
controller that writes it into the GpuNodes."""
