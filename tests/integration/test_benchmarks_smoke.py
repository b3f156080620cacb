"""Every benchmark still runs: its ``--smoke`` mode (the same code paths at tiny sizes), run as a
user runs it (``python -m benchmarks.NAME --smoke`` from the repository root), exits 0 and prints
its figures. The figures are parsed, not just looked for: a table with a row missing, or a
number that is not one, fails.

bench_hot_restart needs a real containerd: its smoke test is in
tests/containerd/test_bench_hot_restart_smoke.py (marker ``containerd``); bench_queues needs
the local cluster: tests/e2e/test_bench_queues_smoke.py (marker ``cluster``). A script added to
benchmarks/ without a smoke test here or there fails ``test_every_benchmark_has_a_smoke_test``.
"""

from __future__ import annotations

import ast
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120.0
NUMBER = r"(\d+(?:,\d{3})*(?:\.\d+)?)"

# Smoke tests that live elsewhere (they need more than this directory's tests do).
ELSEWHERE = {
    "bench_hot_restart": "tests/containerd/test_bench_hot_restart_smoke.py",
    "bench_queues": "tests/e2e/test_bench_queues_smoke.py",  # needs the local cluster
    "bench_dawn": "tests/e2e/test_bench_dawn_smoke.py",  # needs the local cluster
}


def run_smoke(name: str, *extra: str, timeout_s: float = TIMEOUT_S) -> str:
    """``python -m benchmarks.<name> --smoke`` from the repository root: its stdout, once it
    exited 0 within ``timeout_s``. On a timeout its whole process group gets SIGTERM (servers
    and helper scripts it started clean up), then SIGKILL, and the test fails with its output."""
    return run_script([sys.executable, "-m", f"benchmarks.{name}", "--smoke", *extra], timeout_s)


def run_script(cmd: list[str], timeout_s: float) -> str:
    """``cmd`` from the repository root: its stdout, once it exited 0 within ``timeout_s``
    (else, as :func:`run_smoke` says, stopped and failed)."""
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(
            f"{' '.join(cmd[1:])} did not finish within {timeout_s:g} s\n"
            f"--- stdout\n{out}\n--- stderr\n{err}"
        )
    assert proc.returncode == 0, (
        f"{' '.join(cmd[1:])} exited {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"
    )
    return out


def numbers(pattern: str, out: str) -> list[float]:
    """The numbers of the one line matching ``pattern`` (its groups); fails if none does."""
    match = re.search(pattern, out, re.MULTILINE)
    assert match, f"no line matches {pattern!r} in:\n{out}"
    values = [float(g.replace(",", "")) for g in match.groups()]
    assert all(math.isfinite(v) for v in values), (pattern, values)
    return values


def rows(pattern: str, out: str) -> list[tuple[str, ...]]:
    return [m.groups() for m in re.finditer(pattern, out, re.MULTILINE)]


def check_agent(out: str) -> None:
    assert numbers(r"^devices (\d+), cycles (\d+) \(fake NVML\)$", out) == [8, 600]
    cycle, per_device = numbers(
        rf"^agent cycle:\s+{NUMBER} ms CPU\s+\({NUMBER} ms per device-cycle; target < 50\)", out
    )
    assert 0 < per_device < 50, per_device  # the target, with a margin of thousands
    assert per_device == pytest.approx(cycle / 8, abs=1e-3)
    base, ratio = numbers(
        rf"^baseline calls:\s+{NUMBER} ms CPU\s+\(ratio agent/baseline {NUMBER}x", out
    )
    assert base > 0
    assert ratio > 0
    rss, peak = numbers(rf"^RSS now {NUMBER} MiB, peak {NUMBER} MiB \(target < 150\)$", out)
    assert rss > 0
    assert peak > 0
    cpu, live_peak = numbers(
        rf"^live agent process, 1 s at one cycle per 0.05 s \(8 devices\): {NUMBER} ms CPU per "
        rf"cycle incl. start-up, peak RSS {NUMBER} MiB$",
        out,
    )
    assert cpu > 0
    assert live_peak > 0


