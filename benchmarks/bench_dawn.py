"""Dawn at scale: every GpuLease reclaims at once, on a cluster of many kwok nodes.

Online jobs: ``--leases`` StatefulSets (2-8 replicas of 4 or 8 GPUs each, sizes spread over the
leases) with their GpuLeases (notice ``graceSeconds`` 30, the CRD's minimum), placed through
the extender. Each lends all its replicas but the first; borrowers then fill every free GPU of
the nodes holding lent devices, so every lent device is borrowed. Then the tide rises: every
lease's ``desiredGPUs`` is raised back at once, and two watches (pods and GpuLeases) time, per
lease, from its notice (the first sign of its reclaim: the lease's ``status.reclaim`` or a
borrower's ``tidelease.io/reclaim-notice``):

- **gone**: the last borrower on its lent devices deleted;
- **home**: every returning replica bound on exactly the devices it lent (the pods' own
  annotations, the API server's truth);
- **steady**: the lease ``Steady`` with its reclaim counted.

Printed per round: p50, p99 and max over the leases of each, the leases past grace + 15 s
(steady), the leases ever ``Degraded``, the controllers' and the API server's CPU over the dawn
(cores: CPU seconds per wall second, raise to the last lease steady), and the API server's
requests per reclaim (``apiserver_request_total``'s increase over the dawn, all clients, the
benchmark's own raise patches and watches included), the mutating ones by resource.

``--compare KEY=VALUE,...``: each round runs twice, the controllers as they are and restarted
with those settings (``TIDELEASE_EXTENDER_<KEY>``; docs/reference.md), the pair's order
reversed every other round (these machines' noise drifts); the ratios of the medians are
printed.

    python -m benchmarks.bench_dawn [--nodes 1250] [--leases 50] [--rounds 1]
                                    [--compare KEY=VALUE,...] [--state DIR/cluster.env]
                                    [--json FILE] [--profile DIR] [--logs DIR] [--smoke]

``--profile DIR``: py-spy samples the controllers' and the extender's processes during each
dawn (DIR/<process>-<phase>-r<round>.txt, collapsed stacks), and the run prints their summary.

Without ``--state`` it starts a local cluster of its own (hack/cluster-up.sh, ``--nodes`` kwok
GPU nodes of 8 GPUs, no real node, the notice as the leases say: no test grace). With
``--state`` (a running cluster's cluster.env) the leases are kept to kwok nodes of their own (a
node group), and the cluster's notice setting applies (the e2e cluster's: 2 s). ``--smoke``: 2
leases on the given cluster (the test command runs it on the e2e cluster:
tests/e2e/test_bench_dawn_smoke.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import queue
import ssl
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from common import builders, contract
from common.model import Priority, Tier
from common.tenancy import LABEL_ONLINE
from tests.background import read_state
from tests.benchtools import cpu_s, profile_summary, profiling, quantile, settings_pairs
from tests.e2e.harness import (
    BORROWER,
    ONLINE,
    Cluster,
    NodeGroup,
    devices_of,
    local_cluster,
    workload,
)
from tests.e2e.kube import path_of, wait_for

ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 30  # the CRD's minimum graceSeconds
SLACK_S = 15  # the target: every reclaim steady within grace + this
NODE_GPUS = 8
SETUP_TIMEOUT_S = 900


@dataclass(frozen=True)
class LeaseShape:
    name: str
    replicas: int
    gpus: int  # per replica

    @property
    def total(self) -> int:
        return self.replicas * self.gpus


def shapes(count: int) -> list[LeaseShape]:
    """2-8 replicas of 4 or 8 GPUs, spread over the leases (the same every run)."""
    return [LeaseShape(f"job-{i:03d}", 2 + (i * 3) % 7, 8 if i % 2 else 4) for i in range(count)]


@dataclass
class LeaseTimes:
    """Monotonic times of one lease's dawn (0: not seen)."""

    noticed: float = 0.0
    gone: float = 0.0
    home: float = 0.0
    steady: float = 0.0
    degraded: bool = False


@dataclass
class Round:
    name: str  # "baseline" or "variant"
    round: int
    leases: int
    lent_gpus: int
    borrowed_lent_gpus: int
    borrowers: int
    gone_s: list[float] = field(default_factory=list)  # per lease, from its notice
    home_s: list[float] = field(default_factory=list)
    steady_s: list[float] = field(default_factory=list)
    unfinished: int = 0
    late: int = 0  # steady past grace + SLACK_S
    degraded: int = 0
    wall_s: float = 0.0
    controllers_cores: float = 0.0
    apiserver_cores: float = 0.0
    requests_per_reclaim: float = 0.0
    mutating_by_resource: dict[str, float] = field(default_factory=dict)


