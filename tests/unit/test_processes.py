"""The test harness's supervisor (tests.processes.Supervisor): a process that exits on its own
is started again as it ran, and whoever hears of it is told; one stopped on purpose stays down."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.processes import Processes, Supervisor, alive


def _wait(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_process_that_exits_on_its_own_is_started_again_and_reported(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    # Started by someone else (as cluster-up starts the cluster's), writing to a log of its own.
    own_log = tmp_path / "logs" / "sleeper.log"
    with own_log.open("wb") as out:
        first = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, stdout=out)
    processes = Processes(tmp_path, {"sleeper": first.pid})
    heard: list[tuple[str, Path]] = []
    try:
        with Supervisor(
            processes, ("sleeper",), interval_s=0.05, on_restart=lambda r, p: heard.append((r, p))
        ) as supervisor:
            os.kill(first.pid, signal.SIGKILL)  # no one asked: as if it crashed
            first.wait()
            _wait(lambda: supervisor.restarts["sleeper"] == 1)
            second = processes.pids["sleeper"]
            assert second != first.pid
            assert alive(second)
            assert heard == [("sleeper", own_log)]  # the dead one's log: where it wrote
            assert processes.log_of("sleeper") == processes.dir / "logs" / "sleeper-1.log"
            assert processes.specs["sleeper"].argv == ("sleep", "300")

            with supervisor.lock:  # stopped on purpose: pid 0, left down
                processes.kill("sleeper")
            time.sleep(0.5)
            assert processes.pids["sleeper"] == 0
            assert supervisor.restarts["sleeper"] == 1
            assert len(heard) == 1
            assert not alive(second)
    finally:
        processes.stop_restarted()
        if first.poll() is None:
            first.kill()
