"""Least privilege, checked with each ServiceAccount's own token on a real API server: the chart
is installed, tokens are minted for its ServiceAccounts (bound to a pod on a node, as the
kubelet's are), and the writes an attacker holding one of them would try are refused, while
what the component needs is allowed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common import builders
from common.delegatedauth import DelegatedAuth
from common.kubeclient import KubeClient
from tests.apiserver.conftest import ApiServer
from tests.apiserver.kubectl import Kubectl
from tests.apiserver.test_manifests_apply import nvidia_runtime_class
from tests.chart import CHART, helm
from tests.kubeconfigs import write_kubeconfig

pytestmark = pytest.mark.apiserver

NS = "tidelease-rbac"
# A workload kind an admin lists for leases (extender.leaseWorkloads).
LWS_GROUP = "leaderworkerset.x-k8s.io"


def pod_on(node: str, name: str, namespace: str, account: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "serviceAccountName": account,
            "containers": [{"name": "c", "image": "local/app:v1"}],
        },
    }


@pytest.fixture(scope="module")
def cluster(apiserver: ApiServer) -> Iterator[Kubectl]:
    c = Kubectl(apiserver)
    kube = ("--kubeconfig", str(apiserver.kubeconfig), "--namespace", NS)
    # Opted in below (it must exist first). Kept afterwards: the modules that share this fixture
    # (test_least_privilege, test_peer_identity) each set it up again, and this API server has
    # no namespace controller to finish a deletion.
    if c.kubectl("get", "namespace", "-o", "name").find("namespace/ml\n") < 0:
        c.kubectl("create", "namespace", "ml")
    nvidia_runtime_class(apiserver)  # the agent's, as the GPU Operator makes it
    helm(
        "install", "tidelease", str(CHART), "--create-namespace", *kube,
        "--set", "orchestrator.namespaces={ml}", "--set", "extender.leaseNamespaces={ml}",
        "--set", "dra.enabled=true",
        "--set", f"extender.leaseWorkloads[0].apiGroup={LWS_GROUP}",
        "--set", "extender.leaseWorkloads[0].resource=leaderworkersets",
        "--set", "scheduling.gangScheduling=true",
        "--set", "extender.controllers.kueue=true",
        timeout=180,
    )  # fmt: skip
    # The objects an attacker would go for, and a node with a pod for each agent token.
    c.apply({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
        "spec": {"holderIdentity": "the-real-scheduler"},
    })  # fmt: skip
    c.apply(pod_on("sys-node", "victim", "kube-system"))
    c.apply(deployment("policy-probe", "ml", replicas=0))
    for node in ("node-a", "node-b"):
        c.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        c.apply(pod_on(node, f"agent-{node}", NS, "tidelease-agent"))
        c.apply(
            {"apiVersion": "tidelease.io/v1alpha1", "kind": "GpuNode", "metadata": {"name": node}}
        )
    wait_policies_in_force(c)
    try:
        yield c
    finally:
        helm("uninstall", "tidelease", *kube, "--wait", check=False, timeout=180)
        for kind, name, ns in (
            ("pod", "victim", "kube-system"),
            ("deployment", "policy-probe", "ml"),
            ("lease", "kube-scheduler", "kube-system"),
            ("gpunode", "node-a", ""),
            ("gpunode", "node-b", ""),
            ("node", "node-a", ""),
            ("node", "node-b", ""),
        ):
            c.kubectl(
                "delete", kind, name, *(["-n", ns] if ns else []), "--ignore-not-found",
                "--wait=false", *(["--grace-period=0", "--force"] if kind == "pod" else []),
            )  # fmt: skip


@dataclass(frozen=True)
class PolicyProbe:
    """A write its token's holder may make under RBAC but one of the chart's admission policies
    refuses (a server-side dry run: nothing is stored), and the words of that refusal."""

    account: str
    args: tuple[str, ...]
    words: str
    pod: str | None = None
    stdin: str | None = None


POLICY_PROBES = {
    "tidelease-controllers-pods": PolicyProbe("tidelease-controllers", (
        "patch", "pod", "victim", "-n", "kube-system", "--type=merge", "-p",
        '{"metadata":{"annotations":{"tidelease.io/reclaim-notice":"2000-01-01T00:00:00Z"}}}',
    ), "do not touch pods in the namespace kube-system"),
    "tidelease-controllers-workloads": PolicyProbe("tidelease-controllers", (
        "patch", "deployment", "policy-probe", "-n", "ml", "--type=merge", "-p",
        '{"metadata":{"labels":{"probe":"1"}}}',
    ), "change a workload only by its scale subresource"),
    "tidelease-own-leases": PolicyProbe("tidelease-controllers", ("create", "-f", "-"),
        "writes only its own leader-election Leases", stdin=json.dumps({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "not-a-tidelease-lease", "namespace": NS},
        })),
    "tidelease-agent-own-node": PolicyProbe("tidelease-agent", (
        "patch", "gpunode", "node-b", "--subresource=status", "--type=merge", "-p",
        '{"status":{"devices":[]}}',
    ), "only its own node", pod="agent-node-a"),
}  # fmt: skip


def wait_policies_in_force(c: Kubectl, timeout: float = 60.0) -> None:
    """Until each policy of POLICY_PROBES refuses its probe. The API server loads every policy
    and binding on its own in the background after `helm install` returns, so one in force says
    nothing of the others (a CI run saw a kube-system pod patched by the controllers' token in
    the first test after the install)."""
    tokens: dict[tuple[str, str | None], str] = {}
    for name, probe in POLICY_PROBES.items():
        key = (probe.account, probe.pod)
        t = tokens.setdefault(key, token(c, probe.account, probe.pod))
        deadline = time.monotonic() + timeout
        while True:
            done = c.run(*probe.args, "--dry-run=server", token=t, stdin=probe.stdin)
            if done.returncode != 0 and probe.words in done.stderr:
                break
            assert time.monotonic() < deadline, f"{name} not in force: {done.stdout}{done.stderr}"
            time.sleep(0.5)


def deployment(name: str, namespace: str, replicas: int = 1) -> dict[str, Any]:
    return builders.deployment(name, namespace, replicas=replicas, image="local/app:v1")


def token(c: Kubectl, account: str, pod: str | None = None) -> str:
    bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod] if pod else []
    return c.kubectl("create", "token", account, "-n", NS, *bound).strip()


def test_the_extender_cannot_take_the_scheduler_lease_or_reach_past_its_namespace(
    cluster: Kubectl,
) -> None:
    t = token(cluster, "tidelease-extender")
    error = cluster.refused(
        t, "patch", "lease", "kube-scheduler", "-n", "kube-system", "--type=merge", "-p",
        '{"spec":{"holderIdentity":"attacker"}}',
    )  # fmt: skip
    assert "forbidden" in error
    assert not cluster.can(t, "create", "leases", "kube-system")
    assert not cluster.can(t, "update", "leases", "default")
    assert not cluster.can(t, "create", "pods", "kube-system")
    assert not cluster.can(t, "create", "secrets", NS)
    # The controllers' writes are not the extender's any more (it serves the verbs only). (Its
    # kube-scheduler, in ownScheduler mode, deletes preemption victims as any kube-scheduler:
    # the scheduler's role, tidelease-scheduler, grants that.)
    for verb, resource in (
        ("patch", "pods"),
        ("create", "pods/eviction"),
        ("update", "gpuleases.tidelease.io/status"),
        ("patch", "gpunodes.tidelease.io"),
    ):
        assert not cluster.can(t, verb, resource, "default"), (verb, resource)
    # What it needs: its view, binds, ledgers, and Leases in its own namespace (its
    # kube-scheduler's leader election in ownScheduler mode).
    for verb, resource, ns in (
        ("list", "pods", ""),
        ("watch", "gpunodes.tidelease.io", ""),
        ("watch", "gpuleases.tidelease.io", ""),
        ("create", "pods/binding", "default"),
        ("update", "gpuallocations.tidelease.io", ""),
        ("create", "leases", NS),
    ):
        assert cluster.can(t, verb, resource, ns), (verb, resource, ns)
    # Updates: its kube-scheduler's Lease by name, no other (an agent's heartbeat, a controller's
    # leader Lease).
    assert not cluster.can(t, "update", "leases", NS)
    for name, answer in (("tidelease-scheduler", "yes"), ("tidelease-agent-node-a", "no")):
        done = cluster.run("auth", "can-i", "update", f"leases/{name}", "-n", NS, token=t)
        assert done.stdout.strip() == answer, (name, done)


def test_the_controllers_write_what_they_reconcile_and_cannot_bind(cluster: Kubectl) -> None:
    t = token(cluster, "tidelease-controllers")
    error = cluster.refused(
        t, "patch", "lease", "kube-scheduler", "-n", "kube-system", "--type=merge", "-p",
        '{"spec":{"holderIdentity":"attacker"}}',
    )  # fmt: skip
    assert "forbidden" in error
    assert not cluster.can(t, "create", "pods/binding", "default")
    assert not cluster.can(t, "update", "gpuallocations.tidelease.io", "")
    assert not cluster.can(t, "create", "pods/exec", "default")
    assert not cluster.can(t, "update", "pods/status", "default")  # patch, the condition only
    # The shared queues' book only: no other ConfigMap of its namespace, none elsewhere.
    for name, allowed in (("tidelease-queues", "yes"), ("tidelease-extender-settings", "no")):
        done = cluster.run("auth", "can-i", "update", f"configmaps/{name}", "-n", NS, token=t)
        assert done.stdout.strip() == allowed, (name, done.stdout, done.stderr)
    assert not cluster.can(t, "get", "configmaps", NS)
    assert not cluster.can(t, "get", "configmaps", "default")
    for verb, resource, ns in (
        ("patch", "pods", "default"),
        ("patch", "pods/status", "default"),
        ("create", "pods/eviction", "default"),
        ("update", "gpuleases.tidelease.io/status", "default"),
        ("patch", "gpunodes.tidelease.io", ""),
        ("update", "gpunodes.tidelease.io/status", ""),
        ("watch", "statefulsets.apps", ""),
        ("create", "configmaps", NS),  # the shared queues' book
        ("create", "leases", NS),  # its own names only: controllers-policy.yaml
    ):
        assert cluster.can(t, verb, resource, ns), (verb, resource, ns)
    # Leases: its own leader Leases by name, no other (test_least_privilege.py tries them).
    for name, allowed in (
        ("tidelease-leasing-controller", "yes"),
        ("tidelease-gang-controller", "yes"),
        ("tidelease-kueue-admission-check", "yes"),
        ("tidelease-agent-a", "no"),
    ):
        done = cluster.run("auth", "can-i", "update", f"leases/{name}", "-n", NS, token=t)
        assert done.stdout.strip() == allowed, (name, done.stdout, done.stderr)


def test_an_agent_writes_only_its_own_node(cluster: Kubectl) -> None:
    t = token(cluster, "tidelease-agent", pod="agent-node-a")
    patch = ("--type=merge", "-p", '{"metadata":{"annotations":{"x":"y"}}}')
    # Another node's GpuNode status, a kube-system pod's image, another node's pod: refused.
    error = cluster.refused(
        t, "patch", "gpunode", "node-b", "--subresource=status", "--type=merge", "-p",
        '{"status":{"devices":[]}}',
    )  # fmt: skip
    assert "only its own node" in error
    error = cluster.refused(
        t, "patch", "pod", "victim", "-n", "kube-system", "--type=merge", "-p",
        '{"spec":{"containers":[{"name":"c","image":"attacker/evil:1"}]}}',
    )  # fmt: skip
    assert "only its own node" in error
    assert "only its own node" in cluster.refused(
        t, "patch", "pod", "agent-node-b", "-n", NS, *patch
    )
    # Its own: allowed.
    cluster.kubectl(
        "patch", "gpunode", "node-a", "--subresource=status", "--type=merge", "-p",
        '{"status":{"devices":[]}}', token=t,
    )  # fmt: skip
    cluster.kubectl("patch", "pod", "agent-node-a", "-n", NS, *patch, token=t)
    # A token bound to no pod names no node: no writes at all.
    unbound = token(cluster, "tidelease-agent")
    assert "names no node" in cluster.refused(
        unbound, "patch", "pod", "agent-node-a", "-n", NS, *patch
    )
    assert not cluster.can(t, "update", "leases", "kube-system")
    # The allocation ledgers: the device plugin reads its node's by name to confirm a pod's
    # devices annotation; it never lists, watches or writes one (only the extender writes them).
    assert cluster.can(t, "get", "gpuallocations.tidelease.io")
    for verb in ("list", "watch", "create", "update", "patch", "delete"):
        assert not cluster.can(t, verb, "gpuallocations.tidelease.io"), verb


def test_an_agent_in_dra_mode_publishes_only_its_own_nodes_slice(cluster: Kubectl) -> None:
    """The agent's own token: its node's ResourceSlice (as `tidelease agent --dra` writes it)
    may be created and updated, another node's may not; claims are read, never written."""
    from common import deviceattributes

    t = token(cluster, "tidelease-agent", pod="agent-node-a")

    def slice_of(node: str) -> dict[str, Any]:
        gpunode = {"metadata": {"name": node}, "status": {"devices": [
            {"index": 0, "uuid": f"GPU-{node}", "type": "H20", "health": "Healthy", "tier": "HA"},
        ]}}  # fmt: skip
        return deviceattributes.resource_slice(node, None, gpunode, 1)

    mine, theirs = slice_of("node-a"), slice_of("node-b")
    try:
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(mine), token=t)
        assert "only its own node" in cluster.refused(
            t, "create", "-f", "-", stdin=json.dumps(theirs)
        )
        # Its own: updated (the mirror's writes) and deleted (a GpuNode without devices).
        stored = json.loads(
            cluster.kubectl(
                "get", "resourceslice", deviceattributes.slice_name("node-a"), "-o", "json"
            )
        )
        stored["metadata"].setdefault("labels", {})["x"] = "y"
        cluster.kubectl("replace", "-f", "-", stdin=json.dumps(stored), token=t)
        assert cluster.can(t, "get", "resourceclaims", "ml")
        assert not cluster.can(t, "update", "resourceclaims/status", "ml")
        assert not cluster.can(t, "create", "resourceclaims", "ml")
        assert not cluster.can(t, "delete", "deviceclasses", "")
        cluster.kubectl("delete", "resourceslice", deviceattributes.slice_name("node-a"), token=t)
    finally:
        cluster.kubectl(
            "delete", "resourceslice",
            deviceattributes.slice_name("node-a"), deviceattributes.slice_name("node-b"),
            "--ignore-not-found",
        )  # fmt: skip