def api_requests(cluster: Cluster) -> dict[tuple[str, str], float]:
    """apiserver_request_total summed by (verb, resource[/subresource])."""
    req = urllib.request.Request(
        f"{cluster.server}/metrics", headers={"Authorization": f"Bearer {cluster.token}"}
    )
    tls = ssl.create_default_context(cafile=str(cluster.ca))
    with urllib.request.urlopen(req, timeout=30, context=tls) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            key = (labels.get("verb", ""), resource)
            out[key] = out.get(key, 0.0) + sample.value
    return out


# --- the cluster ---


@contextlib.contextmanager
def cluster_of(
    state: Path | None, nodes: int, logs: Path | None = None
) -> Iterator[tuple[Cluster, dict[str, str]]]:
    """The running cluster ``state`` describes, or one of its own for the run (its components'
    logs copied to ``logs`` at the end, if given)."""
    if state is not None:
        facts = read_state(state)
        yield Cluster.from_state(facts), facts
        return
    env = {
        "TL_CLUSTER_NODES": str(nodes),
        "TL_CLUSTER_REAL_NODE": "false",
        "TL_CLUSTER_REAL_DRA_NODE": "false",
        "TL_CLUSTER_SCHEDULER_QPS": "500",
        "TL_CLUSTER_SCHEDULER_BURST": "1000",
        # The leases' own notice (30 s), not the test clusters' 2 s.
        "TL_CLUSTER_LEASING_GRACE_S": "",
        # Many kwok nodes renewing 40 s leases every 10 s would be most of the API traffic.
        "TL_CLUSTER_NODE_LEASE_S": "240",
        "TL_CLUSTER_NODE_GRACE": "600s",
        "TL_CLUSTER_READY_TIMEOUT": "900",
    }
    with local_cluster("tidelease-bench-dawn.", env, start_timeout_s=1800, logs=logs) as facts:
        yield Cluster.from_state(facts), facts


# --- one dawn ---


