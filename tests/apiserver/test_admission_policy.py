"""The chart's ValidatingAdmissionPolicies (common.admissionpolicy), judged by the real API
server. The pod-annotation policy: on a table of valid and invalid values it refuses exactly the
pods the extender's filter refuses, with the filter's message (both come from
common.annotationrules), at creation and when an update sets a value. The tenancy policies: a
tenant with the ordinary `edit` role, with its own token, tries each privilege; in a namespace
without the admin's grant each is refused with the message the extender gives, in one with it
the grants pass, and what tidelease writes on pods stays tidelease's own ServiceAccounts'."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common import admissionpolicy, builders, contract, tenancy
from common.errors import Conflict, InvalidInput, NotFound
from common.kubeclient import KubeClient
from common.podrequest import parse_pod
from extender.rightofreturn.lease import RECLAIM_OVERDUE, workload_of
from tests.apiserver.conftest import ApiServer
from tests.kubeconfigs import write_kubeconfig
from tests.polling import eventually

pytestmark = pytest.mark.apiserver

VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
PIN = "sha256:" + "0123456789abcdef" * 4
NAMES = (
    admissionpolicy.POLICY_NAME,
    admissionpolicy.ONLINE_POLICY_NAME,
    admissionpolicy.WRITTEN_POLICY_NAME,
)

PRI, REL, RCL = contract.ANN_PRIORITY, contract.ANN_RELIABILITY, contract.ANN_RECLAIM
JOB, ELA, TPT = contract.ANN_JOB_CLASS, contract.ANN_ELASTIC, contract.ANN_THROUGHPUT
OWN, GPU, CKP = contract.ANN_OWNER, contract.ANN_GPU_TYPE, contract.ANN_CHECKPOINT
WKL, MAX = contract.ANN_WORKLOAD, contract.ANN_MAX_REPLICAS
GRP, CAT = contract.ANN_POD_GROUP, contract.ANN_CHECKPOINTED_AT

TABLE: list[dict[str, str]] = [
    {PRI: "high", OWN: "recsys"},
    {PRI: "low"},
    {PRI: "urgent"},
    {PRI: "High"},
    {PRI: ""},
    {PRI: "ürgent"},
    {REL: "HA"},
    {REL: "ha"},
    {REL: "XA", PRI: "nope"},
    {RCL: "true", PRI: "high", OWN: "recsys"},
    {RCL: "true"},
    {RCL: "true", PRI: "high"},
    {RCL: "true", PRI: "high", OWN: "Bad_Owner"},
    {RCL: "yes"},
    {RCL: "false"},
    {JOB: "interactive"},
    {JOB: " Interactive\t"},
    {JOB: "\u00a0BATCH\u2003"},
    {JOB: "\x1cbatch"},
    {JOB: "queue"},
    {ELA: "false"},
    {ELA: "TRUE"},
    {ELA: "no"},
    {TPT: "100,190,270"},
    {TPT: "100, 190.5 ,2e3,.5,7."},
    {TPT: "1e100"},
    {TPT: "-5"},
    {TPT: "nan"},
    {TPT: "inf"},
    {TPT: ""},
    {TPT: "1,,2"},
    {TPT: "1_000"},
    {OWN: "recsys"},
    {OWN: "a" * 253},
    {OWN: "a" * 254},
    {OWN: "Job_A"},
    {OWN: "-job"},
    {OWN: "job.v2"},
    {GPU: "H20"},
    {GPU: "NVIDIA-H100-80GB"},
    {GPU: "H20 SXM"},
    {GPU: "-x"},
    {GPU: "x" * 64},
    {CKP: "ck-1"},
    {CKP: f"ck-1@{PIN}"},
    {CKP: f"ck-1@{PIN.upper().replace('SHA256', 'sha256')}"},
    {CKP: "ck@md5:abc"},
    {CKP: f"@{PIN}"},
    {CKP: "a@b@c"},
    {CKP: ""},
    {CKP: "it's"},
    {PRI: "x", REL: "y", RCL: "z", JOB: "w", ELA: "v", TPT: "u", OWN: "T", GPU: " ", CKP: "@"},
    {"tidelease.io/hot-restart": "true"},
    {WKL: "Deployment/train", MAX: "6"},
    {WKL: "StatefulSet/db.v2", MAX: "10000"},
    {WKL: "Job/train", MAX: "0"},
    {WKL: "Deployment/Train", MAX: "10001"},
    {WKL: "Deployment/", MAX: "06"},
    {MAX: "12"},
    {GRP: "sweep-7"},
    {GRP: "a" * 63},
    {GRP: "a" * 64},
    {GRP: "Sweep"},
    {GRP: "sweep.7"},
    {GRP: "-sweep"},
    {CAT: "2026-11-29T04:00:00Z"},
    {CAT: "2026-11-29T04:00:00.123456789+01:00"},
    {CAT: "2026-11-29 04:00:00Z"},
    {CAT: "2026-13-01T00:00:00Z"},
    {CAT: "2026-11-29T24:00:00Z"},
    {CAT: "2026-11-29T04:00:00"},
    {CAT: "yesterday"},
]


def pod(ns: str, annotations: dict[str, str]) -> dict[str, Any]:
    obj = builders.pod("p-" + uuid.uuid4().hex[:8], 1, namespace=ns)
    obj["metadata"].pop("uid")
    obj["metadata"]["annotations"] = annotations
    obj.pop("status")
    return obj


def filter_says(ns: str, annotations: dict[str, str]) -> str | None:
    """The filter's verdict on the pod: its problems joined as it joins them, or None."""
    obj = pod(ns, annotations)
    obj["metadata"]["uid"] = "u"  # as the API server gives it
    try:
        parse_pod(obj)
    except InvalidInput as e:
        return str(e)
    return None