async def test_the_controllers_in_dra_mode_pin_claims_and_write_nothing_else_of_dra(
    cluster: Kubectl, tmp_path: Path
) -> None:
    """The leasing controller's own pin (KubeWorld.pin: kube-scheduler's finalizer, the
    allocation through the status, an Event, the gate lifted), run with the controllers'
    token; that token can neither make nor delete claims, nor touch slices or classes."""
    from common import deviceattributes
    from common.model import Device, DeviceClass, GpuUuid, NodeName, Tier
    from extender.leasing import claimpinning as pinning
    from extender.leasing.kubeworld import KubeWorld
    from extender.rightofreturn.lease import parse_gpu_lease

    t = token(cluster, "tidelease-controllers")
    claim = {
        "apiVersion": deviceattributes.API_VERSION, "kind": "ResourceClaim",
        "metadata": {"name": "job-1-gpu", "namespace": "ml"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": deviceattributes.CLASS_HA, "count": 1}},
        ]}},
    }  # fmt: skip
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job-1", "namespace": "ml"},
        "spec": {
            "schedulingGates": [{"name": pinning.RECLAIM_GATE}],
            "containers": [{"name": "c", "image": "local/app:v1"}],
        },
    }  # fmt: skip
    cluster.apply(claim)
    cluster.apply(pod)
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", cluster.apiserver.server, t, cluster.apiserver.ca
    )
    api = await KubeClient.connect(kubeconfig)
    try:
        stored = await api.json(
            "GET", f"/apis/{deviceattributes.API_VERSION}/namespaces/ml/resourceclaims/job-1-gpu"
        )
        uid = json.loads(cluster.kubectl("get", "pod", "job-1", "-n", "ml", "-o", "json"))[
            "metadata"
        ]["uid"]
        gated = pinning.GatedPod("ml", "job-1", uid, ("job-1-gpu",))
        device = Device(NodeName("node-a"), 0, GpuUuid("GPU-a"), DeviceClass("H20", Tier.HA, True))
        status = pinning.pinned_allocation(stored, [device])
        lease = parse_gpu_lease(
            {
                "metadata": {"name": "job", "namespace": "ml", "resourceVersion": "1"},
                "spec": {
                    "owner": "job",
                    "gpusPerReplica": 1,
                    "workload": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "job"},
                },
            }
        )
        step = pinning.Pin(gated, stored, status, (device,), "job-1")
        await KubeWorld(api).pin(step, lease)

        written = json.loads(
            cluster.kubectl("get", "resourceclaim", "job-1-gpu", "-n", "ml", "-o", "json")
        )
        assert written["status"]["allocation"] == status["allocation"]
        assert pinning.FINALIZER in written["metadata"]["finalizers"]
        after = json.loads(cluster.kubectl("get", "pod", "job-1", "-n", "ml", "-o", "json"))
        assert not after["spec"].get("schedulingGates"), after["spec"]
        for verb, resource in (
            ("create", "resourceclaims"),
            ("delete", "resourceclaims"),
            ("update", "resourceclaims"),
            ("get", "resourceclaims/status"),
            ("create", "resourceslices"),
            ("update", "resourceslices"),
            ("patch", "deviceclasses"),
        ):
            assert not cluster.can(t, verb, resource, "ml"), (verb, resource)
    finally:
        await api.close()
        cluster.kubectl(
            "patch", "resourceclaim", "job-1-gpu", "-n", "ml", "--type=merge", "-p",
            '{"metadata":{"finalizers":null}}',
        )  # fmt: skip
        cluster.kubectl("delete", "resourceclaim", "job-1-gpu", "-n", "ml", "--ignore-not-found")
        cluster.kubectl("delete", "pod", "job-1", "-n", "ml", "--ignore-not-found", "--wait=false")


