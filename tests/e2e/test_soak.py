"""The short soak (issue 33): hack/soak.py for four minutes with seed 1 (five with the real
node), on a cluster of its own.

Compressed tides (online jobs lending and reclaiming), borrowers arriving and finishing (some
through the shared queues), the real kubelet node where the e2e cluster has one, two
scheduling replicas, and one fault of each kind (tests/soak/workload.py: processes killed and
restarted, a replica lost, etcd paused, a kwok node deleted with its pods, the extenders'
network slowed and dropping replies, a device Unhealthy; on the real node its agent killed and
its cache disk full), with the invariants of
tests/soak/invariants.py checked over the whole history, the pods watched. The long soak is a
command of its own: hack/soak.py --minutes 60.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.soak.workload import FAULT_KINDS, REAL_NODE_FAULT_KINDS

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
MINUTES = 4
# With the real node: a minute more, so that its job scales up twice (on whole minutes of its
# schedule: t=120 and 240 s), once after the full disk (t=56-103 s) and once with room.
REAL_NODE_MINUTES = 5
SEED = 1


def soak(tmp_path: Path, *extra: str, minutes: int = MINUTES) -> tuple[int, dict[str, Any], str]:
    """hack/soak.py for ``minutes`` of SEED (plus ``extra``): its exit code, report and
    output."""
    report = tmp_path / "report.json"
    # The cluster's directory is short, whatever pytest's path (a real node's unix sockets live
    # in it, at most 107 bytes a path), and pruned with the e2e clusters' (tests/e2e/conftest.py);
    # linked from pytest's directory.
    short = Path(tempfile.mkdtemp(prefix="tl-e2e-soak-", dir="/tmp"))
    (tmp_path / "cluster").symlink_to(short)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "hack" / "soak.py"),
            "--minutes",
            str(minutes),
            "--seed",
            str(SEED),
            "--dir",
            str(short / "c"),
            "--json",
            str(report),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=minutes * 60 + 900,
        check=False,
    )
    output = f"stdout:\n{done.stdout}\nstderr (end):\n{done.stderr[-20000:]}"
    result = json.loads(report.read_text()) if report.exists() else {}
    return done.returncode, result, output


# The real kubelet node as the e2e cluster has it (needs root and containerd; the same switch).
REAL_NODE = os.environ.get("TIDELEASE_E2E_REAL_NODE", "true") == "true"


def test_a_short_soak_keeps_every_invariant(tmp_path: Path) -> None:
    """With the real kubelet node (its online job prewarming its checkpoints from a peer, its
    borrowers, its agent killed, its cache disk full) where the e2e cluster has one, and
    borrowers through the shared queues."""
    if REAL_NODE:
        code, result, output = soak(tmp_path, "--real-node", minutes=REAL_NODE_MINUTES)
    else:
        code, result, output = soak(tmp_path)
    assert code == 0, output
    assert result["violations"] == [], output
    kinds = [*FAULT_KINDS, *(REAL_NODE_FAULT_KINDS if REAL_NODE else ())]
    assert all(result["faults"].get(kind, 0) >= 1 for kind in kinds), result["faults"]
    assert result["reclaims"] >= 1, output
    assert result["reclaims_judged"] >= 1, output
    assert result["queued"] >= 1, output
    if REAL_NODE:  # its job's checkpoints prewarmed from the peer: one met the full disk
        assert result["prewarm_no_space"] >= 1, output
        assert any(v.startswith("Done") for v in result["prewarm"].values()), output
    print(output)


def test_the_soak_catches_a_deliberate_bug(tmp_path: Path) -> None:
    """The same history with the leasing controller's reclaim notice skipped (a mutation
    patched into the tidelease processes, tests/soak/mutations.py): the notice checker must
    report it, so that the green run above means something. The other mutations are run by
    hand (docs/performance.md, Soak)."""
    code, result, output = soak(tmp_path, "--mutate", "skip-notice")
    assert code == 0, output  # 0: the checker reported the bug
    assert any(v.startswith("[notice-before-eviction]") for v in result["violations"]), output
