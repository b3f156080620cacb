"""Right of return belongs to the tenant (docs/tenancy.md), on the local cluster.

Namespace A, granted online jobs by the admin, runs the online job ``recsys`` (a StatefulSet of
4 x 4 GPUs and its GpuLease) and lends half of it. A tenant of namespace B, with the built-in
``edit`` role there and nothing else (requests made as that user), uses every annotation, label
and PriorityClass it can write to take what A lent:

* a pod with ``tidelease.io/priority: high``, A's job name and the online PriorityClass;
* a pod with the online PriorityClass alone;
* borrowers named for A's job on A's lent devices (borrowing is what lending is for), then a
  pod with ``tidelease.io/reclaim: "true"`` for the standby devices;
* on its running borrower, ``priority`` raised to ``high`` and ``tidelease.io/devices``
  rewritten after admission;
* a pod of the shared queues whose scheduling gate it removes itself.

With the chart's admission policies on, each is refused at the API server with its reason.
With them off, the extender and the controllers alone refuse them: the pods stay Pending with
the same reason, and what was changed on the borrower has no effect. Each time A raises its
lease again: B's borrowers get their notice and are evicted, whatever they wrote, and A's
replicas come back on their own UUIDs, replica by replica, as the API server's ledgers say.

The policies are the chart's (common.admissionpolicy, as `helm install` applies them), trusting
tidelease's ServiceAccounts, as whom its components run here, and the admin's user, as whom the
local cluster's kube-controller-manager runs outside it.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from common import admissionpolicy, builders, contract, tenancy
from common.model import Priority
from common.queryscope import scope_query
from tests.e2e.harness import BORROWER, ONLINE, Cluster, NodeGroup, parked_pod, workload
from tests.e2e.kube import ApiError, Kube, wait_for
from tests.e2e.queuesrig import queues_controller
from tests.e2e.test_leasing import REPLICA_GPUS, Job

pytestmark = pytest.mark.cluster

TENANT = "tenant-b"
# The user the local cluster's kube-controller-manager (its StatefulSet and Deployment
# controllers create the workloads' pods) and the tests' own set-up run as
# (hack/lib/controlplane.sh); tidelease's extender and controllers run as the chart's
# ServiceAccounts (hack/lib/cluster.sh), which the policies trust by default.
COMPONENTS = "tidelease-admin"
QUEUE_WAIT = "waiting for the shared queues to release it"


@pytest.fixture
def tenancy_job(cluster: Cluster, group: NodeGroup) -> Iterator[tuple[Job, str]]:
    """A's job on two 8-GPU nodes and a 4-GPU standby node; B's namespace, not granted."""
    cluster.ensure_priority_class(BORROWER, 10)
    for suffix in ("n1", "n2"):
        group.add_node(suffix, lambda name: builders.devices(name, 8))
    group.add_node("s1", lambda name: builders.devices(name, 4, standby=True))
    group.wait_ready()
    ns_a = cluster.namespace("ten-a")
    ns_b = cluster.namespace("ten-b", online=False)
    cluster.kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit", "namespace": ns_b},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}],
        }
    )
    try:
        yield Job(cluster, group, ns_a), ns_b
    finally:
        for ns in (ns_a, ns_b):
            cluster.kube.delete("Namespace", ns)


def policy_probes(namespace: str) -> dict[str, dict[str, Any]]:
    """For each of the chart's policies, a pod it alone refuses at creation in ``namespace``
    (not granted online jobs), by anyone: a reliability tier that is none, a high priority, an
    annotation only tidelease writes. Never placed (a node selector no node has)."""

    def probe(name: str, **kwargs: Any) -> dict[str, Any]:
        return parked_pod(name, namespace, **kwargs)

    return {
        admissionpolicy.POLICY_NAME: probe(
            "probe-tier", extra_annotations={contract.ANN_RELIABILITY: "no-such-tier"}
        ),
        admissionpolicy.ONLINE_POLICY_NAME: probe("probe-high", priority=Priority.HIGH),
        admissionpolicy.WRITTEN_POLICY_NAME: probe(
            "probe-written", extra_annotations={contract.ANN_DEVICES: "GPU-probe"}
        ),
    }


def wait_enforced(cluster: Cluster, enforced: bool) -> None:
    """Until the API server refuses, or admits, each policy's probe pod. It loads every policy
    and binding on its own in the background, so one in force says nothing of the others (a
    clean-clone run saw the written-annotations policy not yet in force after the first was)."""
    namespace = cluster.namespace("ten-probe", online=False)
    probes = policy_probes(namespace)

    def settled(policy: str) -> bool:
        pod = probes[policy]
        try:
            cluster.kube.create(pod)
        except ApiError as e:
            if e.status not in (403, 422) or policy not in e.message:
                raise
            return enforced
        cluster.kube.delete("Pod", pod["metadata"]["name"], namespace)
        return not enforced

    try:
        for policy in probes:
            wait_for(
                functools.partial(settled, policy),
                what=f"{policy} {'on' if enforced else 'off'}",
                timeout=30,
            )
    finally:
        cluster.kube.delete("Namespace", namespace)


@pytest.fixture
def policies(cluster: Cluster) -> Iterator[None]:
    """The chart's admission policies, applied as `helm install` would."""
    objects = admissionpolicy.objects(online_class=ONLINE, trusted_users=(COMPONENTS,))
    for obj in objects:
        cluster.kube.create(obj)
    try:
        wait_enforced(cluster, True)
        yield
    finally:
        for obj in reversed(objects):
            cluster.kube.delete(obj["kind"], obj["metadata"]["name"])
        wait_enforced(cluster, False)