def test_the_orchestrator_cannot_exec_or_write_outside_the_namespaces_that_opt_in(
    cluster: Kubectl,
) -> None:
    t = token(cluster, "tidelease-orchestrator")
    for ns in ("kube-system", "default"):
        assert not cluster.can(t, "create", "pods/exec", ns), ns
        assert not cluster.can(t, "create", "configmaps", ns), ns
    assert not cluster.can(t, "update", "leases", "kube-system")
    assert not cluster.can(t, "delete", "pods", "ml")
    error = cluster.refused(
        t, "create", "configmap", f"probe-{uuid.uuid4().hex[:6]}", "-n", "kube-system",
        "--from-literal=a=b",
    )  # fmt: skip
    assert "forbidden" in error
    # Where it may work: the opted-in namespace, where it also watches jobs and pods (and
    # nowhere else); its own Lease at home.
    assert cluster.can(t, "create", "pods/exec", "ml")
    assert cluster.can(t, "update", "configmaps", "ml")
    for resource in ("pods", "configmaps"):
        assert cluster.can(t, "watch", resource, "ml"), resource
        assert not cluster.can(t, "watch", resource, ""), resource
        assert not cluster.can(t, "list", resource, "kube-system"), resource
    for name, allowed in (
        ("tidelease-orchestrator", "yes"),
        ("tidelease-leasing-controller", "no"),
    ):
        done = cluster.run("auth", "can-i", "update", f"leases/{name}", "-n", NS, token=t)
        assert done.stdout.strip() == allowed, (name, done.stdout, done.stderr)


