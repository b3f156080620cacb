"""The local cluster's processes, taken over by a test or the soak: kill -9 (or stop) and start
again as they ran, pause and continue.

A process is started again from what /proc said of it when it was taken over: its command
line, its environment and its working directory (or a spec the caller gave it: a second
replica, a kubeconfig through the soak's fault proxy, another controller mode); its output
goes to a log of its own in the cluster's logs/ folder, and its pid is appended to the
cluster's pids.env (as hack/lib/cluster.sh records them), so hack/cluster-down.sh finds it
should the caller die. A process started here gets SIGTERM when its starter dies
(PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessSpec:
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    # The mount namespace it runs in when not this process's: /proc/<pid>/ns/mnt of a process
    # that holds it (hack/realnode.sh's agent runs in its node's namespace, with the node's
    # mounts; started again there, with nsenter). Empty: this process's namespace.
    mount_ns: str = ""

    @classmethod
    def of(cls, pid: int) -> ProcessSpec:
        proc = Path(f"/proc/{pid}")
        # Empty for a moment while a just-started child execs (a unit test met it): wait.
        deadline = time.monotonic() + 5
        while not (argv := _argv(proc)) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not argv:
            raise RuntimeError(f"process {pid} has no command line (gone, or a zombie)")
        env = {}
        for item in proc.joinpath("environ").read_bytes().split(b"\0"):
            key, sep, value = item.decode(errors="replace").partition("=")
            if sep:
                env[key] = value
        return cls(argv, env, os.readlink(proc / "cwd"), _held_mount_ns(pid))

    def flag(self, name: str) -> str:
        """The value of ``--name V`` or ``--name=V``; "" when absent."""
        for i, a in enumerate(self.argv):
            if a == f"--{name}" and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if a.startswith(f"--{name}="):
                return a.split("=", 1)[1]
        return ""

    def with_flags(self, **flags: str) -> ProcessSpec:
        """This command line with each ``--name`` (underscores for dashes) set to the value
        given, in place when present, appended when not."""
        argv = list(self.argv)
        for key, value in flags.items():
            name = f"--{key.replace('_', '-')}"
            for i, a in enumerate(argv):
                if a == name and i + 1 < len(argv):
                    argv[i + 1] = value
                    break
                if a.startswith(f"{name}="):
                    argv[i] = f"{name}={value}"
                    break
            else:
                argv += [name, value]
        return ProcessSpec(tuple(argv), dict(self.env), self.cwd, self.mount_ns)

    def command(self) -> tuple[str, ...]:
        """What to run: the command line, in its mount namespace."""
        if not self.mount_ns:
            return self.argv
        return ("nsenter", f"--mount={self.mount_ns}", "--", *self.argv)


def _held_mount_ns(pid: int) -> str:
    """``/proc/<parent>/ns/mnt`` when ``pid`` runs in a mount namespace other than this
    process's and its parent (which lives on when ``pid`` is killed) holds the same one; empty
    when ``pid`` shares ours."""
    try:
        theirs = os.readlink(f"/proc/{pid}/ns/mnt")
        if theirs == os.readlink("/proc/self/ns/mnt"):
            return ""
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        held = f"/proc/{parent}/ns/mnt"
        if os.readlink(held) == theirs:
            return held
    except (OSError, ValueError, IndexError):
        return ""
    raise RuntimeError(f"process {pid} runs in a mount namespace ({theirs}) nobody else holds")


def _argv(proc: Path) -> tuple[str, ...]:
    return tuple(a.decode() for a in proc.joinpath("cmdline").read_bytes().split(b"\0") if a)


def stdout_file(pid: int) -> Path | None:
    """The regular file ``pid``'s stdout is (None: a pipe, a terminal, or gone)."""
    try:
        target = Path(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:
        return None
    return target if target.is_file() else None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class _Spawner:
    """Starts children from one thread that lives as long as this process. PR_SET_PDEATHSIG
    fires when the *thread* that forked a child ends, not its process: a child started from a
    short-lived thread (a Supervisor's) would get SIGTERM when that thread returns (the CI run
    that found it: the extender the crash test's supervisor restarted died with it, and every
    e2e test after it failed)."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[dict[str, Any], queue.Queue[Any]]] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def popen(self, **kwargs: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="spawner", daemon=True)
                self._thread.start()
        answer: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._requests.put((kwargs, answer))
        child = answer.get()
        if isinstance(child, BaseException):
            raise child
        return child  # type: ignore[no-any-return]

    def _serve(self) -> None:
        while True:
            kwargs, answer = self._requests.get()
            try:
                answer.put(subprocess.Popen(**kwargs, preexec_fn=_die_with_parent))
            except Exception as e:  # handed to the caller
                answer.put(e)


_spawner = _Spawner()


def taken_key(role: str) -> str:
    """The pids.env key of the last process of ``role`` a :class:`Processes` started."""
    return "TL_TAKEN_" + "".join(c if c.isalnum() else "_" for c in role.upper()) + "_PID"


def last_taken(cluster_dir: Path, role: str) -> int:
    """The pid of the last process of ``role`` a :class:`Processes` started in the cluster of
    ``cluster_dir`` (from its pids.env, by any process); 0 if none was."""
    key, last = taken_key(role), 0
    pids = cluster_dir / "pids.env"
    if pids.exists():
        for line in pids.read_text().splitlines():
            name, _, value = line.partition("=")
            if name == key and value:
                last = int(value)
    return last


class Processes:
    """The cluster's processes that faults strike, by role, following restarts."""

    def __init__(self, cluster_dir: Path, pids: dict[str, int]) -> None:
        self.dir = cluster_dir
        self.pids = dict(pids)  # role -> current pid (0 while down)
        self.specs = {role: ProcessSpec.of(pid) for role, pid in pids.items()}
        self.generation = dict.fromkeys(pids, 0)
        self._children: list[subprocess.Popen[bytes]] = []
        self._by_pid: dict[int, subprocess.Popen[bytes]] = {}
        # Where each first process writes (started by someone else: its stdout's file).
        self._first_logs = {role: p for role, pid in pids.items() if (p := stdout_file(pid))}

    def log_of(self, role: str) -> Path:
        """Where the role's current process writes: the log of one started here, or, for the
        first process of a role (started by someone else), the file its stdout goes to."""
        generation = self.generation.get(role, 0)
        if generation == 0 and role in self._first_logs:
            return self._first_logs[role]
        return self.dir / "logs" / f"{role}-{generation}.log"

    def reap(self, role: str) -> None:
        """Collect the exit of the role's process if it was one started here (no zombie)."""
        child = self._by_pid.pop(self.pids.get(role, 0), None)
        if child is not None:
            child.wait()

    def kill(self, role: str) -> None:
        """kill -9 the role's process and wait until it is gone."""
        pid = self.pids[role]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.reap(role)
        self.pids[role] = 0

    def stop(self, role: str, timeout_s: float = 20) -> None:
        """SIGTERM the role's process (a clean exit: leader leases released), SIGKILL after
        ``timeout_s``; wait until it is gone."""
        pid = self.pids[role]
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            self.kill(role)
        self.reap(role)
        self.pids[role] = 0

    def start(self, role: str, spec: ProcessSpec | None = None) -> int:
        """Start the role's process from ``spec`` (kept for its later restarts) or from the one
        it ran with; its pid, recorded in pids.env under ``TL_TAKEN_<ROLE>_PID``."""
        if spec is not None:
            self.specs[role] = spec
        spec = self.specs[role]
        self.generation[role] = self.generation.get(role, -1) + 1
        log = self.log_of(role)
        with log.open("wb") as out:
            child = _spawner.popen(
                args=spec.command(),
                env=spec.env,
                cwd=spec.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._children.append(child)
        self._by_pid[child.pid] = child
        self.pids[role] = child.pid
        key = taken_key(role)
        with (self.dir / "pids.env").open("a") as f:
            f.write(f"{key}={child.pid}\n")
        return child.pid

    def kill_and_restart(self, role: str) -> int:
        """kill -9 the role's process, wait until it is gone, start it again as it ran; the new
        pid."""
        self.kill(role)
        return self.start(role)

    def pause(self, role: str) -> None:
        os.kill(self.pids[role], signal.SIGSTOP)

    def resume(self, role: str) -> None:
        os.kill(self.pids[role], signal.SIGCONT)

    def stop_restarted(self, timeout_s: float = 20) -> None:
        """SIGTERM the processes this started (then SIGKILL what is left), last started first."""
        for child in reversed(self._children):
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + timeout_s
        for child in reversed(self._children):
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


class Supervisor:
    """Starts a role's process again as it ran (``Processes.specs``) whenever it is found dead,
    as a Deployment's kubelet would: a thread polling every ``interval_s``. :attr:`restarts`
    counts them by role, :attr:`logs` names each dead process's log; ``on_restart(role, log)``,
    where given, hears of each (from the supervisor's thread). A role whose pid is 0 (stopped
    on purpose, ``Processes.kill``) stays down. Whoever kills or starts a supervised role holds
    :attr:`lock` meanwhile, so that a kill is not mistaken for a death."""

    def __init__(
        self,
        processes: Processes,
        roles: tuple[str, ...],
        interval_s: float = 0.2,
        on_restart: Callable[[str, Path], None] | None = None,
    ):
        self.processes, self.roles, self.interval_s = processes, roles, interval_s
        self.on_restart = on_restart
        self.restarts = dict.fromkeys(roles, 0)
        self.logs: list[Path] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def __enter__(self) -> Supervisor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self.lock:
                for role in self.roles:
                    pid = self.processes.pids.get(role, 0)
                    if pid and not alive(pid):
                        dead = self.processes.log_of(role)
                        self.logs.append(dead)
                        self.processes.reap(role)
                        self.processes.start(role)
                        self.restarts[role] += 1
                        if self.on_restart is not None:
                            self.on_restart(role, dead)