class Dawn:
    """One round: the jobs placed, lent, borrowed from, then all raised at once."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        leases: list[LeaseShape],
        place: Callable[[dict[str, Any]], None],
    ) -> None:
        self.cluster, self.kube, self.ns = cluster, cluster.kube, namespace
        self.leases = leases
        self.place = place  # adds what keeps a pod on the run's nodes
        self.before: dict[str, tuple[str, list[str]]] = {}  # replica pod -> (node, devices)
        self.lent: dict[str, dict[str, list[str]]] = {}  # lease -> replica -> devices
        self.borrowers: dict[str, set[str]] = {}  # lease -> borrower pods on its lent devices

    def pods(self) -> list[dict[str, Any]]:
        return [
            p for p in self.kube.list("Pod", self.ns) if not p["metadata"].get("deletionTimestamp")
        ]

    def setup(self) -> None:
        kube = self.kube
        kube.create(
            {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": self.ns, "labels": {LABEL_ONLINE: "true"}}}
        )  # fmt: skip
        for shape in self.leases:
            template = builders.pod(
                "template", shape.gpus, namespace=self.ns, priority=Priority.HIGH,
                owner=shape.name, tier=Tier.HA, priority_class=ONLINE,
            )  # fmt: skip
            template["spec"]["terminationGracePeriodSeconds"] = 0
            self.place(template)
            kube.create(
                workload("StatefulSet", shape.name, self.ns, template, replicas=shape.replicas)
            )
            kube.create(
                builders.gpu_lease(
                    shape.name, self.ns, gpus_per_replica=shape.gpus,
                    desired_gpus=shape.total, grace_s=GRACE_S,
                )
            )  # fmt: skip
        want = {f"{s.name}-{k}" for s in self.leases for k in range(s.replicas)}

        def placed() -> bool:
            got = {
                p["metadata"]["name"]: (p["spec"]["nodeName"], sorted(devices_of(p)))
                for p in self.pods()
                if p["spec"].get("nodeName") and devices_of(p)
            }
            if set(got) >= want:
                self.before = {n: got[n] for n in want}
                return True
            return False

        wait_for(placed, what=f"{len(want)} replicas placed", timeout=SETUP_TIMEOUT_S, interval=2)

    def lend(self) -> None:
        for shape in self.leases:
            self.kube.patch(
                contract.KIND_GPU_LEASE, shape.name, {"spec": {"desiredGPUs": shape.gpus}}, self.ns
            )

        def lent() -> bool:
            for shape in self.leases:
                status = self.lease(shape.name).get("status") or {}
                groups = status.get("lent") or []
                if status.get("phase") != "Steady" or len(groups) != shape.replicas - 1:
                    return False
                self.lent[shape.name] = {g["replica"]: sorted(g["devices"]) for g in groups}
            return True

        wait_for(lent, what="every lease lent", timeout=SETUP_TIMEOUT_S, interval=2)
        for shape in self.leases:
            for replica, devices in self.lent[shape.name].items():
                assert devices == self.before[replica][1], (replica, devices, self.before[replica])

    def lease(self, name: str) -> dict[str, Any]:
        lease = self.kube.get(contract.KIND_GPU_LEASE, name, self.ns)
        assert lease is not None
        return lease

    def borrow(self) -> tuple[int, int]:
        """Borrowers on every free GPU of the nodes holding lent devices: (lent GPUs, of them
        borrowed)."""
        lent_nodes = {self.before[r][0] for groups in self.lent.values() for r in groups}
        used: dict[str, int] = {}
        for p in self.kube.list("Pod"):
            if p["spec"].get("nodeName") in lent_nodes and not p["metadata"].get(
                "deletionTimestamp"
            ):
                node = p["spec"]["nodeName"]
                used[node] = used.get(node, 0) + len(devices_of(p))
        names: list[str] = []
        for node in sorted(lent_nodes):
            free = NODE_GPUS - used.get(node, 0)
            for size in (8, 4, 2, 1):
                while free >= size:
                    name = f"borrower-{len(names):04d}"
                    pod = builders.pod(
                        name, size, namespace=self.ns, priority=Priority.LOW,
                        priority_class=BORROWER,
                    )  # fmt: skip
                    pod["metadata"].pop("uid")
                    pod.pop("status")
                    pod["spec"]["terminationGracePeriodSeconds"] = 0
                    self.place(pod)
                    pod["spec"].setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node
                    self.kube.create(pod)
                    names.append(name)
                    free -= size
        held: dict[str, set[str]] = {}

        def bound() -> bool:
            got = {
                p["metadata"]["name"]: set(devices_of(p))
                for p in self.pods()
                if p["metadata"]["name"].startswith("borrower-") and devices_of(p)
            }
            if set(got) >= set(names):
                held.update(got)
                return True
            return False

        wait_for(bound, what=f"{len(names)} borrowers bound", timeout=SETUP_TIMEOUT_S, interval=2)
        lent_total = borrowed = 0
        for lease, groups in self.lent.items():
            devices = {u for d in groups.values() for u in d}
            lent_total += len(devices)
            self.borrowers[lease] = {n for n, d in held.items() if d & devices}
            borrowed += len({u for n in self.borrowers[lease] for u in held[n]} & devices)
        return lent_total, borrowed

    def rise(self, timeout_s: float) -> dict[str, LeaseTimes]:
        """Every lease raised at once; each one's times, from two watches."""
        times = {s.name: LeaseTimes() for s in self.leases}
        leases_of: dict[str, set[str]] = {}  # borrower -> the leases whose lent devices it holds
        for lease, bs in self.borrowers.items():
            for b in bs:
                leases_of.setdefault(b, set()).add(lease)
        left = {lease: set(bs) for lease, bs in self.borrowers.items()}
        returning = {lease: set(groups) for lease, groups in self.lent.items()}
        events: queue.Queue[tuple[float, str, str, dict[str, Any]]] = queue.Queue()
        stop = threading.Event()

        def watch(kind: str, version: str) -> None:
            with contextlib.suppress(Exception):
                for event, obj in self.kube.watch(kind, self.ns, version, int(timeout_s) + 60):
                    events.put((time.monotonic(), kind, event, obj))
                    if stop.is_set():
                        return

        for kind in ("Pod", contract.KIND_GPU_LEASE):
            listed = self.kube.request("GET", path_of(kind, namespace=self.ns) + "?limit=1")
            version = listed["metadata"]["resourceVersion"]
            threading.Thread(target=watch, args=(kind, version), daemon=True).start()

        def raise_one(shape: LeaseShape) -> None:
            self.kube.patch(
                contract.KIND_GPU_LEASE, shape.name, {"spec": {"desiredGPUs": shape.total}},
                self.ns,
            )  # fmt: skip

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(raise_one, self.leases))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(t.steady for t in times.values()):
            try:
                at, kind, event, obj = events.get(timeout=1)
            except queue.Empty:
                continue
            name = obj["metadata"]["name"]
            if kind == contract.KIND_GPU_LEASE:
                t = times.get(name)
                status = obj.get("status") or {}
                if t is None:
                    continue
                if status.get("reclaim") and not t.noticed:
                    t.noticed = at
                if any(
                    c.get("type") == "Degraded" and c.get("status") == "True"
                    for c in status.get("conditions") or []
                ):
                    t.degraded = True
                if status.get("phase") == "Steady" and (status.get("reclaims") or 0) >= 1:
                    t.steady = t.steady or at
                continue
            annotations = obj["metadata"].get("annotations") or {}
            if name in leases_of:
                for lease in leases_of[name]:
                    t = times[lease]
                    if contract.ANN_RECLAIM_NOTICE in annotations and not t.noticed:
                        t.noticed = at
                    if event == "DELETED":
                        left[lease].discard(name)
                        if not left[lease]:
                            t.gone = at
                continue
            lease = name.rsplit("-", 1)[0]
            if name in returning.get(lease, ()) and event != "DELETED":
                home = self.before[name]
                if (obj["spec"].get("nodeName"), sorted(devices_of(obj))) == home:
                    returning[lease].discard(name)
                    if not returning[lease]:
                        times[lease].home = at
        stop.set()
        for lease, t in times.items():
            if not self.borrowers.get(lease):
                t.gone = t.gone or t.noticed  # nothing to evict
        return times

    def teardown(self) -> None:
        self.kube.delete("Namespace", self.ns)
        wait_for(
            lambda: self.kube.get("Namespace", self.ns) is None,
            what=f"namespace {self.ns} gone",
            timeout=SETUP_TIMEOUT_S,
            interval=2,
        )