def check_extender(out: str) -> None:
    assert numbers(r"^cluster: (\d+) nodes x 8 GPUs; .*; (\d+) calls per figure$", out) == [50, 50]
    found = rows(
        r"^(online \(.*?\)|borrower \(.*?\))\s+(filter|prioritize) (warm|cold)"
        + rf"\s+{NUMBER}" * 6
        + r"$",
        out,
    )
    assert {r[:3] for r in found} == {
        (pod, verb, mode)
        for pod in ("online (high, HA, owner, checkpoint)", "borrower (low, any)")
        for verb in ("filter", "prioritize")
        for mode in ("warm", "cold")
    }, out
    assert len(found) == 8, out
    for row in found:
        p50, p99, per_s, base_p50, base_per_s, ratio = (float(x) for x in row[3:9])
        assert 0 < p50 <= p99, row
        assert per_s > 0, row
        assert base_p50 > 0, row
        assert base_per_s > 0, row
        assert ratio == pytest.approx(p50 / base_p50, rel=0.1), row  # rounded figures


def check_orchestrator(out: str) -> None:
    assert "DAG evaluation per status change, 50-pod job, 50 changes (ms)" in out, out
    found = rows(rf"^(ray|mpi)\s+(\w.*?)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$", out)
    assert [r[:2] for r in found] == [
        (job, path)
        for job in ("ray", "mpi")
        for path in (
            "incremental (apply + evaluate)",
            "full (rebuild + evaluate)",
            "empty evaluation (1-pod job)",
        )
    ], out
    for row in found:
        median, p99, most = (float(x) for x in row[2:])
        assert 0 < median <= p99 <= most, row
    (worst,) = numbers(rf"^incremental p99 {NUMBER} ms: (?:meets|MISSES) the 10 ms target$", out)
    assert worst == max(float(r[3]) for r in found if r[1].startswith("incremental"))


def check_peer_pull(out: str) -> None:
    assert "# setup: 64 MiB random checkpoint" in out, out
    sources = rows(r"(peer\d) (\d+) MiB", out.split("# bytes by source: ", 1)[-1].split("\n")[0])
    assert sum(int(mib) for _, mib in sources) == 64, out  # every byte, from some peer
    assert len([s for s in sources if int(s[1]) > 0]) > 1, out  # from more than one
    cell = rf"\s+{NUMBER}\s+\|"
    table = rows(rf"^\| (.*?)\s+\|{cell * 4}\s+{NUMBER} % \|$", out)
    assert [r[0].split(" (")[0] for r in table] == [
        "earliest completion",
        "even split",
        "single source",
    ], out
    for row in table:
        seconds, model, ratio = (float(x) for x in row[1:4])
        assert seconds > 0, row
        assert model > 0, row
        assert ratio == pytest.approx(seconds / model, rel=0.1), row  # rounded figures
    ratio, fluid, fraction = numbers(
        rf"^ours vs optimum at its shard size: {NUMBER} \(target <= 1.10\); vs fluid bound "
        rf"{NUMBER}; fraction of aggregate rate {NUMBER}%",
        out,
    )
    assert ratio > 0
    assert fluid >= ratio * 0.99  # the fluid bound is below the optimum
    assert fraction > 0
    for hashing in ("no hashing", "sha256 off-loop"):
        (rate,) = numbers(rf"^serving, one stream, 0.1 GiB sparse, {hashing}: {NUMBER} GB/s$", out)
        assert rate > 0
    transfer, end_to_end = numbers(
        rf"^whole pull from one unthrottled peer .*: {NUMBER} GB/s transfer, {NUMBER} GB/s end to "
        "end$",
        out,
    )
    assert transfer >= end_to_end > 0


def check_simulation(out: str) -> None:
    gpus, nodes = numbers(rf"^scenario: {NUMBER} GPUs on {NUMBER} nodes, 2 days", out)
    assert gpus == 8 * nodes > 0
    cells = rf"\s+{NUMBER}" * 6
    found = rows(rf"^([\w-]+){cells}\s+ok$", out)
    assert [r[0] for r in found] == ["right-of-return", "no-return", "no-scaling"], out
    for row in found:
        placed, filters = float(row[4].replace(",", "")), float(row[6].replace(",", ""))
        assert placed > 0, row
        assert filters > 0, row


def check_decisions(out: str) -> None:
    runs = rows(
        r"^(\d+) replies; bytes sha256 ([0-9a-f]{16}); decisions sha256 ([0-9a-f]{16})$", out
    )
    assert len(runs) == 2, out  # recorded, then the same run again, checked against it
    assert runs[0] == runs[1], out
    assert runs[0][0] == "80", out  # 40 requests, filter and prioritize each
    assert out.rstrip().endswith("all replies equal to the recording"), out