def tenant_pod(job: Job, ns: str, name: str, **kwargs: Any) -> dict[str, Any]:
    """A pod of B on A's job's nodes, as the tenant writes it."""
    return job.group.pod(ns, name, REPLICA_GPUS, **kwargs)


def impostor_pod(job: Job, ns: str) -> dict[str, Any]:
    """High priority, A's job name and the online class: what would take A's lent devices."""
    return tenant_pod(
        job, ns, "impostor", priority=Priority.HIGH, owner="recsys", priority_class=ONLINE
    )


def classed_pod(job: Job, ns: str) -> dict[str, Any]:
    """The online PriorityClass alone."""
    return tenant_pod(job, ns, "classed", priority=Priority.LOW, priority_class=ONLINE)


def grab_pod(job: Job, ns: str) -> dict[str, Any]:
    """A borrower that says it reclaims, named for A's job: after the standby devices."""
    return tenant_pod(
        job,
        ns,
        "grab",
        priority=Priority.LOW,
        owner="recsys",
        reclaim=True,
        priority_class=BORROWER,
    )


def queued_pod(job: Job, ns: str) -> dict[str, Any]:
    """A pod of the shared queues, created at their gate (NodeGroup.pod sets it)."""
    return tenant_pod(
        job,
        ns,
        "queued",
        priority=Priority.LOW,
        priority_class=BORROWER,
        extra_annotations={contract.ANN_JOB_CLASS: "batch"},
    )


def refusal(call: Any, status: int, *contains: str) -> str:
    """The API server's refusal of ``call()``: its status and message."""
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.status == status, e.value
    for text in contains:
        assert text in e.value.message, e.value.message
    return e.value.message


def ledger_devices(cluster: Cluster, uid: str) -> list[str]:
    """The devices the API server's ledgers give the pod ``uid``: the truth of who holds what."""
    held: list[str] = []
    for ledger in cluster.kube.list(contract.KIND_GPU_ALLOCATION):
        for entry in (ledger.get("spec") or {}).get("allocations") or []:
            if entry.get("podUID") == uid:
                held += entry.get("devices") or []
    return held


def borrow_as_tenant(job: Job, tenant: Kube, ns_b: str, lent: set[str]) -> dict[str, str]:
    """B's two borrowers, owner A's job name, on A's lent devices: their UIDs by name."""
    for i in range(2):
        tenant.create(
            tenant_pod(
                job, ns_b, f"b-{i}", priority=Priority.LOW, owner="recsys", priority_class=BORROWER
            )
        )
    uids = {}
    for i in range(2):
        pod = job.cluster.wait_bound(ns_b, f"b-{i}")
        uids[pod["metadata"]["name"]] = pod["metadata"]["uid"]
    held = {u for uid in uids.values() for u in ledger_devices(job.cluster, uid)}
    assert held == lent, (held, lent)  # they borrow exactly what A lent: nothing else is free
    return uids


