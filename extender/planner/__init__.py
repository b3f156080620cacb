"""The live elastic planner (Kale): traffic forecast, throughput model, stabilised
plan, and the controller that steers each opted-in GpuLease."""
