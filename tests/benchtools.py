"""What the benchmarks share: a process's CPU time, nearest-rank quantiles, ``KEY=VALUE,...``
settings on the command line, and py-spy: a process's samples recorded while a block runs, and
a summary of them (the functions with the most samples of their own, the modules with the most
in all; pip install py-spy, as root or with ptrace allowed)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (NaN of nothing)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def settings_pairs(text: str) -> dict[str, str]:
    """KEY=VALUE[,KEY=VALUE...] (extender settings, docs/reference.md), for argparse."""
    pairs = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"want KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs


@contextlib.contextmanager
def profiling(out: Path | None, pids: dict[str, int], tag: str) -> Iterator[None]:
    """py-spy recording each of ``pids`` (name -> pid) while the block runs, 100 Hz, into
    ``out/<name>-<tag>.txt`` as collapsed stacks (nothing when out is None). Only samples
    taken while the process holds the GIL count: its Python work, not its waits, nor the
    syscalls it makes without the GIL (a socket write that wakes a peer and is preempted)."""
    if out is None:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    procs = [
        subprocess.Popen(
            [spy or "py-spy", "record", "--pid", str(pid), "--rate", "100", "--format", "raw",
             "--output", str(out / f"{name}-{tag}.txt"), "--nonblocking", "--gil"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]  # fmt: skip
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def profile_summary(path: Path, top: int = 12) -> list[str]:
    """The functions with the most samples of their own, and the top-level modules with the
    most samples in all, from py-spy's collapsed stacks ("frame;frame;... count")."""
    own: dict[str, int] = {}
    modules: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + n
        seen = set()
        for frame in frames:
            # "function (path/to/module.py:line)": the module, by its package directory
            where = frame.rpartition("(")[2].split(":")[0]
            parts = Path(where).parts
            for anchor in ("site-packages", "extender", "common", "asyncio"):
                if anchor in parts:
                    i = parts.index(anchor)
                    where = "/".join(
                        parts[i + 1 : i + 3] if anchor == "site-packages" else parts[i : i + 2]
                    )
                    break
            if where not in seen:
                seen.add(where)
                modules[where] = modules.get(where, 0) + n
    if not total:
        return ["no samples"]
    lines = [f"{total} samples; most samples of their own:"]
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * n / total:5.1f} %  {frame}")
    lines.append("modules on the stack (in all):")
    for where, n in sorted(modules.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {100 * n / total:5.1f} %  {where}")
    return lines
