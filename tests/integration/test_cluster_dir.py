"""hack/cluster-up.sh's -D DIR: which directories it uses, cleans up or refuses (through the
library function it calls before starting anything, with bash)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def reap(directory: Path) -> subprocess.CompletedProcess[str]:
    script = (
        'source hack/lib/common.sh && source hack/lib/cluster.sh && tl::cluster::reap_stale "$1"'
    )
    return subprocess.run(
        ["bash", "-c", script, "reap", str(directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_new_or_empty_directory_is_used(tmp_path: Path) -> None:
    assert reap(tmp_path / "new").returncode == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    done = reap(empty)
    assert done.returncode == 0, done.stderr
    assert empty.is_dir()  # kept, to be used


def test_a_stale_cluster_directory_is_removed(tmp_path: Path) -> None:
    stale = tmp_path / "stale"
    (stale / "logs").mkdir(parents=True)
    (stale / ".tidelease-cluster").touch()
    done = reap(stale)
    assert done.returncode == 0, done.stderr
    assert not stale.exists()
    assert "removing stale cluster directory" in done.stderr


def test_a_directory_with_other_files_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("keep me")
    done = reap(other)
    assert done.returncode != 0
    assert "is not a tidelease cluster directory; refusing to remove it" in done.stderr
    assert (other / "thesis.tex").read_text() == "keep me"
