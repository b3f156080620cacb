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


def test_a_process_of_another_mount_namespace_is_started_again_in_it(tmp_path: Path) -> None:
    """hack/realnode.sh's agent runs in its node's mount namespace (the node's mounts: its
    cache disk): killed and started again, it runs there again (nsenter into the namespace its
    parent holds), as a pod's container comes back on its node. Needs root, as the real node
    does."""
    (tmp_path / "logs").mkdir()
    mark = tmp_path / "mark"
    mark.mkdir()
    # A holder in a namespace of its own, with a tmpfs on ``mark`` there only, and its child.
    holder = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            # the child, then the holder goes on as ``sleep 301`` (as realnode.sh outlives its
            # agent)
            f"mount -t tmpfs tmpfs {mark} && touch {mark}/inside && "
            "{ sleep 300 & } && exec sleep 301",
        ],
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: bool(_children(holder.pid)))
        (child,) = _children(holder.pid)
        processes = Processes(tmp_path, {"child": child})
        spec = processes.specs["child"]
        assert spec.mount_ns == f"/proc/{holder.pid}/ns/mnt"
        assert spec.command()[:3] == ("nsenter", f"--mount=/proc/{holder.pid}/ns/mnt", "--")
        assert not (mark / "inside").exists()  # not in ours
        processes.kill("child")
        again = processes.start("child")
        _wait(
            lambda: (
                os.readlink(f"/proc/{again}/ns/mnt") == os.readlink(f"/proc/{holder.pid}/ns/mnt")
            )
        )
        # Ours has no such namespace: started again as it ran.
        mine = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
        assert Processes(tmp_path, {"mine": mine.pid}).specs["mine"].mount_ns == ""
        mine.kill()
        mine.wait()
        processes.stop_restarted()
    finally:
        holder.kill()
        holder.wait()


def _children(pid: int) -> list[int]:
    """The live children of ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == pid and stat[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out