def run_round(
    cluster: Cluster,
    facts: dict[str, str],
    name: str,
    index: int,
    leases: list[LeaseShape],
    place: Callable[[dict[str, Any]], None],
    controllers_pid: int,
    profile: Path | None,
) -> Round:
    dawn = Dawn(cluster, f"bench-dawn-{name}-{index}", leases, place)
    try:
        dawn.setup()
        dawn.lend()
        lent, borrowed = dawn.borrow()
        apiserver_pid = int(facts["TL_CLUSTER_APISERVER_PID"])
        requests0 = api_requests(cluster)
        cpu0 = {"controllers": cpu_s(controllers_pid), "apiserver": cpu_s(apiserver_pid)}
        t0 = time.monotonic()
        profiled = {
            "controllers": controllers_pid,
            "extender": cluster.extender_pid,
        }
        with profiling(profile, profiled, f"{name}-r{index}"):
            times = dawn.rise(timeout_s=GRACE_S + 300)
        t1 = max([t.steady for t in times.values() if t.steady] or [time.monotonic()])
        wall = max(t1 - t0, 1e-6)
        cpu1 = {"controllers": cpu_s(controllers_pid), "apiserver": cpu_s(apiserver_pid)}
        requests1 = api_requests(cluster)
    finally:
        dawn.teardown()
    delta = {k: v - requests0.get(k, 0.0) for k, v in requests1.items()}
    mutating: dict[str, float] = {}
    for (verb, resource), n in delta.items():
        if verb in {"POST", "PUT", "PATCH", "DELETE", "APPLY"} and n > 0:
            mutating[resource] = mutating.get(resource, 0.0) + n / len(leases)
    done = [t for t in times.values() if t.steady and t.noticed]
    return Round(
        name=name,
        round=index,
        leases=len(leases),
        lent_gpus=lent,
        borrowed_lent_gpus=borrowed,
        borrowers=sum(len(b) for b in dawn.borrowers.values()),
        gone_s=[t.gone - t.noticed for t in done if t.gone],
        home_s=[t.home - t.noticed for t in done if t.home],
        steady_s=[t.steady - t.noticed for t in done],
        unfinished=len(leases) - len(done),
        late=sum(1 for t in done if t.steady - t.noticed > GRACE_S + SLACK_S),
        degraded=sum(1 for t in times.values() if t.degraded),
        wall_s=round(wall, 1),
        controllers_cores=round((cpu1["controllers"] - cpu0["controllers"]) / wall, 2),
        apiserver_cores=round((cpu1["apiserver"] - cpu0["apiserver"]) / wall, 2),
        requests_per_reclaim=round(sum(delta.values()) / len(leases), 1),
        mutating_by_resource={k: round(v, 1) for k, v in sorted(mutating.items())},
    )


