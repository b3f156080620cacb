"""A real kube-apiserver and etcd (hack/apiserver.sh) for the tests of the API-server client."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ApiServer:
    kubeconfig: Path
    server: str
    token: str
    ca: Path


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    state = tmp_path_factory.mktemp("apiserver") / "state.env"
    log = state.with_suffix(".log")
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            [str(ROOT / "hack" / "apiserver.sh"), str(state)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while not state.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    "hack/apiserver.sh did not start a kube-apiserver (are the binaries built? "
                    f"run hack/build-binaries.sh):\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.2)
        facts = dict(line.split("=", 1) for line in state.read_text().splitlines() if line)
        yield ApiServer(
            Path(facts["KUBECONFIG"]), facts["SERVER"], facts["TOKEN"], Path(facts["CA"])
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
