"""Node agent cost: CPU time per health cycle for 8 devices, and resident memory.

Runs the agent's own reading and decision code (NvmlReader over the NVML fake, the health
tracker, availability accounting, and building the GpuNode status it publishes) for many
cycles, and reports CPU time per cycle and per device-cycle, against a baseline measured in the
same run: the same number of bare NVML fake calls, without the agent's logic. The fake answers
in microseconds where a driver takes tens to hundreds, so the figure is the agent's own cost.

    python -m benchmarks.bench_agent [--cycles 2000] [--devices 8] [--live-s 10] [--smoke]

``--smoke``: 600 cycles (one injected fault) and 1 s of the live agent, to check that the
benchmark still works.

Targets (issue 4): < 50 ms CPU per device-cycle, < 150 MiB RSS.
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import time

from nodeagent.agent import AgentSettings, NodeView
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, full_gpu


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


LIVE = """
import asyncio, resource, sys, time
import common.cli, common.kubeclient, grpc  # everything the agent process loads
from nodeagent.agent import AgentSettings, run_agent
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, full_gpu
from nodeagent.publishing import MemoryPublisher

async def main(seconds, cycle):
    pub = MemoryPublisher()
    s = AgentSettings(node="bench", cycle_s=cycle, heartbeat_s=1.0)
    task = asyncio.create_task(run_agent(reader=NvmlReader(FakeNvml()), publisher=pub,
                                         settings=s))
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return len(pub.statuses)

cpu0 = time.process_time()
asyncio.run(main(float(sys.argv[1]), float(sys.argv[2])))
used = time.process_time() - cpu0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{used:.3f} {peak:.1f}")
"""


def live(seconds: float, cycle_s: float) -> None:
    """The whole agent loop in its own process (fake NVML, publishing kept in memory)."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", LIVE, str(seconds), str(cycle_s)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    cpu, peak = float(out[0]), float(out[1])
    cycles = seconds / cycle_s
    print(
        f"live agent process, {seconds:.0f} s at one cycle per {cycle_s} s (8 devices): "
        f"{cpu / cycles * 1e3:.3f} ms CPU per cycle incl. start-up, peak RSS {peak:.1f} MiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--live-s", type=float, default=10.0, help="seconds of the live agent")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it still runs")
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given
        parser.set_defaults(cycles=600, live_s=1.0)
        args = parser.parse_args()

    logging.disable(logging.WARNING)  # injected faults log; not what is measured
    fake = FakeNvml([full_gpu(i) for i in range(args.devices)])
    reader = NvmlReader(fake)
    view = NodeView(reader.devices(), AgentSettings(node="bench"), None)
    uuids = [i.uuid for i in view.infos]
    handles = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(args.devices)]

    # Baseline: the NVML calls of a cycle, nothing else.
    start = time.process_time()
    for _ in range(args.cycles):
        for h in handles:
            fake.nvmlDeviceGetTotalEccErrors(
                h, fake.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fake.NVML_VOLATILE_ECC
            )
            fake.nvmlDeviceGetRemappedRows(h)
            fake.nvmlDeviceGetRetiredPagesPendingStatus(h)
            fake.nvmlDeviceGetCurrentClocksEventReasons(h)
    base = (time.process_time() - start) / args.cycles

    now = 1_800_000_000.0
    start = time.process_time()
    for c in range(args.cycles):
        now += 5.0
        if c % 500 == 250:
            fake.inject_xid(c % args.devices, 48)  # some faults, so decisions change
        view.on_events(reader.wait_events(0), now)
        view.on_samples([reader.sample(u) for u in uuids], now)
        view.assess(now)
        view.status(now)
    per_cycle = (time.process_time() - start) / args.cycles
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print(f"devices {args.devices}, cycles {args.cycles} (fake NVML)")
    print(
        f"agent cycle:    {per_cycle * 1e3:8.3f} ms CPU  "
        f"({per_cycle / args.devices * 1e3:.3f} ms per device-cycle; target < 50)"
    )
    print(
        f"baseline calls: {base * 1e3:8.3f} ms CPU  (ratio agent/baseline {per_cycle / base:.1f}x)"
    )
    print(f"RSS now {rss_mib():.1f} MiB, peak {peak:.1f} MiB (target < 150)")
    live(args.live_s, 0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