async def admission_says(kube: KubeClient, ns: str, annotations: dict[str, str]) -> str | None:
    """The API server's verdict on creating the pod: the policy's message, or None."""
    resp = await kube.raw(
        "POST", f"/api/v1/namespaces/{ns}/pods", query={"dryRun": "All"}, body=pod(ns, annotations)
    )
    try:
        status = json.loads(await resp.read())
    finally:
        resp.release()
    if resp.status == 201:
        return None
    assert resp.status == 422, status  # reason Invalid: a 4xx the author can act on
    prefix = (
        f"ValidatingAdmissionPolicy '{admissionpolicy.POLICY_NAME}' with binding "
        f"'{admissionpolicy.POLICY_NAME}' denied request: "
    )
    message = str(status["message"])
    assert prefix in message, message
    return message.split(prefix, 1)[1]


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    """A client; the policies and bindings the test installs are removed after it (the chart's
    install in other tests makes its own, and no other test's pods are judged by them)."""
    kube = await KubeClient.connect(apiserver.kubeconfig)
    try:
        yield kube
    finally:
        for path in (BINDINGS, VAP):
            for name in NAMES:
                with contextlib.suppress(NotFound):
                    await kube.json("DELETE", f"{path}/{name}")
        await kube.close()


async def install_policies(
    kube: KubeClient,
    namespace: str = contract.DEFAULT_AGENT_NAMESPACE,
    online_class: str = tenancy.DEFAULT_ONLINE_PRIORITY_CLASS,
) -> None:
    """The generated policies and bindings, as the chart installed in ``namespace`` makes
    them."""
    for obj in admissionpolicy.objects(namespace, online_class):
        path = VAP if obj["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
        with contextlib.suppress(Conflict):
            await kube.json("POST", path, body=obj)
    # The type checker's warnings, where kube-controller-manager runs its status controller
    # (not in this rig: there the status stays empty, and the API server judges the CEL alone).
    for name in NAMES:
        got = await kube.json("GET", f"{VAP}/{name}")
        assert not (got.get("status") or {}).get("typeChecking", {}).get("expressionWarnings"), got


async def namespace(kube: KubeClient, *, online: bool) -> str:
    """A namespace of the test's own; ``online``: with the admin's grant."""
    ns = f"vap-{uuid.uuid4().hex[:6]}"
    labels = {tenancy.LABEL_ONLINE: tenancy.ONLINE_VALUE} if online else {}
    await kube.json("POST", "/api/v1/namespaces", body={"metadata": {"name": ns, "labels": labels}})
    return ns


async def with_policy(kube: KubeClient) -> str:
    """A namespace of the test's own, granted online jobs (the table has priority high), once
    the policies are enforced in it."""
    ns = await namespace(kube, online=True)
    await install_policies(kube)

    async def enforced() -> bool:
        return await admission_says(kube, ns, {PRI: "urgent"}) is not None

    await eventually(enforced, within_s=30)
    return ns


async def test_the_api_server_refuses_what_the_filter_refuses_with_its_message(
    kube: KubeClient,
) -> None:
    ns = await with_policy(kube)
    refused = 0
    for values in TABLE:
        want = filter_says(ns, values)
        got = await admission_says(kube, ns, values)
        assert got == want, values
        refused += want is not None
    # The table is not all one way.
    assert 20 < refused < len(TABLE) - 15, refused


async def test_a_value_with_a_line_break_is_refused_with_the_fallback_message(
    kube: KubeClient,
) -> None:
    """The API server drops a message with a line break; the pod is refused all the same."""
    ns = await with_policy(kube)
    assert filter_says(ns, {OWN: "recsys\n"}) is not None
    assert await admission_says(kube, ns, {OWN: "recsys\n"}) == admissionpolicy.FALLBACK_MESSAGE


async def test_an_update_that_sets_an_invalid_value_is_refused_and_others_pass(
    kube: KubeClient,
) -> None:
    """On update the policy judges only annotations set or changed: a pod created before the
    policy with a value it refuses can still be labelled, not given another invalid value."""
    ns = await namespace(kube, online=True)
    old = pod(ns, {PRI: "urgent"})

    async def created() -> bool:
        # Once the policies of an earlier test are gone from the API server's view.
        return await said(kube, "POST", f"/api/v1/namespaces/{ns}/pods", old) is None

    await eventually(created, within_s=30)
    await with_policy(kube)
    path = f"/api/v1/namespaces/{ns}/pods/{old['metadata']['name']}"
    assert await said(kube, "PATCH", path, {"metadata": {"labels": {"app": "x"}}}) is None
    got = await said(kube, "PATCH", path, {"metadata": {"annotations": {REL: "XA"}}})
    assert got == (
        422,
        admissionpolicy.POLICY_NAME,
        filter_says(ns, {PRI: "urgent", REL: "XA"}),
    )


# --- tenancy: privileges come from the admin ---

GATE = contract.SCHEDULING_GATE
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


async def said(
    kube: KubeClient,
    method: str,
    path: str,
    body: Any,
    *,
    content_type: str | None = None,
    query: dict[str, str] | None = None,
) -> tuple[int, str, str] | None:
    """None when the request passes; else its status code, the refusing policy's name and the
    policy's message."""
    if content_type is None:
        content_type = MERGE if method == "PATCH" else "application/json"
    resp = await kube.raw(method, path, query=query, body=body, content_type=content_type)
    try:
        status = json.loads(await resp.read())
    finally:
        resp.release()
    if 200 <= resp.status < 300:
        return None
    message = str(status.get("message"))
    head, sep, text = message.partition("' denied request: ")
    assert sep, (resp.status, message)
    name = head.partition("ValidatingAdmissionPolicy '")[2].split("'", 1)[0]
    return resp.status, name, text


@dataclass
class Tenancy:
    """The policies as the chart installed in ``release`` makes them, with the online class
    ``online_class``; namespaces ``b`` (no grant) and ``a`` (granted), each with a tenant
    holding `edit` and the rights on GpuLeases an admin would give; a client for each tenant
    and for each of tidelease's ServiceAccounts, with their own tokens."""

    admin: KubeClient
    release: str
    online_class: str
    a: str
    b: str
    tenants: dict[str, KubeClient]
    accounts: dict[str, KubeClient]

    def tenant_user(self, ns: str) -> str:
        return admissionpolicy.service_account(ns, "tenant")

    def account_user(self, account: str) -> str:
        return admissionpolicy.service_account(self.release, account)


def tenant_pod(
    ns: str,
    annotations: dict[str, str] | None = None,
    *,
    priority_class: str | None = None,
    gated: bool = False,
    gate: str = GATE,
) -> dict[str, Any]:
    obj = pod(ns, annotations or {})
    if priority_class is not None:
        obj["spec"]["priorityClassName"] = priority_class
    if gated:
        obj["spec"]["schedulingGates"] = [{"name": gate}]
    return obj


def lease(ns: str, name: str = "recsys") -> dict[str, Any]:
    return builders.gpu_lease(name, ns, gpus_per_replica=4, desired_gpus=8)


def pods_of(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


def leases_of(ns: str) -> str:
    return f"/apis/{contract.API_VERSION}/namespaces/{ns}/{contract.PLURAL_GPU_LEASE}"


async def token_client(
    admin: KubeClient, apiserver: ApiServer, ns: str, account: str, where: Path
) -> KubeClient:
    """A client with a fresh token of the ServiceAccount (a TokenRequest, as kubectl create
    token makes)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    got = await admin.json(
        "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token", body=request
    )
    path = write_kubeconfig(
        where / f"{ns}-{account}.kubeconfig", apiserver.server, got["status"]["token"], apiserver.ca
    )
    return await KubeClient.connect(path)


async def aggregated(admin: KubeClient, role: str, name: str) -> dict[str, Any]:
    """A ClusterRole ``name`` with the rules kube-controller-manager aggregates into the
    built-in ClusterRole ``role``."""
    rbac = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
    built_in = await admin.json("GET", f"{rbac}/{role}")
    rules: list[dict[str, Any]] = []
    for selector in built_in["aggregationRule"]["clusterRoleSelectors"]:
        labels = ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items())
        listed = await admin.json("GET", rbac, query={"labelSelector": labels})
        rules += [r for item in listed["items"] for r in item.get("rules") or []]
    assert rules, role
    return {"metadata": {"name": name}, "rules": rules}


@pytest.fixture
async def tenancy_world(
    apiserver: ApiServer, kube: KubeClient, tmp_path: Path
) -> AsyncIterator[Tenancy]:
    admin = kube
    suffix = uuid.uuid4().hex[:6]
    release, online_class = f"vap-rel-{suffix}", f"vap-online-{suffix}"
    role, edit = f"vap-pods-{suffix}", f"vap-edit-{suffix}"
    made: list[str] = []
    clients: list[KubeClient] = []

    async def create(path: str, obj: dict[str, Any]) -> None:
        await admin.json("POST", path, body=obj)
        made.append(f"{path}/{obj['metadata']['name']}")

    try:
        await create("/api/v1/namespaces", {"metadata": {"name": release}})
        await create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {"metadata": {"name": online_class}, "value": 100000},
        )
        # tidelease's ServiceAccounts may write pods anywhere (the chart's RBAC, in short).
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        await create(
            f"{rbac}/clusterroles",
            {
                "metadata": {"name": role},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["pods", "pods/status"],
                        "verbs": ["get", "list", "update", "patch"],
                    }
                ],
            },
        )
        # The built-in edit role, as kube-controller-manager aggregates it (not run here).
        await create(f"{rbac}/clusterroles", await aggregated(admin, "edit", edit))
        subjects = [
            {"kind": "ServiceAccount", "name": a, "namespace": release}
            for a in admissionpolicy.ACCOUNTS
        ]
        await create(
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": subjects,
            },
        )
        for account in admissionpolicy.ACCOUNTS:
            await admin.json(
                "POST",
                f"/api/v1/namespaces/{release}/serviceaccounts",
                body={"metadata": {"name": account}},
            )
        a, b = await namespace(admin, online=True), await namespace(admin, online=False)
        made += [f"/api/v1/namespaces/{a}", f"/api/v1/namespaces/{b}"]
        for ns in (a, b):
            await admin.json(
                "POST",
                f"/api/v1/namespaces/{ns}/serviceaccounts",
                body={"metadata": {"name": "tenant"}},
            )
            await admin.json(
                "POST",
                f"{rbac}/namespaces/{ns}/roles",
                body={
                    "metadata": {"name": "leases"},
                    "rules": [
                        {
                            "apiGroups": [contract.GROUP],
                            "resources": [contract.PLURAL_GPU_LEASE],
                            "verbs": ["get", "list", "create", "update", "patch", "delete"],
                        }
                    ],
                },
            )
            tenant = [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}]
            for name, kind in ((edit, "ClusterRole"), ("leases", "Role")):
                await admin.json(
                    "POST",
                    f"{rbac}/namespaces/{ns}/rolebindings",
                    body={
                        "metadata": {"name": f"tenant-{name}"},
                        "roleRef": {
                            "apiGroup": "rbac.authorization.k8s.io",
                            "kind": kind,
                            "name": name,
                        },
                        "subjects": tenant,
                    },
                )
        tenants = {
            ns: await token_client(admin, apiserver, ns, "tenant", tmp_path) for ns in (a, b)
        }
        accounts = {
            account: await token_client(admin, apiserver, release, account, tmp_path)
            for account in admissionpolicy.ACCOUNTS
        }
        clients += [*tenants.values(), *accounts.values()]
        world = Tenancy(admin, release, online_class, a, b, tenants, accounts)
        await install_policies(admin, release, online_class)

        probe = tenant_pod(a)
        await admin.json("POST", pods_of(a), body=probe)
        probe_path = f"{pods_of(a)}/{probe['metadata']['name']}"

        async def enforced() -> bool:
            # These policies (not an earlier test's, gone but maybe still in the API server's
            # view: the class and the release are this test's own), and the tenants' RBAC.
            devices = {"metadata": {"annotations": {contract.ANN_DEVICES: "GPU-1"}}}
            extender = accounts[admissionpolicy.EXTENDER_ACCOUNT]
            if await said(extender, "PATCH", probe_path, devices, query={"dryRun": "All"}):
                return False
            probes = [
                (b, tenant_pod(b, priority_class=online_class), admissionpolicy.ONLINE_POLICY_NAME),
                (b, tenant_pod(b, {PRI: "high"}), admissionpolicy.ONLINE_POLICY_NAME),
                (
                    a,
                    tenant_pod(a, {contract.ANN_DEVICES: "GPU-1"}),
                    admissionpolicy.WRITTEN_POLICY_NAME,
                ),
                (a, tenant_pod(a, {PRI: "urgent"}), admissionpolicy.POLICY_NAME),
            ]
            for ns, obj, name in probes:
                got = await tenants[ns].raw("POST", pods_of(ns), query={"dryRun": "All"}, body=obj)
                text = await got.read()
                got.release()
                if name.encode() not in text:
                    return False
            return True

        await eventually(enforced, within_s=30)
        yield world
    finally:
        for c in clients:
            await c.close()
        for path in reversed(made):
            with contextlib.suppress(NotFound):
                await admin.json("DELETE", path)


def online_refusal(ns: str, what: str) -> tuple[int, str, str]:
    return 422, admissionpolicy.ONLINE_POLICY_NAME, tenancy.online_refusal(ns, what)


def written_refusal(key: str, user: str) -> tuple[int, str, str]:
    return 403, admissionpolicy.WRITTEN_POLICY_NAME, admissionpolicy.written_refusal(key, user)


async def test_a_tenant_without_the_grant_gets_no_online_privilege(
    tenancy_world: Tenancy,
) -> None:
    """In namespace B (no tidelease.io/online label) the tenant's pod with priority high, its
    pod of the online PriorityClass, its GpuLease, and its update of a pod to priority high are
    refused, each with the message the extender gives."""
    w = tenancy_world
    b, tenant = w.b, w.tenants[w.b]
    high = await said(tenant, "POST", pods_of(b), tenant_pod(b, {PRI: "high", OWN: "recsys"}))
    assert high == online_refusal(b, admissionpolicy.WHAT_PRIORITY)
    klass = await said(tenant, "POST", pods_of(b), tenant_pod(b, priority_class=w.online_class))
    assert klass == online_refusal(b, admissionpolicy.what_class(w.online_class))
    assert await said(tenant, "POST", leases_of(b), lease(b)) == online_refusal(
        b, admissionpolicy.WHAT_LEASE
    )
    low = tenant_pod(b, {PRI: "low", OWN: "recsys"})
    assert await said(tenant, "POST", pods_of(b), low) is None
    raise_it = {"metadata": {"annotations": {PRI: "high"}}}
    path = f"{pods_of(b)}/{low['metadata']['name']}"
    assert await said(tenant, "PATCH", path, raise_it) == online_refusal(
        b, admissionpolicy.WHAT_PRIORITY
    )
    # tidelease's own ServiceAccounts get no grant either: the namespace's label is the grant.
    controllers = w.accounts[admissionpolicy.CONTROLLERS_ACCOUNT]
    assert await said(controllers, "PATCH", path, raise_it) == online_refusal(
        b, admissionpolicy.WHAT_PRIORITY
    )
    # The reclaim annotation grants nothing, so it needs nothing.
    assert await said(tenant, "PATCH", path, {"metadata": {"annotations": {RCL: "true"}}}) is None


async def test_a_tenant_with_the_grant_runs_online_jobs(tenancy_world: Tenancy) -> None:
    w = tenancy_world
    a, tenant = w.a, w.tenants[w.a]
    assert await said(tenant, "POST", pods_of(a), tenant_pod(a, {PRI: "high", OWN: "r"})) is None
    assert (
        await said(tenant, "POST", pods_of(a), tenant_pod(a, priority_class=w.online_class)) is None
    )
    assert await said(tenant, "POST", leases_of(a), lease(a)) is None
    spec = {"spec": {"desiredGPUs": 4}}
    assert await said(tenant, "PATCH", f"{leases_of(a)}/recsys", spec) is None
    low = tenant_pod(a, {PRI: "low"})
    assert await said(tenant, "POST", pods_of(a), low) is None
    path = f"{pods_of(a)}/{low['metadata']['name']}"
    assert await said(tenant, "PATCH", path, {"metadata": {"annotations": {PRI: "high"}}}) is None


async def test_what_was_granted_before_keeps_its_updates_that_grant_nothing_new(
    tenancy_world: Tenancy,
) -> None:
    """The admin takes the grant back: the namespace's high-priority pod can still be labelled
    (and its finalizers removed, as the garbage collector does), its GpuLease can lose its
    finalizer, but the lease's spec cannot change."""
    w = tenancy_world
    ns = await namespace(w.admin, online=True)
    try:
        tenant_path = f"/api/v1/namespaces/{ns}"
        high = tenant_pod(ns, {PRI: "high"})
        high["metadata"]["finalizers"] = ["example.com/keep"]
        assert await said(w.admin, "POST", pods_of(ns), high) is None
        held = lease(ns)
        held["metadata"]["finalizers"] = ["example.com/keep"]
        assert await said(w.admin, "POST", leases_of(ns), held) is None
        ungrant = {"metadata": {"labels": {tenancy.LABEL_ONLINE: None}}}
        assert await said(w.admin, "PATCH", tenant_path, ungrant) is None

        async def ungranted() -> bool:
            probe = await said(w.admin, "POST", f"{leases_of(ns)}?dryRun=All", lease(ns, "probe"))
            return probe is not None

        await eventually(ungranted, within_s=30)
        pod_path = f"{pods_of(ns)}/{high['metadata']['name']}"
        assert await said(w.admin, "PATCH", pod_path, {"metadata": {"labels": {"a": "b"}}}) is None
        lease_path = f"{leases_of(ns)}/recsys"
        assert await said(
            w.admin, "PATCH", lease_path, {"spec": {"desiredGPUs": 4}}
        ) == online_refusal(ns, admissionpolicy.WHAT_LEASE)
        for path in (pod_path, lease_path):
            unheld = {"metadata": {"finalizers": None}}
            assert await said(w.admin, "PATCH", path, unheld) is None, path
    finally:
        with contextlib.suppress(NotFound):
            await w.admin.json("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.mark.parametrize("granted", [False, True], ids=["no-grant", "granted"])
async def test_a_tenant_cannot_write_what_tidelease_writes(
    tenancy_world: Tenancy, granted: bool
) -> None:
    """Granted or not: a pod created with tidelease.io/devices, a change of the devices or
    their node that the extender wrote, their removal, and the removal of the queues' gate
    are refused, each naming what only tidelease writes."""
    w = tenancy_world
    ns = w.a if granted else w.b
    tenant, user = w.tenants[ns], w.tenant_user(ns)
    extender = w.accounts[admissionpolicy.EXTENDER_ACCOUNT]
    devices = {contract.ANN_DEVICES: "GPU-1,GPU-2", contract.ANN_DEVICE_NODE: "node-a"}

    made = tenant_pod(ns, {contract.ANN_DEVICES: "GPU-1"})
    assert await said(tenant, "POST", pods_of(ns), made) == written_refusal(
        contract.ANN_DEVICES, user
    )
    # Nobody sets them at creation: the admin neither.
    assert await said(w.admin, "POST", pods_of(ns), made) is not None

    running = tenant_pod(ns, {PRI: "low"})
    assert await said(tenant, "POST", pods_of(ns), running) is None
    path = f"{pods_of(ns)}/{running['metadata']['name']}"
    assert await said(extender, "PATCH", path, {"metadata": {"annotations": devices}}) is None
    for change, key in (
        ({contract.ANN_DEVICES: "GPU-3,GPU-4"}, contract.ANN_DEVICES),
        ({contract.ANN_DEVICE_NODE: "node-b"}, contract.ANN_DEVICE_NODE),
        ({contract.ANN_DEVICES: None}, contract.ANN_DEVICES),
        ({contract.ANN_DEVICES_ASSIGNED: "true"}, contract.ANN_DEVICES_ASSIGNED),
        ({contract.ANN_QUEUE: "1"}, contract.ANN_QUEUE),
        ({contract.ANN_RECLAIM_NOTICE: "2030-01-01T00:00:00Z"}, contract.ANN_RECLAIM_NOTICE),
    ):
        got = await said(tenant, "PATCH", path, {"metadata": {"annotations": change}})
        assert got == written_refusal(key, user), change
    # A whole replace that drops them is refused too.
    current = await w.admin.json("GET", path)
    current["metadata"]["annotations"] = {PRI: "low"}
    assert await said(tenant, "PUT", path, current) == written_refusal(contract.ANN_DEVICES, user)

    # Neither the queues' gate nor DRA mode's reclaim gate (the returning replica's claim not
    # pinned yet) is the tenant's to lift.
    for gate in admissionpolicy.CONTROLLER_GATES:
        gated = tenant_pod(ns, {PRI: "low"}, gated=True, gate=gate)
        assert await said(tenant, "POST", pods_of(ns), gated) is None
        gated_path = f"{pods_of(ns)}/{gated['metadata']['name']}"
        ungate = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
        got = await said(tenant, "PATCH", gated_path, ungate, content_type=JSON_PATCH)
        assert got == (
            403,
            admissionpolicy.WRITTEN_POLICY_NAME,
            admissionpolicy.gate_refusal(user),
        ), gate


async def test_tidelease_writes_what_it_writes_and_the_kubelet_and_gc_pass(
    tenancy_world: Tenancy,
) -> None:
    """The extender sets devices; the agent sets devices-assigned; the controllers set a
    reclaim notice and, alone, release the queues' gate; the kubelet's status updates and a
    finalizer's removal (the garbage collector's) on a pod that carries them pass."""
    w = tenancy_world
    ns, tenant = w.b, w.tenants[w.b]
    acct = w.accounts
    ext, ctl = admissionpolicy.EXTENDER_ACCOUNT, admissionpolicy.CONTROLLERS_ACCOUNT
    agent, orch = admissionpolicy.AGENT_ACCOUNT, admissionpolicy.ORCHESTRATOR_ACCOUNT
    running = tenant_pod(ns, {PRI: "low"})
    running["metadata"]["finalizers"] = ["example.com/keep"]
    assert await said(tenant, "POST", pods_of(ns), running) is None
    path = f"{pods_of(ns)}/{running['metadata']['name']}"
    for account, written in (
        (ext, {contract.ANN_DEVICES: "GPU-1", contract.ANN_DEVICE_NODE: "node-a"}),
        (agent, {contract.ANN_DEVICES_ASSIGNED: "true"}),
        (ctl, {contract.ANN_RECLAIM_NOTICE: "2030-01-01T00:00:00Z"}),
        (agent, {contract.ANN_HOT_RESTART_STATUS: "{}"}),
        (ctl, {contract.ANN_HOT_RESTART_REQUEST: "{}"}),
        (orch, {contract.ANN_ORCHESTRATION_RECORDS: "[]"}),
    ):
        got = await said(acct[account], "PATCH", path, {"metadata": {"annotations": written}})
        assert got is None, (account, written, got)
    # The kubelet's status, and the tenant's own label: the annotations are left as they are.
    status = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert await said(w.admin, "PATCH", f"{path}/status", status) is None
    assert await said(tenant, "PATCH", path, {"metadata": {"labels": {"app": "x"}}}) is None
    # A status update may change annotations: it is judged too.
    sneaky = {"metadata": {"annotations": {contract.ANN_DEVICES: "GPU-9"}}}
    assert await said(w.admin, "PATCH", f"{path}/status", sneaky) is not None
    assert await said(w.admin, "PATCH", path, {"metadata": {"finalizers": None}}) is None

    gated = tenant_pod(ns, {PRI: "low"}, gated=True)
    assert await said(tenant, "POST", pods_of(ns), gated) is None
    gated_path = f"{pods_of(ns)}/{gated['metadata']['name']}"
    ungate = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
    for account in (ext, agent, orch):
        got = await said(acct[account], "PATCH", gated_path, ungate, content_type=JSON_PATCH)
        assert got == (
            403,
            admissionpolicy.WRITTEN_POLICY_NAME,
            admissionpolicy.gate_refusal(w.account_user(account)),
        ), account
    # As the queues controller releases a pod: the gate off, its queue on, in one patch.
    release = [
        *ungate,
        {"op": "add", "path": "/metadata/annotations/tidelease.io~1queue", "value": "1"},
    ]
    assert await said(acct[ctl], "PATCH", gated_path, release, content_type=JSON_PATCH) is None
    released = await w.admin.json("GET", gated_path)
    assert not released["spec"].get("schedulingGates")


async def _status_of(kube: KubeClient, method: str, path: str, body: Any) -> int:
    resp = await kube.raw(method, path, body=body, content_type=MERGE)
    try:
        await resp.read()
    finally:
        resp.release()
    return resp.status


async def test_no_tenant_can_forge_an_overdue_reclaim(tenancy_world: Tenancy) -> None:
    """A lease's stored ``Degraded: ReclaimOverdue`` releases its returning replicas from
    waiting for their own groups (extender.scheduler.filtering): only the controllers write
    it. A tenant with `edit` and the rights on GpuLeases an admin gives, in the lease's own
    namespace, cannot write it (no ``gpuleases/status``; the API server drops status from a
    write of the main resource); a tenant of another namespace reaches the lease not at all.
    The admin's write shows the check would see it."""
    w = tenancy_world
    a, b = w.a, w.b
    assert await said(w.admin, "POST", leases_of(a), lease(a)) is None
    path = f"{leases_of(a)}/recsys"
    forged = {
        "status": {
            "phase": "Reclaiming",
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": RECLAIM_OVERDUE,
                    "message": "forged",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    }
    own, other = w.tenants[a], w.tenants[b]
    assert await _status_of(own, "PATCH", f"{path}/status", forged) == 403
    assert await _status_of(other, "PATCH", f"{path}/status", forged) == 403
    assert await _status_of(other, "PATCH", path, forged) == 403
    # The main resource: the tenant's write passes, its status is dropped.
    assert await _status_of(own, "PATCH", path, forged) == 200
    stored = await w.admin.json("GET", path)
    named = workload_of(stored)
    assert named is not None
    assert named.overdue is False, stored.get("status")

    assert await _status_of(w.admin, "PATCH", f"{path}/status", forged) == 200
    named = workload_of(await w.admin.json("GET", path))
    assert named is not None
    assert named.overdue is True