def test_the_own_scheduler_reads_gangs_and_writes_none(cluster: Kubectl) -> None:
    """With scheduling.gangScheduling, the kube-scheduler in the extender's pods (its
    ServiceAccount's token) reads the Workload API's gangs, as kube-scheduler must, cluster-wide,
    and may change none; no other component reads them."""
    workloads = "workloads.scheduling.k8s.io"
    t = token(cluster, "tidelease-extender")
    for verb in ("get", "list", "watch"):
        assert cluster.can(t, verb, workloads, "ml"), verb
        assert cluster.can(t, verb, workloads, "kube-system"), verb
    for verb in ("create", "update", "patch", "delete"):
        assert not cluster.can(t, verb, workloads, "ml"), verb
    for account in ("tidelease-controllers", "tidelease-agent", "tidelease-orchestrator"):
        assert not cluster.can(token(cluster, account), "list", workloads, "ml"), account


def test_the_kueue_check_reads_workloads_and_writes_only_their_status(cluster: Kubectl) -> None:
    """With extender.controllers.kueue, the controllers read Kueue's Workloads and AdmissionChecks
    and patch their status (the check's own entry, its Active condition), and can change nothing
    else of Kueue's: no Workload's spec (activation, queue), no queue, no flavor; no other
    component reads Workloads. Kueue's CRDs are not installed here: the review asks by name."""
    t = token(cluster, "tidelease-controllers")
    for resource in ("workloads.kueue.x-k8s.io", "admissionchecks.kueue.x-k8s.io"):
        for verb in ("get", "list", "watch"):
            assert cluster.can(t, verb, resource, "ml"), (verb, resource)
        for verb in ("create", "update", "patch", "delete"):
            assert not cluster.can(t, verb, resource, "ml"), (verb, resource)
        assert cluster.can(t, "patch", f"{resource}/status", "ml"), resource
        assert not cluster.can(t, "update", f"{resource}/status", "ml"), resource
    for resource in (
        "clusterqueues.kueue.x-k8s.io",
        "localqueues.kueue.x-k8s.io",
        "resourceflavors.kueue.x-k8s.io",
        "cohorts.kueue.x-k8s.io",
    ):
        for verb in ("get", "create", "patch", "delete"):
            assert not cluster.can(t, verb, resource, "ml"), (verb, resource)
        assert not cluster.can(t, "patch", f"{resource}/status", "ml"), resource
    for account in ("tidelease-extender", "tidelease-agent", "tidelease-orchestrator"):
        other = token(cluster, account)
        assert not cluster.can(other, "list", "workloads.kueue.x-k8s.io", "ml"), account