def reclaim_returns_each_replica(job: Job, ns_b: str, groups: dict[str, list[str]]) -> None:
    """A raises its lease: B's borrowers are noticed and evicted, and each returning replica
    is bound to exactly the devices it lent, by the ledgers, with no device held twice."""
    reclaims = (job.lease().get("status") or {}).get("reclaims") or 0
    job.reclaim(reclaims=reclaims + 1)
    placed = job.replicas_placed(4)
    for replica, devices in groups.items():
        uid = job.cluster.pod(job.ns, replica)["metadata"]["uid"]
        assert sorted(ledger_devices(job.cluster, uid)) == devices, replica
        assert sorted(placed[replica]) == devices, replica
    every = [u for devs in placed.values() for u in devs]
    assert len(every) == len(set(every))
    borrowers = [
        p for p in job.cluster.kube.list("Pod", ns_b) if p["metadata"]["name"].startswith("b-")
    ]
    assert not [p for p in borrowers if p["spec"].get("nodeName")], "B's borrowers stayed"
    noticed = {
        e["involvedObject"]["name"]
        for e in job.cluster.kube.list("Event", ns_b)
        if e.get("reason") == "ReclaimNotice"
    }
    assert {"b-0", "b-1"} <= noticed, noticed


def test_with_the_policies_every_attempt_is_refused_at_admission(
    cluster: Cluster, tenancy_job: tuple[Job, str], policies: None
) -> None:
    job, ns_b = tenancy_job
    tenant = cluster.kube.as_user(TENANT)
    job.replicas_placed(4)
    groups = job.lend_groups(keep=2)
    lent = {u for devs in groups.values() for u in devs}

    high = tenancy.online_refusal(ns_b, f"{contract.ANN_PRIORITY}: high")
    impostor = impostor_pod(job, ns_b)
    refusal(lambda: tenant.create(impostor), 422, high)
    classed = classed_pod(job, ns_b)
    refusal(
        lambda: tenant.create(classed),
        422,
        tenancy.online_refusal(ns_b, f"priorityClassName {ONLINE}"),
    )

    uids = borrow_as_tenant(job, tenant, ns_b, lent)
    # reclaim: "true" is a valid annotation that grants nothing: the pod is a borrower, and the
    # standby devices (all that is free) stay kept for reclaims.
    tenant.create(grab_pod(job, ns_b))
    cluster.wait_unschedulable(ns_b, "grab", "reserved for reclaims (standby pool)")

    # What it would change after admission.
    raise_priority = {"metadata": {"annotations": {contract.ANN_PRIORITY: "high"}}}
    refusal(lambda: tenant.patch("Pod", "b-0", raise_priority, ns_b), 422, high)
    # Devices lent by a replica of A's that b-0 does not hold (b-1 may): a change, not a no-op.
    held = cluster.pod(ns_b, "b-0")["metadata"]["annotations"].get(contract.ANN_DEVICES, "")
    others = next(devs for devs in groups.values() if sorted(devs) != sorted(held.split(",")))
    rewrite = {"metadata": {"annotations": {contract.ANN_DEVICES: ",".join(others)}}}
    refusal(
        lambda: tenant.patch("Pod", "b-0", rewrite, ns_b),
        403,
        f"annotation {contract.ANN_DEVICES} is written by tidelease only",
    )
    tenant.create(queued_pod(job, ns_b))
    ungate = {"spec": {"schedulingGates": None}}
    refusal(
        lambda: tenant.patch("Pod", "queued", ungate, ns_b),
        403,
        admissionpolicy.gate_refusal(TENANT),
    )
    assert sorted(ledger_devices(cluster, uids["b-0"])) == sorted(
        cluster.pod(ns_b, "b-0")["metadata"]["annotations"][contract.ANN_DEVICES].split(",")
    )

    reclaim_returns_each_replica(job, ns_b, groups)


def test_without_the_policies_the_extender_and_controllers_refuse_alone(
    cluster: Cluster, tenancy_job: tuple[Job, str]
) -> None:
    job, ns_b = tenancy_job
    tenant = cluster.kube.as_user(TENANT)
    job.replicas_placed(4)
    groups = job.lend_groups(keep=2)
    lent = {u for devs in groups.values() for u in devs}

    # Admitted, never placed: the filter gives the policy's reason.
    tenant.create(impostor_pod(job, ns_b))
    cluster.wait_unschedulable(
        ns_b, "impostor", tenancy.online_refusal(ns_b, f"{contract.ANN_PRIORITY}: high")
    )
    tenant.create(classed_pod(job, ns_b))
    cluster.wait_unschedulable(
        ns_b, "classed", tenancy.online_refusal(ns_b, f"priorityClassName {ONLINE}")
    )

    uids = borrow_as_tenant(job, tenant, ns_b, lent)
    tenant.create(grab_pod(job, ns_b))
    cluster.wait_unschedulable(ns_b, "grab", "reserved for reclaims (standby pool)")

    # Changed after admission: accepted by the API server, worth nothing to tidelease.
    before = {name: sorted(ledger_devices(cluster, uid)) for name, uid in uids.items()}
    tenant.patch("Pod", "b-0", {"metadata": {"annotations": {contract.ANN_PRIORITY: "high"}}}, ns_b)
    others = groups["recsys-2"] + groups["recsys-3"]  # every device A lent
    tenant.patch(
        "Pod", "b-1", {"metadata": {"annotations": {contract.ANN_DEVICES: ",".join(others)}}}, ns_b
    )
    assert {name: sorted(ledger_devices(cluster, uid)) for name, uid in uids.items()} == before

    tenant.create(queued_pod(job, ns_b))
    tenant.patch("Pod", "queued", {"spec": {"schedulingGates": None}}, ns_b)
    cluster.wait_unschedulable(ns_b, "queued", QUEUE_WAIT)

    # The borrower that called itself high is evicted all the same; A's replicas come back.
    reclaim_returns_each_replica(job, ns_b, groups)
    for name in ("impostor", "classed", "grab", "queued"):
        assert not cluster.pod(ns_b, name)["spec"].get("nodeName"), name


