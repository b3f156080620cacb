"""benchmarks/bench_dawn.py still runs: its ``--smoke`` mode on the e2e cluster (two leases on
kwok nodes of their own, every lent GPU borrowed, both raised at once), its figures parsed, not
just looked for."""

from __future__ import annotations

import pytest

from benchmarks.bench_dawn import shapes
from tests.e2e.harness import Cluster
from tests.integration.test_benchmarks_smoke import NUMBER, numbers, run_smoke

pytestmark = pytest.mark.cluster


def test_bench_dawn_smoke(cluster: Cluster) -> None:
    out = run_smoke("bench_dawn", "--state", str(cluster.dir / "cluster.env"), timeout_s=900)
    lent = sum(s.total - s.gpus for s in shapes(2))  # every replica but the first lends
    leases, lent_gpus, borrowed = numbers(
        rf"^baseline round 0: {NUMBER} leases, {NUMBER} GPUs lent, {NUMBER} of them borrowed", out
    )
    assert (leases, lent_gpus, borrowed) == (2, lent, lent), out
    for what in ("last borrower gone", "replicas home", "lease Steady"):
        p50, p99, worst = numbers(rf"^  {what}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$", out)
        assert 0 <= p50 <= p99 <= worst, (what, out)
    unfinished, _, degraded = numbers(
        rf"unfinished {NUMBER}, steady past grace \+ 15 s: {NUMBER}, Degraded: {NUMBER}", out
    )
    assert (unfinished, degraded) == (0, 0), out
    (cores,) = numbers(rf"controllers {NUMBER} cores", out)
    assert cores > 0, out
    (per_reclaim,) = numbers(rf"API requests per reclaim {NUMBER}", out)
    assert per_reclaim > 0, out