def test_the_controllers_scale_workloads_only_where_leases_may_live(cluster: Kubectl) -> None:
    assert not cluster.can(
        token(cluster, "tidelease-extender"), "patch", "statefulsets/scale", "ml"
    )
    t = token(cluster, "tidelease-controllers")
    assert cluster.can(t, "patch", "statefulsets/scale", "ml")
    assert not cluster.can(t, "patch", "statefulsets/scale", "kube-system")
    assert not cluster.can(t, "patch", "deployments/scale", "default")
    # A kind the admin listed (extender.leaseWorkloads): its scale only, only there.
    lws = f"leaderworkersets.{LWS_GROUP}"
    assert cluster.can(t, "patch", f"{lws}/scale", "ml")
    assert cluster.can(t, "get", f"{lws}/scale", "ml")
    assert not cluster.can(t, "patch", f"{lws}/scale", "kube-system")
    assert not cluster.can(t, "patch", lws, "ml")
    assert not cluster.can(t, "delete", lws, "ml")
    assert not cluster.can(t, "patch", "jobsets.jobset.x-k8s.io/scale", "ml")


async def test_metrics_readers_are_reviewed_with_the_extenders_own_token(
    cluster: Kubectl, tmp_path: Path
) -> None:
    """The extender's /metrics check (common/delegatedauth.py), run with the extender's token:
    it may review tokens, and the chart's tidelease-metrics-reader is what lets a reader in."""
    extender = token(cluster, "tidelease-extender")
    assert cluster.can(extender, "create", "tokenreviews.authentication.k8s.io")
    assert cluster.can(extender, "create", "subjectaccessreviews.authorization.k8s.io")
    cluster.kubectl("create", "serviceaccount", "prometheus", "-n", NS)
    reader = token(cluster, "prometheus")
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", cluster.apiserver.server, extender, cluster.apiserver.ca
    )
    api = await KubeClient.connect(kubeconfig)
    try:
        auth = DelegatedAuth(api)
        assert (await auth.check(None, "/metrics")).status == 401
        assert (await auth.check("Bearer not-a-token", "/metrics")).status == 401
        nosy = await auth.check(f"Bearer {token(cluster, 'tidelease-orchestrator')}", "/metrics")
        assert (nosy.status, nosy.reason) == (
            403, f"system:serviceaccount:{NS}:tidelease-orchestrator may not get /metrics",
        )  # fmt: skip
        assert (await auth.check(f"Bearer {reader}", "/metrics")).status == 403
        cluster.kubectl(
            "create", "clusterrolebinding", "tidelease-rbac-prometheus",
            "--clusterrole=tidelease-metrics-reader", f"--serviceaccount={NS}:prometheus",
        )  # fmt: skip
        try:
            fresh = DelegatedAuth(api)  # no cached refusal
            assert (await fresh.check(f"Bearer {reader}", "/metrics")).allowed
            # Only /metrics: the grant is for that path.
            assert (await fresh.check(f"Bearer {reader}", "/debug/pprof")).status == 403
        finally:
            cluster.kubectl("delete", "clusterrolebinding", "tidelease-rbac-prometheus")
    finally:
        await api.close()


