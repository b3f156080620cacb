"""hack/apiserver.sh leaves nothing running when the process that started it dies outright
(a test run killed with SIGKILL never gets to stop its fixtures)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.background import read_state

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]


def using(path: Path) -> list[int]:
    """The processes whose command line names ``path`` (etcd's data dir, the API server's
    certificates)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmdline:
            found.append(int(proc.name))
    return found


def test_the_api_server_stops_when_its_parent_is_killed(tmp_path: Path) -> None:
    state = tmp_path / "state.env"
    parent = subprocess.Popen(["sleep", "600"])
    with (tmp_path / "log").open("w") as log:
        script = subprocess.Popen(
            [str(ROOT / "hack" / "apiserver.sh"), str(state)],
            env={**os.environ, "TL_APISERVER_PARENT_PID": str(parent.pid)},
            stdout=subprocess.DEVNULL,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 180
        while not state.exists():
            assert script.poll() is None, (tmp_path / "log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the API server did not start"
            time.sleep(0.2)
        cp_dir = Path(read_state(state)["DIR"])
        assert len(using(cp_dir)) >= 2  # etcd and kube-apiserver
        parent.kill()
        parent.wait()
        script.wait(timeout=30)
        assert script.returncode == 0, (tmp_path / "log").read_text()[-3000:]
        assert "parent process" in (tmp_path / "log").read_text()
        assert not state.exists()
        assert not cp_dir.exists()
        assert using(cp_dir) == []
    finally:
        for proc in (parent, script):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
