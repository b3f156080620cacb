"""hack/bench-scale.py still runs: its ``--smoke`` mode starts a small cluster of its own (24 kwok
nodes) and runs every phase once, the DRA ones included, with a variant extender; its figures
are parsed, not just looked for."""

from __future__ import annotations

import sys

import pytest

from tests.integration.test_benchmarks_smoke import NUMBER, ROOT, numbers, rows, run_script

pytestmark = pytest.mark.cluster  # the pinned binaries (hack/build-binaries.sh)

PHASES = ("plain", "null", "extender", "variant", "dra-tidelease", "dra-plain")


def test_bench_scale_smoke() -> None:
    out = run_script([sys.executable, str(ROOT / "hack" / "bench-scale.py"), "--smoke"], 900)
    bound = {
        name: (int(done), int(of))
        for name, done, of in rows(r"^  (\S+)\s+round 0: (\d+)/(\d+) bound in", out)
    }
    assert bound == {name: (16, 16) for name in PHASES}, out
    for name in PHASES:
        (rate,) = numbers(rf"^  {name}\s+round 0: .* bound in .*?{NUMBER} pods/s overall", out)
        assert rate > 0, (name, out)
    # each phase's kube-scheduler counted its 16 pods scheduled (after attempts of any other
    # result)
    scheduled = [int(n) for (n,) in rows(r"attempts \{[^}]*'scheduled': (\d+)", out)]
    assert scheduled == [16] * len(PHASES), out
    for a, b in (("extender", "null"), ("variant", "extender"), ("dra-tidelease", "dra-plain")):
        (ratio,) = numbers(rf"^  ratio {a}\b.* / {b}: {NUMBER}x", out)
        assert ratio > 0, (a, b, out)
    # the extender's verbs, from its own metrics: a filter and a bind per pod at least, and
    # prioritize calls (kube-scheduler skips scoring where one node alone passed the filter)
    for verb, least in (("filter", 16), ("bind", 16), ("prioritize", 1)):
        (requests,) = numbers(rf"^    {verb}\s+{NUMBER} requests", out)
        assert requests >= least, (verb, out)