def test_the_viewer_roles_let_kubectl_tidelease_read_and_nothing_more(
    cluster: Kubectl, tmp_path: Path
) -> None:
    """An admin binds the chart's tidelease-viewer ClusterRole and Role to someone: the plugin
    then reads the cluster (status, explain); that someone writes nothing and reads no
    Secret."""
    cluster.kubectl("create", "serviceaccount", "viewer", "-n", NS)
    cluster.kubectl(
        "create", "clusterrolebinding", "rbac-viewer", "--clusterrole=tidelease-viewer",
        f"--serviceaccount={NS}:viewer",
    )  # fmt: skip
    cluster.kubectl(
        "create", "rolebinding", "rbac-viewer", "--role=tidelease-viewer", "-n", NS,
        f"--serviceaccount={NS}:viewer",
    )  # fmt: skip
    try:
        t = token(cluster, "viewer")
        kubeconfig = write_kubeconfig(
            tmp_path / "viewer", cluster.apiserver.server, t, cluster.apiserver.ca
        )
        plugin = Path(sys.executable).parent / "kubectl-tidelease"
        for args in (["status"], ["nodes"], ["explain", "victim", "-n", "kube-system"]):
            done = subprocess.run(
                [str(plugin), "--kubeconfig", str(kubeconfig), "--agent-namespace", NS, *args],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, (args, done.stderr)
        assert "node-a" in done.stdout or "Request" in done.stdout
        for verb, resource, ns in (
            ("patch", "gpunodes.tidelease.io", ""),
            ("update", "gpuleases.tidelease.io/status", "ml"),
            ("create", "pods/eviction", "ml"),
            ("list", "secrets", NS),
            ("list", "leases", "kube-system"),
        ):
            assert not cluster.can(t, verb, resource, ns), (verb, resource, ns)
    finally:
        cluster.kubectl("delete", "clusterrolebinding", "rbac-viewer", "--ignore-not-found")


async def test_the_controllers_write_agent_ready_with_their_own_token(
    cluster: Kubectl, tmp_path: Path
) -> None:
    """A pass of the agent-conditions controller as the chart runs it: the controllers' token
    lists the agents' Leases and the GpuNodes (metadata only after the first pass) and writes
    each GpuNode's AgentReady; the agent's token may not write another node's."""
    from extender.agents.controller import AgentConditions, stored_key

    t = token(cluster, "tidelease-controllers")
    assert cluster.can(t, "update", "gpunodes.tidelease.io/status", "")
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", cluster.apiserver.server, t, cluster.apiserver.ca
    )
    api = await KubeClient.connect(kubeconfig)
    try:
        agents = AgentConditions(api, namespace=NS, timeout_s=60)
        assert await agents.sync_once() >= 2  # node-a, node-b: no heartbeat yet
        assert await agents.sync_once() == 0
        for node in ("node-a", "node-b"):
            obj = await api.json("GET", f"/apis/tidelease.io/v1alpha1/gpunodes/{node}")
            assert stored_key(obj) == ("Unknown", "NoHeartbeat")
    finally:
        await api.close()
