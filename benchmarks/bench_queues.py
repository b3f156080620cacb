"""The shared queues live: an interactive pod's creation to its placement on the local cluster,
through the queues against the same pod without them, in the same run, phases alternated.

A kwok node of 8 GPUs is full of a batch Deployment's four 2-GPU pods (class batch). Each
arrival is a 2-GPU pod of the interactive PriorityClass (it preempts a batch pod):

- queued: it declares the interactive class, so the chart's gate policy holds it at creation
  and the queues controller releases it (queue 1 first), then kube-scheduler places it through
  the extender, preempting a batch pod;
- plain (the baseline): the same pod without a class: kube-scheduler's preemption alone.

After each arrival the pod is deleted and the batch job waited for whole again (its evicted pod
gated, then released into the freed GPUs). Arrivals alternate queued and plain, the pair's order
reversed every other arrival (these machines' noise drifts). Printed: per phase the median, p90
and max, and the ratio of the medians (queued / plain): what the queues cost an interactive
pod. Cornucopia's target is a second from arrival to placement; the exit status is 1 when the
queued median misses it (not in ``--smoke``).

    python -m benchmarks.bench_queues [--arrivals 20] [--state DIR/cluster.env] [--smoke]

Without ``--state`` it starts a local cluster of its own (hack/cluster-up.sh, two kwok GPU nodes,
in a temporary directory). ``--smoke``: two arrivals of each kind (the test command runs it on
the e2e cluster: tests/e2e/test_bench_queues_smoke.py).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.background import read_state
from tests.e2e import queuesrig
from tests.e2e.harness import Cluster, NodeGroup, local_cluster

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.0


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


@contextlib.contextmanager
def cluster_of(state: Path | None) -> Iterator[Cluster]:
    """The running cluster ``state`` describes, or one of its own for the run."""
    if state is not None:
        yield Cluster.from_state(read_state(state))
        return
    env = {
        "TL_CLUSTER_NODES": "2",
        "TL_CLUSTER_REAL_NODE": "false",
        "TL_CLUSTER_REAL_DRA_NODE": "false",
    }
    with local_cluster("tidelease-bench-queues.", env) as facts:
        yield Cluster.from_state(facts)


def measure(cluster: Cluster, arrivals: int, workdir: Path) -> dict[str, list[float]]:
    """Seconds from creation to placement of ``arrivals`` pods of each kind, alternated."""
    times: dict[str, list[float]] = {"queued": [], "plain": []}
    namespace = cluster.namespace("bench-q")
    group = NodeGroup(cluster, namespace.removeprefix("bench-q-"))
    thresholds = {"queue_interval_s": "1"}
    try:
        with (
            queuesrig.gate(cluster, namespace),
            queuesrig.queues_controller(cluster, workdir / "queues.log", thresholds),
        ):
            queuesrig.fill_node(cluster, group, namespace)
            for i in range(arrivals):
                order = ("queued", "plain") if i % 2 == 0 else ("plain", "queued")
                for kind in order:
                    took, _ = queuesrig.arrival(
                        cluster, group, namespace, f"{kind}-{i}", queued=kind == "queued"
                    )
                    times[kind].append(took)
    finally:
        cluster.kube.delete("Namespace", namespace)
        group.delete()
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--arrivals", type=int, default=20, help="of each kind")
    p.add_argument("--state", type=Path, help="a running cluster's cluster.env")
    p.add_argument("--smoke", action="store_true", help="two arrivals of each kind")
    args = p.parse_args()
    arrivals = 2 if args.smoke else args.arrivals
    with tempfile.TemporaryDirectory() as work, cluster_of(args.state) as cluster:
        times = measure(cluster, arrivals, Path(work))
    print(f"interactive 2-GPU pod, creation to placement, {arrivals} arrivals of each kind:")
    print(f"{'phase':8} {'median s':>9} {'p90 s':>7} {'max s':>7}")
    for kind in ("queued", "plain"):
        xs = times[kind]
        med, p90 = statistics.median(xs), percentile(xs, 0.9)
        print(f"{kind:8} {med:9.3f} {p90:7.3f} {max(xs):7.3f}")
    queued, plain = statistics.median(times["queued"]), statistics.median(times["plain"])
    print(f"ratio queued/plain (medians): {queued / plain:.2f}")
    verdict = queued <= TARGET_S
    print(f"target: queued median <= {TARGET_S:g} s: {'met' if verdict else 'missed'}")
    return 0 if verdict or args.smoke else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
