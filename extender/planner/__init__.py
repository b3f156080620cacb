"""The live elastic planner: it forecasts an online training job's traffic, works out the
fewest workers that keep up with it (throughput model), smooths out short-lived changes
(stabilised plan), and steers each opted-in GpuLease to that count ahead of time (controller).

Reference: kale (docs/references.md).
"""