def test_two_namespaces_with_one_job_name_lend_and_reclaim_side_by_side(
    cluster: Cluster, group: NodeGroup
) -> None:
    """Two granted namespaces each run a job named recsys: their leases tag their devices with
    their own namespace, and each reclaim returns its own replicas' devices, never the other's."""
    cluster.ensure_priority_class(BORROWER, 10)
    for suffix in ("n1", "n2", "n3", "n4"):
        group.add_node(suffix, lambda name: builders.devices(name, 8))
    group.wait_ready()
    first, second = (Job(cluster, group, cluster.namespace(p)) for p in ("same-a", "same-b"))
    try:
        for job in (first, second):
            job.replicas_placed(4)
        lent = {job.ns: job.lend_groups(keep=2) for job in (first, second)}
        for job in (first, second):
            for devices in lent[job.ns].values():
                for node in job.group.nodes:
                    tags = cluster.gpu_node_uuids(node)
                    for u in devices:
                        if u in tags:
                            assert tags[u]["owner"] == f"{job.ns}/recsys", tags[u]
        for job in (first, second):
            job.reclaim(reclaims=1)
            placed = job.replicas_placed(4)
            for replica, devices in lent[job.ns].items():
                assert sorted(placed[replica]) == devices, (job.ns, replica)
    finally:
        for job in (first, second):
            cluster.kube.delete("Namespace", job.ns)


# --- a tenant's throughput query (common/queryscope.py) ---

QUERY_INTERVAL_S = 1.0  # the queues controller's passes in the test below


class Prometheus:
    """Prometheus's query API on a loopback port (what PrometheusSource calls: a form POST to
    /api/v1/query or /api/v1/query_range, or a GET): it records every query it is asked and
    answers, as Prometheus does for series it does not have, an empty result."""

    def __init__(self) -> None:
        self.url = ""
        self._queries: list[str] = []
        self._lock = threading.Lock()

    def queries(self) -> list[str]:
        with self._lock:
            return list(self._queries)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer("")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(self.rfile.read(length).decode())

            def _answer(self, form: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                params = urllib.parse.parse_qs(url.query) | urllib.parse.parse_qs(form)
                result_type = {"/api/v1/query": "vector", "/api/v1/query_range": "matrix"}
                if url.path not in result_type:
                    self._reply(404, _error("not_found", f"{url.path}: no such endpoint"))
                elif "query" not in params:
                    self._reply(400, _error("bad_data", 'invalid parameter "query"'))
                else:
                    with fake._lock:
                        fake._queries += params["query"]
                    data = {"resultType": result_type[url.path], "result": []}
                    self._reply(200, {"status": "success", "data": data})

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"status": "error", "errorType": kind, "error": message}


@pytest.fixture
def prometheus() -> Iterator[Prometheus]:
    fake = Prometheus()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="prometheus", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def profiling_queues(cluster: Cluster, tmp_path: Path, prometheus: Prometheus) -> Iterator[Path]:
    """`tidelease controllers --queues-controller` reading throughputs from ``prometheus``,
    with the cluster's queue release key (its releases are placed); its log."""
    settings = {"queue_interval_s": str(QUERY_INTERVAL_S)}
    with queues_controller(
        cluster, tmp_path / "queues.log", settings, "--planner-prometheus", prometheus.url
    ) as log:
        yield log


def grant_edit(cluster: Cluster, namespace: str, user: str) -> None:
    """The built-in ``edit`` role in ``namespace`` for ``user``, and nothing else."""
    cluster.kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )


def profiled_job(group: NodeGroup, ns: str, name: str, query: str) -> dict[str, Any]:
    """An elastic batch job of one 1-GPU replica, a Deployment, that names its throughput
    query: all the queues controller needs to profile it (owner, class, workload, ceiling)."""
    pod = group.pod(
        ns,
        name,
        1,
        owner=name,
        priority=Priority.LOW,
        priority_class=BORROWER,
        extra_annotations={
            contract.ANN_JOB_CLASS: "batch",
            contract.ANN_WORKLOAD: f"Deployment/{name}",
            contract.ANN_MAX_REPLICAS: "1",  # never grown: one pod to watch
            contract.ANN_THROUGHPUT_QUERY: query,
        },
    )
    return workload("Deployment", name, ns, pod, replicas=1)


def wait_job_running(cluster: Cluster, ns: str, name: str, log: Path) -> str:
    """The name of the job's pod once released, bound and Running."""

    def running() -> str | None:
        for p in cluster.kube.list("Pod", ns, selector=f"app={name}"):
            if (
                p["spec"].get("nodeName")
                and (p.get("status") or {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
            ):
                return str(p["metadata"]["name"])
        return None

    return wait_for(
        running,
        what=f"job {ns}/{name} running",
        timeout=60,
        describe=lambda: log.read_text()[-3000:],
    )


def query_refusals(cluster: Cluster, ns: str, pod: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.kube.list("Event", ns)
        if e.get("reason") == "ThroughputQueryRefused"
        and (e.get("involvedObject") or {}).get("name") == pod
    ]


def test_a_tenants_throughput_query_reads_its_own_namespace_only(
    cluster: Cluster, group: NodeGroup, prometheus: Prometheus, profiling_queues: Path
) -> None:
    """B's elastic job names a throughput query of A's series: it is never run, and its pod
    gets a Warning Event that says why. B's other job names a query of no namespace (every
    tenant's series): it is run with B's namespace added, and Prometheus sees nothing else."""
    cluster.ensure_priority_class(BORROWER, 10)
    group.add_node("n1", lambda name: builders.devices(name, 2))
    group.wait_ready()
    ns_a = cluster.namespace("ten-a")
    ns_b = cluster.namespace("ten-b", online=False)
    try:
        grant_edit(cluster, ns_b, TENANT)
        tenant = cluster.kube.as_user(TENANT)
        log = profiling_queues

        theirs = f'sum(rate(trainer_samples_total{{namespace="{ns_a}"}}[1m]))'
        tenant.create(profiled_job(group, ns_b, "peek", theirs))
        peek = wait_job_running(cluster, ns_b, "peek", log)
        (event, *_) = wait_for(
            lambda: query_refusals(cluster, ns_b, peek),
            what=f"ThroughputQueryRefused on {ns_b}/{peek}",
            timeout=30,
            describe=lambda: log.read_text()[-3000:],
        )
        message = event.get("message", "")
        assert event.get("type") == "Warning", event
        assert f"{contract.ANN_THROUGHPUT_QUERY} is not run" in message, message
        assert f'namespace="{ns_a}"' in message, message  # the selector it refused
        assert f'namespace="{ns_b}"' in message, message  # what a query of B may read

        # The control: the same profiler runs a query of B's, scoped. peek runs all along, so
        # a query of its would be asked in the same passes.
        own = "sum(rate(trainer_samples_total[1m]))"
        tenant.create(profiled_job(group, ns_b, "own", own))
        own_pod = wait_job_running(cluster, ns_b, "own", log)
        scoped = scope_query(own, ns_b)
        assert f'namespace="{ns_b}"' in scoped, scoped
        wait_for(
            lambda: scoped in prometheus.queries(),
            what="B's own query run, scoped to B",
            timeout=60,
            describe=lambda: f"asked: {prometheus.queries()}\n{log.read_text()[-3000:]}",
        )
        time.sleep(2 * QUERY_INTERVAL_S)  # passes more, with both jobs running
        asked = prometheus.queries()
        assert asked, asked
        for query in asked:
            matchers = re.findall(r'namespace\s*(=~|!=|!~|=)\s*"([^"]*)"', query)
            assert matchers, asked
            assert set(matchers) == {("=", ns_b)}, asked
            assert ns_a not in query, asked
        assert not query_refusals(cluster, ns_b, own_pod)
    finally:
        for ns in (ns_a, ns_b):
            cluster.kube.delete("Namespace", ns)
