"""What an attacker holding one of tidelease's tokens would try (issue 31), with that token on a
real API server that has the chart installed (test_rbac's cluster: RBAC and admission policies
as the chart makes them): the controllers' token against kube-system's pods, a Deployment's
template, a Lease not its own; one node's agent token against the controllers' leader Lease and
another node's heartbeat. Each is refused, and what the component does is still allowed (the
leasing controller's own notice, eviction and scaling code, run with the controllers' token)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common import contract
from common.errors import TideleaseError
from common.kubeclient import KubeClient
from tests.apiserver.kubectl import Kubectl
from tests.apiserver.test_rbac import NS, cluster, deployment, token
from tests.kubeconfigs import write_kubeconfig

pytestmark = pytest.mark.apiserver
__all__ = ["cluster"]  # the module's fixture, shared

MERGE = "--type=merge"


def pod(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "local/app:v1"}], **spec},
    }


def evict(c: Kubectl, t: str, name: str, namespace: str) -> Any:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
    return c.run("create", "--raw", path, "-f", "-", stdin=json.dumps(body), token=t)


@pytest.fixture
def borrowers(cluster: Kubectl) -> Iterator[Kubectl]:
    """A borrower pod and a Deployment in the lease namespace ml, the kube-system pod test_rbac
    makes (victim)."""
    cluster.apply(pod("borrower", "ml"))
    cluster.apply(pod("gated", "ml", schedulingGates=[
        {"name": contract.SCHEDULING_GATE}, {"name": "example.com/other"},
    ]))  # fmt: skip
    cluster.apply(deployment("online", "ml"))
    try:
        yield cluster
    finally:
        for kind, name in (("pod", "borrower"), ("pod", "gated"), ("deployment", "online")):
            cluster.kubectl(
                "delete", kind, name, "-n", "ml", "--ignore-not-found", "--wait=false",
                *(["--grace-period=0", "--force"] if kind == "pod" else []),
            )  # fmt: skip


def test_the_controllers_cannot_touch_kube_system_pods(borrowers: Kubectl) -> None:
    c, t = borrowers, token(borrowers, "tidelease-controllers")
    image = '{"spec":{"containers":[{"name":"c","image":"attacker/evil:1"}]}}'
    for args in (
        ("patch", "pod", "victim", "-n", "kube-system", "--type=strategic", "-p", image),
        ("patch", "pod", "victim", "-n", "kube-system", MERGE, "-p",
         '{"metadata":{"annotations":{"tidelease.io/reclaim-notice":"2000-01-01T00:00:00Z"}}}'),
        ("delete", "pod", "victim", "-n", "kube-system", "--wait=false"),
    ):  # fmt: skip
        assert "do not touch pods in the namespace kube-system" in c.refused(t, *args), args
    # (kubectl reads pods/status before it patches it: RBAC grants patch only.)
    assert "forbidden" in c.refused(
        t, "patch", "pod", "victim", "-n", "kube-system", "--subresource=status", MERGE, "-p",
        '{"status":{"conditions":[{"type":"DisruptionTarget","status":"True"}]}}',
    )  # fmt: skip
    done = evict(c, t, "victim", "kube-system")
    assert done.returncode != 0, done
    assert "kube-system" in done.stderr, done
    # Nor in the release's own namespace (the agents' pods).
    assert "do not touch pods" in c.refused(
        t, "patch", "pod", "agent-node-a", "-n", NS, MERGE, "-p",
        '{"metadata":{"annotations":{"tidelease.io/queue":"1"}}}',
    )  # fmt: skip
    c.kubectl("get", "pod", "victim", "-n", "kube-system")  # still there


def test_the_controllers_change_a_borrower_only_as_they_own(borrowers: Kubectl) -> None:
    c, t = borrowers, token(borrowers, "tidelease-controllers")
    # Its image, its service account's objects, other annotations, labels: refused.
    error = c.refused(
        t, "patch", "pod", "borrower", "-n", "ml", "--type=strategic", "-p",
        '{"spec":{"containers":[{"name":"c","image":"attacker/evil:1"}]}}',
    )  # fmt: skip
    assert "only by removing the scheduling gates" in error
    error = c.refused(
        t, "patch", "pod", "borrower", "-n", "ml", MERGE, "-p",
        '{"metadata":{"annotations":{"example.com/x":"y"}}}',
    )  # fmt: skip
    assert "may not change the pod annotations example.com/x" in error
    assert "labels" in c.refused(
        t, "patch", "pod", "borrower", "-n", "ml", MERGE, "-p", '{"metadata":{"labels":{"a":"b"}}}'
    )
    # A pod without a reclaim notice is not deleted.
    assert "reclaim notice" in c.refused(t, "delete", "pod", "borrower", "-n", "ml", "--wait=false")
    # Another gate than tidelease's is not lifted; the queues' gate is.
    stored = json.loads(c.kubectl("get", "pod", "gated", "-n", "ml", "-o", "json"))
    gates = [g["name"] for g in stored["spec"]["schedulingGates"]]
    other = gates.index("example.com/other")
    assert "scheduling gates" in c.refused(
        t, "patch", "pod", "gated", "-n", "ml", "--type=json", "-p",
        json.dumps([{"op": "remove", "path": f"/spec/schedulingGates/{other}"}]),
    )  # fmt: skip
    ours = gates.index(contract.SCHEDULING_GATE)
    c.kubectl(
        "patch", "pod", "gated", "-n", "ml", "--type=json", "-p",
        json.dumps([
            {"op": "remove", "path": f"/spec/schedulingGates/{ours}"},
            {"op": "add", "path": "/metadata/annotations/tidelease.io~1queue", "value": "2"},
        ]), token=t,
    )  # fmt: skip
    # Its own annotations and the condition: allowed.
    c.kubectl(
        "patch", "pod", "borrower", "-n", "ml", MERGE, "-p",
        json.dumps({"metadata": {"annotations": {
            contract.ANN_QUEUE: "2", contract.ANN_QUEUE_REASON: "demoted",
            contract.ANN_HOT_RESTART_REQUEST: "{}",
        }}}), token=t,
    )  # fmt: skip
    # A borrower given its notice may be deleted (a disruption budget refused its eviction).
    c.kubectl(
        "patch", "pod", "borrower", "-n", "ml", MERGE, "-p",
        json.dumps({"metadata": {"annotations": {
            contract.ANN_RECLAIM_NOTICE: "2000-01-01T00:00:00.000000Z"}}}), token=t,
    )  # fmt: skip
    c.kubectl("delete", "pod", "borrower", "-n", "ml", "--wait=false", token=t)


def test_the_controllers_deletion_cost_grant_reaches_no_further(borrowers: Kubectl) -> None:
    """What the leasing controller now writes on a Deployment's pods before a lend's scale-down
    (Kubernetes' pod-deletion-cost): a stolen controllers token may set it, on tenant pods
    only, and nothing more with it: not in kube-system, not together with a label or another
    annotation."""
    c, t = borrowers, token(borrowers, "tidelease-controllers")
    cost = {contract.ANN_POD_DELETION_COST: "-1000"}
    assert "do not touch pods in the namespace kube-system" in c.refused(
        t, "patch", "pod", "victim", "-n", "kube-system", MERGE, "-p",
        json.dumps({"metadata": {"annotations": cost}}),
    )  # fmt: skip
    error = c.refused(
        t, "patch", "pod", "borrower", "-n", "ml", MERGE, "-p",
        json.dumps({"metadata": {"annotations": {**cost, "example.com/x": "y"}}}),
    )  # fmt: skip
    assert "may not change the pod annotations" in error
    assert "example.com/x" in error
    assert "labels" in c.refused(
        t, "patch", "pod", "borrower", "-n", "ml", MERGE, "-p",
        json.dumps({"metadata": {"annotations": cost, "labels": {"a": "b"}}}),
    )  # fmt: skip
    c.kubectl(
        "patch", "pod", "borrower", "-n", "ml", MERGE, "-p",
        json.dumps({"metadata": {"annotations": cost}}), token=t,
    )  # fmt: skip


def test_the_controllers_scale_but_cannot_rewrite_a_template(borrowers: Kubectl) -> None:
    c, t = borrowers, token(borrowers, "tidelease-controllers")
    for patch in (
        '{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"attacker/evil:1"}]}}}}',
        '{"spec":{"template":{"spec":{"serviceAccountName":"tidelease-controllers"}}}}',
        '{"spec":{"replicas":3}}',  # replicas: through /scale only
        '{"metadata":{"annotations":{"example.com/x":"y"}}}',
    ):
        error = c.refused(t, "patch", "deployment", "online", "-n", "ml", MERGE, "-p", patch)
        assert "only by its scale subresource" in error, patch
    # The scale subresource, and the queues' measured throughput: allowed.
    c.kubectl("scale", "deployment", "online", "-n", "ml", "--replicas=3", token=t)
    c.kubectl(
        "patch", "deployment", "online", "-n", "ml", MERGE, "-p",
        json.dumps({"metadata": {"annotations": {contract.ANN_THROUGHPUT_MEASURED: "1:10"}}}),
        token=t,
    )  # fmt: skip
    stored = json.loads(c.kubectl("get", "deployment", "online", "-n", "ml", "-o", "json"))
    assert stored["spec"]["replicas"] == 3
    assert stored["spec"]["template"]["spec"]["containers"][0]["image"] == "local/app:v1"


async def test_the_leasing_controllers_own_writes_pass_with_its_token(
    borrowers: Kubectl, tmp_path: Path
) -> None:
    """KubeWorld's notice, eviction (the condition DisruptionTarget, the Eviction API) and
    scaling, as the leasing controller makes them, with the controllers' token; a status
    change beyond the condition is refused."""
    from common.model import Holder, PodUid, Priority
    from extender.leasing.kubeworld import KubeWorld
    from extender.rightofreturn.lease import Workload, parse_gpu_lease

    c = borrowers
    t = token(c, "tidelease-controllers")
    uid = json.loads(c.kubectl("get", "pod", "borrower", "-n", "ml", "-o", "json"))["metadata"][
        "uid"
    ]
    holder = Holder(PodUid(uid), "ml", "borrower", Priority.LOW, 0)
    lease = parse_gpu_lease({
        "metadata": {"name": "online", "namespace": "ml", "resourceVersion": "1"},
        "spec": {"owner": "online", "gpusPerReplica": 1,
                 "workload": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "online"}},
    })  # fmt: skip
    api = await KubeClient.connect(
        write_kubeconfig(tmp_path / "kubeconfig", c.apiserver.server, t, c.apiserver.ca)
    )
    status = "/api/v1/namespaces/ml/pods/borrower/status"
    try:
        # Its status beyond DisruptionTarget: refused (the phase, another condition).
        for body in (
            {"status": {"phase": "Failed"}},
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        ):
            with pytest.raises(TideleaseError, match="only in its condition DisruptionTarget"):
                await api.json(
                    "PATCH", status, body=body,
                    content_type="application/strategic-merge-patch+json",
                )  # fmt: skip
        world = KubeWorld(api)
        await world.notify(holder, lease, 946684800.0)
        noticed = json.loads(c.kubectl("get", "pod", "borrower", "-n", "ml", "-o", "json"))
        assert contract.ANN_RECLAIM_NOTICE in noticed["metadata"]["annotations"]
        await world.evict(holder, lease)
        assert c.run("get", "pod", "borrower", "-n", "ml").returncode != 0  # evicted
        workload = Workload("apps/v1", "Deployment", "online")
        await world.scale("ml", workload, 2)
        assert await world.replicas("ml", workload) == 2
    finally:
        await api.close()


@pytest.mark.parametrize(
    ("account", "own"),
    [
        ("tidelease-controllers", "tidelease-planner"),
        ("tidelease-extender", "tidelease-scheduler"),  # its kube-scheduler's (ownScheduler)
        ("tidelease-orchestrator", "tidelease-orchestrator"),
    ],
)
def test_each_component_writes_only_its_own_leases(
    cluster: Kubectl, account: str, own: str
) -> None:
    """leases-policy.yaml: no component creates another's leader Lease or a forged heartbeat,
    nor updates a Lease not its own; its own is created and renewed."""
    c, t = cluster, token(cluster, account)
    lease = {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "attacker", "namespace": NS},
        "spec": {"holderIdentity": "attacker"},
    }  # fmt: skip
    mine = f"{account} writes only its own leader-election Leases"
    assert mine in c.refused(t, "create", "-f", "-", stdin=json.dumps(lease))
    forged = {**lease, "metadata": {"name": "tidelease-agent-node-y", "namespace": NS}}
    assert mine in c.refused(t, "create", "-f", "-", stdin=json.dumps(forged))
    leader = "tidelease-orchestrator" if own == "tidelease-planner" else "tidelease-planner"
    other = {**lease, "metadata": {"name": leader, "namespace": NS}}
    assert mine in c.refused(t, "create", "-f", "-", stdin=json.dumps(other))
    # Another's Lease (an agent's heartbeat) is not updated: RBAC names each one's own.
    heartbeat = {**lease, "metadata": {"name": "tidelease-agent-node-z", "namespace": NS}}
    c.apply(heartbeat)
    try:
        assert "forbidden" in c.refused(
            t, "patch", "lease", "tidelease-agent-node-z", "-n", NS, MERGE, "-p",
            '{"spec":{"holderIdentity":"attacker"}}',
        )  # fmt: skip
        done = c.run("auth", "can-i", "update", "leases/tidelease-agent-node-z", "-n", NS, token=t)
        assert done.stdout.strip() == "no", done
    finally:
        c.kubectl("delete", "lease", "tidelease-agent-node-z", "-n", NS, "--ignore-not-found")
    # Its own leader Lease: created and renewed.
    c.kubectl("delete", "lease", own, "-n", NS, "--ignore-not-found")
    created = {**lease, "metadata": {"name": own, "namespace": NS}}
    c.kubectl("create", "-f", "-", stdin=json.dumps(created), token=t)
    stored = json.loads(c.kubectl("get", "lease", own, "-n", NS, "-o", "json"))
    stored["spec"]["holderIdentity"] = f"{account}-0"
    c.kubectl("replace", "-f", "-", stdin=json.dumps(stored), token=t)
    c.kubectl("delete", "lease", own, "-n", NS)


async def test_an_agent_renews_only_its_own_heartbeat(cluster: Kubectl, tmp_path: Path) -> None:
    """The agent's token bound to its pod on node-a: the leasing controller's leader Lease and
    node-b's heartbeat are refused; its own heartbeat is created and renewed (as
    nodeagent/publishing.py does: a merge patch, a create when missing)."""
    from nodeagent.publishing import lease_object

    c = cluster
    leader = {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "tidelease-leasing-controller", "namespace": NS},
        "spec": {"holderIdentity": "controllers-0", "leaseDurationSeconds": 15},
    }  # fmt: skip
    c.apply(leader)
    t = token(c, "tidelease-agent", pod="agent-node-a")
    api = await KubeClient.connect(
        write_kubeconfig(tmp_path / "kubeconfig", c.apiserver.server, t, c.apiserver.ca)
    )
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    merge = "application/merge-patch+json"
    try:
        taken = {"spec": {"holderIdentity": "attacker", "leaseDurationSeconds": 3600}}
        with pytest.raises(TideleaseError, match="only its own node"):
            await api.json(
                "PATCH", f"{leases}/tidelease-leasing-controller", body=taken, content_type=merge
            )
        with pytest.raises(TideleaseError, match="only its own node"):
            await api.json("POST", leases, body=lease_object(NS, "node-b", 0.0, 40))
        await api.json("POST", leases, body=lease_object(NS, "node-a", 0.0, 40))
        renewed = {"spec": lease_object(NS, "node-a", 60.0, 40)["spec"]}
        await api.json(
            "PATCH", f"{leases}/tidelease-agent-node-a", body=renewed, content_type=merge
        )
        held = json.loads(
            c.kubectl("get", "lease", "tidelease-leasing-controller", "-n", NS, "-o", "json")
        )
        assert held["spec"]["holderIdentity"] == "controllers-0"
        assert not c.can(t, "delete", "leases", NS)
    finally:
        await api.close()
        for name in ("tidelease-leasing-controller", "tidelease-agent-node-a"):
            c.kubectl("delete", "lease", name, "-n", NS, "--ignore-not-found")


def test_what_this_wave_granted_reaches_no_further(cluster: Kubectl) -> None:
    """The grants tenancy and least privilege added, tried with a stolen token: the controllers
    create Secrets only in the release namespace (the queues' key, the certificates) and read
    none there but the certificates'; the agent reads a ledger by name and lists none; every
    component reads namespaces (the granted label), none changes one."""
    controllers = token(cluster, "tidelease-controllers")
    for ns in ("kube-system", "default", "ml"):
        assert not cluster.can(controllers, "create", "secrets", ns), ns
    assert not cluster.can(controllers, "get", "secrets/tidelease-queue-release-key", NS)
    assert not cluster.can(controllers, "list", "secrets", NS)
    agent = token(cluster, "tidelease-agent", "agent-node-a")
    assert cluster.can(agent, "get", "gpuallocations.tidelease.io")
    for verb in ("list", "watch", "update", "delete"):
        assert not cluster.can(agent, verb, "gpuallocations.tidelease.io"), verb
    for account in ("tidelease-extender", "tidelease-controllers"):
        t = token(cluster, account)
        assert cluster.can(t, "list", "namespaces")
        for verb in ("update", "patch", "create", "delete"):
            assert not cluster.can(t, verb, "namespaces"), (account, verb)
