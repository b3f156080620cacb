"""bench_hot_restart still runs: its ``--smoke`` mode (2 runs of each, a 32 MiB checkpoint) as a
user runs it, starting its own containerd with hack/containerd.sh (a second one beside the
session's is fine: each has its own directory, socket, bridge and subnet). The other benchmarks'
smoke tests: tests/integration/test_benchmarks_smoke.py.
"""

from __future__ import annotations

import pytest

from tests.integration.test_benchmarks_smoke import NUMBER, numbers, rows, run_smoke

pytestmark = pytest.mark.containerd


def test_bench_hot_restart_smoke() -> None:
    out = run_smoke("bench_hot_restart", timeout_s=300)
    assert numbers(r"^runtime: containerd (\d+)\.", out)[0] >= 1
    (hot,) = numbers(
        rf"^hot restart in place\s+median\s+{NUMBER} ms\s+\(2 runs, same IP and pause PID\)$", out
    )
    (recreate,) = numbers(
        rf"^recreate the sandbox\s+median\s+{NUMBER} ms\s+\(2 runs, 2 distinct IPs\)$", out
    )
    (ratio,) = numbers(rf"^ratio recreate / hot\s+{NUMBER}x", out)
    assert hot > 0
    assert recreate > 0
    assert ratio == pytest.approx(recreate / hot, rel=0.05)
    registry, storage, load = numbers(
        rf"^calibrated: image import {NUMBER} MiB/s, checkpoint copy {NUMBER} MiB/s, "
        rf"load {NUMBER} MiB/s",
        out,
    )
    assert min(registry, storage, load) > 0
    (image_mib,) = numbers(rf"^cold node \({NUMBER} MiB image, 32 MiB checkpoint, eta = 0\):$", out)
    assert image_mib > 0
    assert "warm node (both cached, eta = 1):" in out, out
    windows = rows(rf"^  W\s+predicted\s+{NUMBER} s\s+measured\s+{NUMBER} s$", out)
    assert len(windows) == 2, out  # cold, then warm
    (cold_predicted, cold_measured), (warm_predicted, _) = (
        (float(p), float(m)) for p, m in windows
    )
    assert cold_predicted > 0
    assert cold_measured > 0
    assert warm_predicted < cold_predicted  # everything cached: only the load is left
