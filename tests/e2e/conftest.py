"""The local cluster of hack/cluster-up.sh, once per session, for the e2e tests (marker: cluster).

The cluster runs in the foreground mode of hack/cluster-up.sh in a temporary directory (kept by
pytest with the logs of every component), with four shared kwok GPU nodes; the session ends it
with SIGTERM, and cluster-up.sh also stops by itself if this process dies. Missing binaries are
a failure that says to run hack/build-binaries.sh, never a skip.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.background import running
from tests.e2e.harness import Cluster, NodeGroup, RealNode, unique

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300
NODES = 4

_running: Cluster | None = None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    global _running
    base = tmp_path_factory.mktemp("cluster")
    # The cluster's own directory is short, whatever pytest's run counter has grown to: a real
    # node's unix sockets live in it, and a socket path holds at most 107 bytes. Linked from
    # pytest's directory, so its logs are found where the rest of the run's are.
    short = Path(tempfile.mkdtemp(prefix="tl-e2e-", dir="/tmp"))
    _prune(short)
    (base / "cluster").symlink_to(short)
    state = short / "cluster.env"
    log = base / "cluster-up.log"
    real = os.environ.get("TIDELEASE_E2E_REAL_NODE", "true")
    env = {
        **os.environ,
        "TL_CLUSTER_DIR": str(state.parent),
        "TL_CLUSTER_NODES": str(NODES),
        "TL_CLUSTER_PARENT_PID": str(os.getpid()),
        "TL_CLUSTER_KEEP_DIR": "true",
        # A pod left pending: kube-scheduler says why, node by node, in its log.
        "TL_CLUSTER_SCHEDULER_VERBOSITY": "2",
        # A second kube-scheduler without extenders (schedulerName tidelease-plain): the DRA
        # tests (test_dra.py) schedule through it, so that no extender plays a part.
        "TL_CLUSTER_PLAIN_SCHEDULER": "true",
        # The controllers' leasing in DRA mode (test_leasing_dra.py); the extender mode's
        # leasing tests run against it too, their pods having no claims.
        "TL_CLUSTER_LEASING_DRA": "true",
        # A real kubelet node beside the kwok ones (hack/realnode.sh; needs root).
        "TL_CLUSTER_REAL_NODE": real,
        # Its 8 fake GPUs on 2 sockets, 2 PCIe switches each (test_real_node.py's topology test).
        "TL_CLUSTER_REAL_NODE_TOPOLOGY": "pcie-2socket-8",
        # And one in DRA mode (hack/realnode.sh -d: containerd 2.x, the agent's ResourceSlice
        # and kubelet DRA plugin; test_real_node_dra.py).
        "TL_CLUSTER_REAL_DRA_NODE": os.environ.get("TIDELEASE_E2E_REAL_DRA_NODE", real),
    }
    try:
        with running(
            [str(ROOT / "hack" / "cluster-up.sh"), "-f"],
            state=state,
            log=log,
            what="hack/cluster-up.sh",
            start_timeout_s=START_TIMEOUT_S,
            stop_timeout_s=120,
            env=env,
        ) as facts:
            _running = Cluster.from_state(facts)
            try:
                yield _running
            finally:
                if "processes" in vars(_running):  # a test took some over: stopped (waited
                    _running.processes.stop_restarted()  # for) before the cluster goes down
    finally:
        _running = None


def _prune(keep: Path, runs: int = 3) -> None:
    """Remove the cluster directories of older runs but the newest ``runs`` (pytest keeps as
    many of its own)."""
    older = sorted(
        (p for p in keep.parent.glob("tl-e2e-*") if p != keep and p.is_dir()),
        key=lambda p: p.stat().st_mtime,
    )
    for old in older[: max(0, len(older) - (runs - 1))]:
        shutil.rmtree(old, ignore_errors=True)


@pytest.fixture
def real_node(cluster: Cluster) -> RealNode:
    """The cluster's real kubelet node; a failure (never a skip) when it has none."""
    if cluster.real_node is None:
        pytest.fail("the cluster has no real node (TIDELEASE_E2E_REAL_NODE=false?)", pytrace=False)
    return cluster.real_node


@pytest.fixture
def real_dra_node(cluster: Cluster) -> RealNode:
    """The cluster's real kubelet node in DRA mode; a failure (never a skip) when it has none."""
    if cluster.real_dra_node is None:
        pytest.fail(
            "the cluster has no real DRA node (TIDELEASE_E2E_REAL_DRA_NODE=false?)", pytrace=False
        )
    return cluster.real_dra_node


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
    """On a failed e2e test, attach the ends of the logs of tidelease's processes (the live
    ones: a test may have restarted them), kube-scheduler's and the real nodes'."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and report.when == "call" and _running is not None:
        for name in (
            _running.latest_log("extender"),
            _running.latest_log("controllers"),
            "kube-scheduler-default-scheduler.log",
            "realnode.log",
            "realnode/kubelet.log",
            "realnode/agent.log",
            "realdra.log",
            "realdra/kubelet.log",
            "realdra/agent.log",
            "realdra/containerd.log",
        ):
            report.sections.append((f"cluster log {name}", _running.log_tail(name, 60)))
