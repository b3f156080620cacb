"""Shared GPU queues (Cornucopia): the MLFQ of jobs, greedy allocation, the ramp-up
profiler, the jobs' view from their pods, and scaling-aware partial preemption on counts."""
