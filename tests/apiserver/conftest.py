"""A real kube-apiserver and etcd (hack/apiserver.sh) for the tests of the API-server client."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.background import running

ROOT = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, as hack/apiserver.sh
    stops what it started (tl::supervise), so a killed run leaves no API server behind."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def one_pid(pattern: str, what: str) -> int:
    """The pid of the one process whose command line matches ``pattern`` (pgrep -f)."""
    out = subprocess.run(
        ["pgrep", "-f", "--", pattern], capture_output=True, text=True, check=False
    ).stdout.split()
    assert len(out) == 1, f"want the one {what}, found {out}"
    return int(out[0])


@dataclass(frozen=True)
class ApiServer:
    kubeconfig: Path
    server: str
    token: str
    ca: Path
    dir: Path  # the control plane's directory (etcd's data, the logs)
    # kube-apiservers started again by start_apiserver; the fixture stops them at the end.
    restarted: list[subprocess.Popen[bytes]] = field(
        default_factory=list, repr=False, compare=False
    )

    def apiserver_pid(self) -> int:
        return one_pid(
            f"kube-apiserver .*--cert-dir={self.dir}/certs", f"kube-apiserver of {self.dir}"
        )

    def apiserver_argv(self) -> list[str]:
        """kube-apiserver's command line, for start_apiserver."""
        return Path(f"/proc/{self.apiserver_pid()}/cmdline").read_bytes().decode().split("\0")[:-1]

    async def stop_apiserver(self, grace_s: float = 5) -> str:
        """Stop kube-apiserver and wait until it is gone; etcd keeps running. SIGTERM first; a
        graceful stop waits for open connections (a watch's among them) up to a minute, so
        past ``grace_s`` it is killed, as a crashed one would be. Returns how it stopped."""
        pid = self.apiserver_pid()
        how = "SIGTERM"
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _alive(pid):
            if time.monotonic() > deadline and how == "SIGTERM":
                how = f"SIGKILL after {grace_s:g} s of SIGTERM"
                os.kill(pid, signal.SIGKILL)
            assert time.monotonic() < deadline + 10, f"kube-apiserver {pid} still running"
            await asyncio.sleep(0.1)
        return how

    def start_apiserver(self, argv: list[str]) -> None:
        """Start kube-apiserver again with the same command line: the same port, etcd, serving
        certificate and tokens, so every client's kubeconfig still holds."""
        with (self.dir / "logs" / "kube-apiserver.log").open("ab") as log:
            self.restarted.append(
                subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent,
                )
            )

    def readyz(self) -> bool:
        """Whether the API server's own /readyz answers 200 now."""
        context = ssl.create_default_context(cafile=str(self.ca))
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    async def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not await asyncio.to_thread(self.readyz):
            for proc in self.restarted:
                assert proc.poll() is None, f"kube-apiserver exited: see {self.dir}/logs"
            assert time.monotonic() < deadline, f"kube-apiserver not ready after {timeout_s} s"
            await asyncio.sleep(0.1)


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    state = tmp_path_factory.mktemp("apiserver") / "state.env"
    with running(
        [str(ROOT / "hack" / "apiserver.sh"), str(state)],
        state=state,
        log=state.with_suffix(".log"),
        what="hack/apiserver.sh",
        start_timeout_s=180,
        stop_timeout_s=30,
    ) as facts:
        api = ApiServer(
            Path(facts["KUBECONFIG"]),
            facts["SERVER"],
            facts["TOKEN"],
            Path(facts["CA"]),
            Path(facts["DIR"]),
        )
        try:
            yield api
        finally:
            # hack/apiserver.sh stops the kube-apiserver it started, not one started again.
            for proc in api.restarted:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
