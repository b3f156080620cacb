"""The local cluster of hack/cluster-up.sh, once per session, for the e2e tests (marker: cluster).

The cluster runs in the foreground mode of hack/cluster-up.sh in a temporary directory (kept by
pytest with the logs of every component), with four shared kwok GPU nodes; the session ends it
with SIGTERM, and cluster-up.sh also stops by itself if this process dies. Missing binaries are
a failure that says to run hack/build-binaries.sh, never a skip.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Cluster, NodeGroup, unique

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300
NODES = 4

_running: Cluster | None = None


def _read_state(path: Path) -> dict[str, str]:
    facts = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key] = value
    return facts


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    global _running
    base = tmp_path_factory.mktemp("cluster")
    state = base / "cluster" / "cluster.env"
    log = base / "cluster-up.log"
    env = {
        **os.environ,
        "TL_CLUSTER_DIR": str(state.parent),
        "TL_CLUSTER_NODES": str(NODES),
        "TL_CLUSTER_PARENT_PID": str(os.getpid()),
        "TL_CLUSTER_KEEP_DIR": "true",
    }
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            [str(ROOT / "hack" / "cluster-up.sh"), "-f"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not state.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    "hack/cluster-up.sh did not start the cluster (are the binaries built? run "
                    f"hack/build-binaries.sh). Its log, {log}:\n{log.read_text()[-4000:]}",
                    pytrace=False,
                )
            time.sleep(0.2)
        _running = Cluster.from_state(_read_state(state))
        yield _running
    finally:
        _running = None
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the test's own, deleted (with its pods) afterwards."""
    name = cluster.namespace("e2e")
    yield name
    cluster.kube.delete("Namespace", name)


@pytest.fixture
def group(cluster: Cluster) -> Iterator[NodeGroup]:
    """kwok GPU nodes of the test's own (add them with ``group.add_node``), deleted afterwards."""
    nodes = NodeGroup(cluster, unique("g").removeprefix("g-"))
    yield nodes
    nodes.delete()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failed e2e test, attach the ends of the extender's and kube-scheduler's logs."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and report.when == "call" and _running is not None:
        for name in ("extender.log", "kube-scheduler-default-scheduler.log"):
            report.sections.append((f"cluster log {name}", _running.log_tail(name, 60)))
