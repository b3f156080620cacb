"""Run a hack/ script in the background until it reports ready in a state file; stop it after.

``hack/apiserver.sh`` and ``hack/cluster-up.sh -f`` both write KEY=VALUE lines to a state file
once ready and clean up on SIGTERM; the test fixtures start them through :func:`running`.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest


def read_state(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of a state file."""
    facts = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key] = value
    return facts


@contextmanager
def running(
    command: Sequence[str],
    *,
    state: Path,
    log: Path,
    what: str,
    start_timeout_s: float,
    stop_timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> Iterator[dict[str, str]]:
    """The state file's facts while ``command`` runs; a failure (never a skip) naming the log
    when it does not get ready."""
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            list(command),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
        )
    try:
        deadline = time.monotonic() + start_timeout_s
        while not state.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"{what} did not start (are the binaries built? run hack/build-binaries.sh)."
                    f" Its log, {log}:\n{log.read_text()[-4000:]}",
                    pytrace=False,
                )
            time.sleep(0.2)
        yield read_state(state)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