def report(r: Round, grace_s: str) -> list[str]:
    def q(xs: list[float]) -> str:
        return (
            f"{quantile(xs, 0.5):6.1f} {quantile(xs, 0.99):6.1f} {max(xs or [float('nan')]):6.1f}"
        )

    return [
        f"{r.name} round {r.round}: {r.leases} leases, {r.lent_gpus} GPUs lent, "
        f"{r.borrowed_lent_gpus} of them borrowed by {r.borrowers} borrowers; notice {grace_s}",
        f"  {'from notice, s':18} {'p50':>6} {'p99':>6} {'max':>6}",
        f"  {'last borrower gone':18} {q(r.gone_s)}",
        f"  {'replicas home':18} {q(r.home_s)}",
        f"  {'lease Steady':18} {q(r.steady_s)}",
        f"  unfinished {r.unfinished}, steady past grace + {SLACK_S} s: {r.late}, "
        f"Degraded: {r.degraded}",
        f"  dawn {r.wall_s} s: controllers {r.controllers_cores} cores, API server "
        f"{r.apiserver_cores} cores; API requests per reclaim {r.requests_per_reclaim} "
        f"(mutating, by resource: "
        + ", ".join(f"{k} {v}" for k, v in r.mutating_by_resource.items())
        + ")",
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--nodes", type=int, default=1250, help="kwok nodes of a cluster of its own")
    p.add_argument("--leases", type=int, default=50)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--compare", type=settings_pairs, default={}, metavar="KEY=VALUE,...")
    p.add_argument("--state", type=Path, help="a running cluster's cluster.env")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--smoke", action="store_true", help="2 leases on the --state cluster")
    p.add_argument(
        "--logs", type=Path, help="copy the own cluster's logs (controllers, ...) here at the end"
    )
    p.add_argument(
        "--profile",
        type=Path,
        help="py-spy the controllers and the extender during each dawn into this directory",
    )
    args = p.parse_args()
    leases = shapes(2 if args.smoke else args.leases)
    need = sum(s.total for s in leases)
    rounds: list[Round] = []
    with cluster_of(args.state, args.nodes, args.logs) as (cluster, facts):
        group: NodeGroup | None = None
        place: Callable[[dict[str, Any]], None] = lambda pod: None  # noqa: E731
        if args.state is not None:
            # Nodes of the run's own: the cluster's shared ones hold other tests' pods.
            group = NodeGroup(cluster, f"dawn{os.getpid()}")
            for i in range(-(-need // NODE_GPUS) + 1):
                group.add_node(str(i), lambda n: builders.devices(n, NODE_GPUS))
            group.wait_ready()

            def place(pod: dict[str, Any]) -> None:
                assert group is not None
                kept = group.pod("x", "x", 1)["spec"]
                pod["spec"]["nodeSelector"] = dict(kept["nodeSelector"])
                pod["spec"]["tolerations"] = kept["tolerations"]

        grace = facts.get("TL_CLUSTER_LEASING_GRACE_S") or f"{GRACE_S} s (the leases')"
        if grace.isdigit():
            grace = f"{grace} s (the cluster's test setting)"
        try:
            for index in range(args.rounds):
                order = ["baseline", "variant"] if args.compare else ["baseline"]
                if index % 2:
                    order.reverse()
                for name in order:
                    settings = args.compare if name == "variant" else {}
                    env = {f"TIDELEASE_EXTENDER_{k.upper()}": v for k, v in settings.items()}
                    with cluster.controllers_with(env) as pid:
                        r = run_round(cluster, facts, name, index, leases, place, pid, args.profile)
                    rounds.append(r)
                    print("\n".join(report(r, grace)), flush=True)
                    for what in ("controllers", "extender") if args.profile else ():
                        path = args.profile / f"{what}-{name}-r{index}.txt"
                        print(f"  profile of the {what} during the dawn, {path.name}:")
                        print("\n".join(f"    {line}" for line in profile_summary(path)))
        finally:
            if group is not None:
                group.delete()
    if args.compare:
        for what in ("steady_s", "home_s", "gone_s"):
            med = {
                n: statistics.median(
                    statistics.median(getattr(r, what)) for r in rounds if r.name == n
                )
                for n in ("baseline", "variant")
            }
            print(f"variant/baseline, median {what}: {med['variant'] / med['baseline']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rounds], indent=2))
    ok = all(r.unfinished == 0 for r in rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