def check_kube_client(out: str) -> None:
    assert numbers(r"^(\d+) binds x (\d+) rounds, (\d+) in flight, loopback$", out) == [200, 2, 16]
    base_rate, base_cpu = numbers(
        rf"^kubernetes_asyncio's session \(netrc per request\)\s+{NUMBER}\s+{NUMBER}$", out
    )
    rate, cpu = numbers(rf"^KubeClient's session \(no lookups\)\s+{NUMBER}\s+{NUMBER}$", out)
    assert min(base_rate, base_cpu, rate, cpu) > 0
    ratio_rate, ratio_cpu = numbers(
        rf"^ratio \(KubeClient / baseline\): binds/s {NUMBER}x, CPU {NUMBER}x$", out
    )
    assert ratio_rate == pytest.approx(rate / base_rate, abs=0.02)
    assert ratio_cpu == pytest.approx(cpu / base_cpu, abs=0.02)


def check_topology(out: str) -> None:
    assert numbers(r"^16 GPUs of one class; (\d+) free sets, median of (\d+) repeats$", out) == [
        2,
        1,
    ]
    cells = rf"\s+{NUMBER}" * 2
    found = rows(rf"^([\w-]+)\s+(\d+){cells}\s+{NUMBER}x$", out)
    assert [r[:2] for r in found] == [
        (layout, k)
        for layout in ("pcie-4switch-16", "nvlink-pairs-16", "nvswitch-16")
        for k in ("2", "4")
    ], out
    check_ratios([row[2:] for row in found], abs_error=0.002)
    assert out.rstrip().endswith("every answer equal to the exhaustive search's"), out


def check_ratios(found: list[tuple[str, ...]], abs_error: float) -> None:
    """Rows of (baseline, ours, ratio): both figures measured, the ratio theirs (rounded)."""
    for row in found:
        base, ours, ratio = (float(x) for x in row)
        assert base > 0, row
        assert ours > 0, row
        assert ratio == pytest.approx(ours / base, rel=0.1, abs=abs_error), row


def check_verb_passes(out: str) -> None:
    assert numbers(r"^(\d+) nodes, (\d+) pods, (\d+) calls each, median of (\d+) rounds", out) == [
        60,
        2,
        10,
        2,
    ]
    found = rows(rf"^(filter|prioritize)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x$", out)
    assert [r[0] for r in found] == ["filter", "prioritize"], out
    check_ratios([row[1:] for row in found], abs_error=0.01)
    assert out.rstrip().endswith("every answer equal to the one-by-one pass's"), out


CHECKS: dict[str, Callable[[str], None]] = {
    "bench_agent": check_agent,
    "bench_kube_client": check_kube_client,
    "bench_extender": check_extender,
    "bench_orchestrator": check_orchestrator,
    "bench_peer_pull": check_peer_pull,
    "bench_simulation": check_simulation,
    "bench_topology": check_topology,
    "bench_verb_passes": check_verb_passes,
    "check_decisions": check_decisions,
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_smoke(name: str, tmp_path: Path) -> None:
    extra: tuple[str, ...] = ()
    if name == "bench_peer_pull":  # its caches under tmp_path, not tmpfs: none left on a failure
        extra = ("--dir", str(tmp_path))
    CHECKS[name](run_smoke(name, *extra))


def test_every_benchmark_has_a_smoke_test() -> None:
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__"}
    tested = set(CHECKS) | set(ELSEWHERE)
    assert not scripts - tested, f"benchmarks without a smoke test: {sorted(scripts - tested)}"
    assert not tested - scripts, f"smoke tests of no benchmark: {sorted(tested - scripts)}"
    for name, test_file in ELSEWHERE.items():
        assert (ROOT / test_file).is_file(), f"{name}: its smoke test {test_file} is missing"
        assert f'run_smoke("{name}"' in (ROOT / test_file).read_text(), (name, test_file)
    for name in scripts:
        doc = ast.get_docstring(ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text()))
        assert doc, name
        usage = [line for line in doc.splitlines() if f"benchmarks.{name}" in line]
        assert usage, f"{name}: no usage line in its docstring"
        assert "--smoke" in doc, f"{name}: its docstring does not mention --smoke"
