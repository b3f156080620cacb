"""Shared GPU queues for interactive and batch jobs: the multi-level feedback queue (MLFQ) of
jobs (interactive first, long runners demoted, starved jobs promoted), greedy allocation (free
GPUs one at a time to the job that speeds up most), the ramp-up profiler (a job's throughput at
each GPU count), the jobs' view from their pods, and scaling-aware partial preemption on counts
(GPUs taken from the jobs that lose least by giving them up, not whole jobs).

Reference: cornucopia (docs/references.md).
"""
