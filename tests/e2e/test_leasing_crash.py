"""Right of return through real crashes.

The extender and the controllers are killed with SIGKILL at chosen points of a lend and a
reclaim (tests/hooks/sitecustomize.py: between the extender's ledger write and the Binding,
after the Binding before its answer, after the controllers' scale, tag, notice and status
writes; and once each at a random moment), and each is started again at once as it ran
(tests/processes.Supervisor, as a Deployment's kubelet would), with the real kube-scheduler,
StatefulSet controller and kwok kubelets around them. Each cycle arms one point, in an order
drawn from SEED, then lends two replicas of a 3 x 4 GPU StatefulSet, puts borrowers on exactly
the lent devices and takes them back; the crash happens somewhere in it. Every cycle, each
replica is back on exactly the devices its pod was bound to before (per replica, the API
server's truth), no device is held by two pods, and every bound pod's devices are in its node's
ledger under that pod.

The controllers run in the chart's default mode (the extender mode's leasing).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import contract
from common.objects import parse_gpu_allocation
from tests.e2e import leasingjob
from tests.e2e.harness import Cluster, NodeGroup, devices_of
from tests.e2e.kube import get_text, wait_for
from tests.e2e.leasingjob import Job
from tests.processes import Supervisor

pytestmark = pytest.mark.cluster

HOOKS = Path(__file__).resolve().parents[1] / "hooks"
POINTS = (
    ("extender", "ledger-written"),
    ("extender", "bound"),
    ("controllers", "scaled"),
    ("controllers", "tags-set"),
    ("controllers", "noticed"),
    ("controllers", "status-written"),
)
ROLES = ("extender", "controllers")
SEED = 11


@pytest.fixture(scope="module", autouse=True)
def default_mode(cluster: Cluster) -> Iterator[None]:
    with cluster.controllers_mode(dra=False):
        yield


def arm(cluster: Cluster, role: str, point: str) -> None:
    """Start ``role`` again with the crash hook at ``point``; the supervisor starts it as it
    ran once it dies there."""
    procs = cluster.processes
    spec = procs.specs[role]
    path = ":".join(filter(None, [str(HOOKS), spec.env.get("PYTHONPATH", "")]))
    hooked = {**spec.env, "PYTHONPATH": path, "TIDELEASE_TEST_CRASH_AT": point}
    procs.stop(role)
    procs.start(role, dataclasses.replace(spec, env=hooked))
    procs.specs[role] = spec
    if role == "controllers":
        cluster.wait_controllers_leading()
    else:
        wait_for(lambda: ready(f"{cluster.extender_probe_url}/readyz"), what="the extender ready")


def ready(url: str) -> bool:
    try:
        get_text(url, timeout=2)
    except OSError:  # refused while it starts; 503 (an HTTPError) until it has synced
        return False
    return True


def assert_one_holder_each(cluster: Cluster, job: Job) -> None:
    """No device held by two pods of the cluster; every bound pod of the job's namespace has its
    devices in its node's ledger, under that pod."""
    holders: dict[str, str] = {}
    for pod in cluster.kube.list("Pod"):
        meta = pod["metadata"]
        if not pod["spec"].get("nodeName") or meta.get("deletionTimestamp"):
            continue
        for u in devices_of(pod):
            key = f"{meta['namespace']}/{meta['name']}"
            assert u not in holders, f"{u} held by {holders[u]} and {key}"
            holders[u] = key
    ledgers: dict[str, str] = {}
    for obj in cluster.kube.list(contract.KIND_GPU_ALLOCATION):
        _, allocations = parse_gpu_allocation(obj)
        for a in allocations:
            for u in a.devices:
                assert u not in ledgers, f"{u} in two ledger entries"
                ledgers[u] = a.holder.key
    for u, key in holders.items():
        if key.startswith(f"{job.ns}/"):
            assert ledgers.get(u) == key, f"{key} holds {u}, the ledger says {ledgers.get(u)}"


def test_each_replica_comes_back_through_real_crashes(
    cluster: Cluster, group: NodeGroup, namespace: str
) -> None:
    job = leasingjob.small_job(cluster, group, namespace)
    rng = random.Random(SEED)
    # The chosen points, and a kill of each at a random moment of a cycle (a cycle takes some
    # seconds: a lend, two borrowers bound, a reclaim).
    points = [*POINTS, *((role, f"in:{rng.uniform(0.5, 4.0):.1f}") for role in ROLES)]
    rng.shuffle(points)
    crashes = dict.fromkeys(ROLES, 0)
    with Supervisor(cluster.processes, ROLES) as supervisor:
        for cycle, (role, point) in enumerate(points):
            what = f"cycle {cycle} ({role} at {point})"

            def armed(role: str = role, point: str = point) -> None:
                with supervisor.lock:
                    arm(cluster, role, point)

            job.round_trip(cycle, what=what, before_lend=armed)
            assert_one_holder_each(cluster, job)
            # The crash happened, there: the supervisor started the process again, and the
            # dead one's log says where it died.
            crashes[role] += 1

            def restarted(r: str = role, n: int = crashes[role]) -> bool:
                return supervisor.restarts[r] == n

            wait_for(restarted, what=f"{what}: the crash", timeout=60)
            assert f"crash point {point!r} reached" in supervisor.logs[-1].read_text(), what
    print(f"{len(points)} crashes survived: {crashes}")
