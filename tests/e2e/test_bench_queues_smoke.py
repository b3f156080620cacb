"""benchmarks/bench_queues.py still runs: its ``--smoke`` mode on the e2e cluster (two arrivals
through the queues and two without), its figures parsed, not just looked for."""

from __future__ import annotations

import pytest

from tests.e2e.harness import Cluster
from tests.integration.test_benchmarks_smoke import NUMBER, numbers, run_smoke

pytestmark = pytest.mark.cluster


def test_bench_queues_smoke(cluster: Cluster) -> None:
    out = run_smoke("bench_queues", "--state", str(cluster.dir / "cluster.env"), timeout_s=600)
    assert numbers(r"^interactive 2-GPU pod, creation to placement, (\d+) arrivals", out) == [2]
    for phase in ("queued", "plain"):
        median, p90, worst = numbers(rf"^{phase}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$", out)
        assert 0 < median <= p90 <= worst, (phase, out)
    (ratio,) = numbers(rf"^ratio queued/plain \(medians\): {NUMBER}$", out)
    assert ratio > 0
    assert "target: queued median <= 1 s: " in out
