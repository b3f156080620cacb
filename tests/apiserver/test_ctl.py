"""``kubectl tidelease`` (and ``tidelease ctl``) against a real API server with a populated
cluster: every command's table against a golden, its JSON parsed back, kubectl finding the
plugin on PATH, and clear errors.

The goldens are in tests/apiserver/golden/. The test never writes them: on a difference it
shows the diff and leaves what the command printed in the temporary directory, for whoever
changed the table on purpose to copy over the golden (and review in the commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import builders, contract
from common.errors import Conflict, NotFound
from common.kubeclient import KubeClient
from common.model import Allocation, Holder, JobKey, NodeName, PodUid, Priority, Tier
from common.objects import gpu_allocation_object
from common.timefmt import microtime
from tests.apiserver.conftest import ApiServer
from tests.chart import binary
from tests.kubeconfigs import write_kubeconfig

pytestmark = pytest.mark.apiserver

NS = "ctl-demo"
AGENT_NS = contract.DEFAULT_AGENT_NAMESPACE
GOLDEN = Path(__file__).parent / "golden"
BIN = Path(sys.executable).parent
CRD = f"/apis/{contract.API_VERSION}"


def uuid(node: str, i: int) -> str:
    return builders.device_uuid(node, i)


def cluster_objects() -> dict[str, list[dict[str, Any]]]:
    """Three readable GpuNodes and one the agent wrote wrongly; two agents heard from, one
    silent; a lease lending one device to a borrower; an owner's pod holding two devices."""
    a = [
        *builders.devices("node-a", 2),
        *builders.devices("node-a", 1, owner=f"{NS}/recsys", replica="recsys-1", start=2),
        *builders.devices("node-a", 1, standby=True, start=3),
    ]
    b = builders.devices("node-b", 4, gpu_type="A100", tier=Tier.MA)
    c = builders.devices("node-c", 2, tier=Tier.LA)
    nodes = [builders.gpu_node("node-a", a), builders.gpu_node("node-b", b)]
    nodes.append(builders.gpu_node("node-c", c))
    nodes[1]["status"]["devices"][3].update(health="Unhealthy", reason="XID 79: fell off the bus")
    nodes[1]["status"]["availability"] = {uuid("node-b", 3): [[1000, 1900, 1], [1900, 2000, 0]]}
    # The schema lets it through; the extender's parser does not (it then offers nothing there).
    bad = builders.gpu_node("node-bad", builders.devices("node-bad", 2))
    bad["status"]["devices"][1]["uuid"] = bad["status"]["devices"][0]["uuid"]
    nodes.append(bad)

    def held(node: str, name: str, priority: Priority, owner: str | None, *devs: int) -> Any:
        who = Holder(
            PodUid(f"uid-{name}"), NS, name, priority, 1000, JobKey(owner) if owner else None
        )
        allocation = Allocation(who, tuple(builders.device_uuid(node, i) for i in devs))
        return gpu_allocation_object(NodeName(node), [allocation], "")

    ledgers = [
        held("node-a", "train-1", Priority.LOW, None, 2),
        held("node-b", "recsys-0", Priority.HIGH, "recsys", 0, 1),
    ]
    lease = builders.gpu_lease("recsys", NS, owner="recsys", gpus_per_replica=1, desired_gpus=2)
    return {"nodes": nodes, "ledgers": ledgers, "lease": [lease]}


LEASE_STATUS = {
    "phase": "Lending",
    "targetReplicas": 2,
    "lent": [{"replica": "recsys-1", "devices": [uuid("node-a", 2)]}],
    "reclaims": 2,
    "returned": 3,
    "backfilled": 1,
    "lastReclaimSeconds": 41.5,
}


def agent_lease(node: str, renewed: float) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"{contract.AGENT_LEASE_PREFIX}{node}",
            "namespace": AGENT_NS,
            "labels": {contract.AGENT_LABEL_KEY: contract.AGENT_LABEL_VALUE},
        },
        "spec": {"holderIdentity": node, "renewTime": microtime(renewed)},
    }


async def _clear(kube: KubeClient) -> None:
    for path in (
        f"{CRD}/{contract.PLURAL_GPU_NODE}",
        f"{CRD}/{contract.PLURAL_GPU_ALLOCATION}",
        f"{CRD}/namespaces/{NS}/{contract.PLURAL_GPU_LEASE}",
        f"/api/v1/namespaces/{NS}/pods",
    ):
        await kube.json("DELETE", path)
    for item in (await kube.json("GET", f"{CRD}/{contract.PLURAL_GPU_LEASE}"))["items"]:
        meta = item["metadata"]
        path = f"{CRD}/namespaces/{meta['namespace']}/{contract.PLURAL_GPU_LEASE}/{meta['name']}"
        await kube.json("DELETE", path)
    await kube.json(
        "DELETE",
        f"/apis/coordination.k8s.io/v1/namespaces/{AGENT_NS}/leases",
        query={"labelSelector": f"{contract.AGENT_LABEL_KEY}={contract.AGENT_LABEL_VALUE}"},
    )


async def _ensure_namespace(kube: KubeClient, name: str) -> None:
    try:
        await kube.json("GET", f"/api/v1/namespaces/{name}")
    except NotFound:
        await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(name))


async def _populate(kube: KubeClient) -> None:
    for ns in (NS, AGENT_NS):
        await _ensure_namespace(kube, ns)
    await _clear(kube)  # other tests' objects: the goldens show this cluster alone
    objs = cluster_objects()
    for node in objs["nodes"]:
        created = await kube.json("POST", f"{CRD}/{contract.PLURAL_GPU_NODE}", body=node)
        created["status"] = node["status"]  # as the agent writes it: its status subresource
        name = node["metadata"]["name"]
        await kube.json("PUT", f"{CRD}/{contract.PLURAL_GPU_NODE}/{name}/status", body=created)
    for ledger in objs["ledgers"]:
        await kube.json("POST", f"{CRD}/{contract.PLURAL_GPU_ALLOCATION}", body=ledger)
    path = f"{CRD}/namespaces/{NS}/{contract.PLURAL_GPU_LEASE}"
    created = await kube.json("POST", path, body=objs["lease"][0])
    created["status"] = LEASE_STATUS
    await kube.json("PUT", f"{path}/recsys/status", body=created)
    now = time.time()
    for name, renewed in (("node-a", now), ("node-b", now), ("node-c", now - 3600)):
        await kube.json(
            "POST",
            f"/apis/coordination.k8s.io/v1/namespaces/{AGENT_NS}/leases",
            body=agent_lease(name, renewed),
        )
    pods = [
        builders.pod("wide-8", 8, namespace=NS),
        builders.pod("owner-2", 2, namespace=NS, priority=Priority.HIGH, owner="recsys"),
        builders.pod(
            "bad-tier", 1, namespace=NS, extra_annotations={contract.ANN_RELIABILITY: "XX"}
        ),
    ]
    for pod in pods:
        del pod["metadata"]["uid"]
        await kube.json("POST", f"/api/v1/namespaces/{NS}/pods", body=pod)


async def _with_kube(api: ApiServer, populate: bool) -> None:
    kube = await KubeClient.connect(api.kubeconfig)
    try:
        await (_populate(kube) if populate else _clear(kube))
    finally:
        await kube.close()


@pytest.fixture(scope="module")
def populated(apiserver: ApiServer) -> Iterator[ApiServer]:
    asyncio.run(_with_kube(apiserver, populate=True))
    yield apiserver
    asyncio.run(_with_kube(apiserver, populate=False))


def ctl(
    api: ApiServer, *args: str, tool: str = "kubectl-tidelease"
) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / tool)] if tool == "kubectl-tidelease" else [str(BIN / "tidelease"), "ctl"]
    env = {**os.environ, "KUBECONFIG": str(api.kubeconfig), "NO_COLOR": "1"}
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def golden(name: str, text: str) -> None:
    path = GOLDEN / f"ctl-{name}.txt"
    want = path.read_text()
    if text != want:
        actual = Path(tempfile.gettempdir()) / f"ctl-{name}.actual.txt"
        actual.write_text(text)
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True), text.splitlines(keepends=True), str(path), "now"
            )
        )
        raise AssertionError(f"{path} differs (now: {actual}):\n{diff}")


COMMANDS = {
    "status": ["status"],
    "nodes": ["nodes"],
    "node-a": ["node", "node-a"],
    "node-b": ["node", "node-b"],
    "node-bad": ["node", "node-bad"],
    "leases": ["leases", "-n", NS],
    "lease": ["lease", "recsys", "-n", NS],
    "explain-wide": ["explain", "wide-8", "-n", NS],
    "explain-owner": ["explain", "owner-2", "-n", NS],
    "explain-bad": ["explain", "bad-tier", "-n", NS],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_prints_its_golden_table(populated: ApiServer, name: str) -> None:
    done = ctl(populated, *COMMANDS[name])
    assert done.returncode == 0, done.stderr
    golden(name, done.stdout)


def test_status_counts_every_device_by_type_tier_and_state(populated: ApiServer) -> None:
    done = ctl(populated, "status", "-o", "json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    rows = {(g["type"], g["tier"]): g for g in status["gpus"]}
    h20 = rows[("H20", "HA")]  # node-a: 2 free, 1 lent and borrowed, 1 standby and free
    assert (h20["total"], h20["free"], h20["borrowed"], h20["lent"]) == (4, 3, 1, 1)
    assert (h20["standby_free"], h20["standby_on_loan"]) == (1, 0)
    a100 = rows[("A100", "MA")]  # node-b: the owner holds 2, 1 free, 1 unhealthy
    assert (a100["total"], a100["held"], a100["free"], a100["unhealthy"]) == (4, 2, 1, 1)
    assert status["silent_nodes"] == ["node-c"]
    assert status["unreadable_nodes"] == ["node-bad"]
    (lease,) = status["leases"]
    assert (lease["phase"], lease["desired_gpus"], lease["held_gpus"], lease["lent_gpus"]) == (
        "Lending",
        2,
        2,
        1,
    )


def test_json_and_yaml_give_the_same_data(populated: ApiServer) -> None:
    for args in (["nodes"], ["lease", "recsys", "-n", NS], ["explain", "wide-8", "-n", NS]):
        as_json = json.loads(ctl(populated, *args, "-o", "json").stdout)
        as_yaml = yaml.safe_load(ctl(populated, *args, "-o", "yaml").stdout)
        assert as_json == as_yaml
    (node_a,) = [
        n for n in json.loads(ctl(populated, "nodes", "-o", "json").stdout) if n["name"] == "node-a"
    ]
    lent = [d for d in node_a["devices"] if d["owner"] == f"{NS}/recsys"]
    assert [(d["uuid"], d["state"], d["holder"]) for d in lent] == [
        (uuid("node-a", 2), "borrowed", f"{NS}/train-1")
    ]


def test_explain_uses_the_filters_own_words(populated: ApiServer) -> None:
    wide = json.loads(ctl(populated, "explain", "wide-8", "-n", NS, "-o", "json").stdout)
    assert wide["fitting"] == 0
    verdicts = {n["node"]: (n["verdict"], n["reason"]) for n in wide["nodes"]}
    assert verdicts["node-c"][1].startswith("tidelease: node agent silent")
    assert verdicts["node-bad"][1].startswith("tidelease: node has no GPU inventory")
    owner = json.loads(ctl(populated, "explain", "owner-2", "-n", NS, "-o", "json").stdout)
    assert owner["fitting"] >= 1
    assert owner["nodes"][0]["verdict"] == "fits"
    bad = json.loads(ctl(populated, "explain", "bad-tier", "-n", NS, "-o", "json").stdout)
    assert bad["invalid"].startswith("tidelease: ")
    assert contract.ANN_RELIABILITY in bad["invalid"]


def test_both_names_print_the_same_and_kubectl_finds_the_plugin(populated: ApiServer) -> None:
    plugin = ctl(populated, "status")
    assert ctl(populated, "status", tool="tidelease").stdout == plugin.stdout
    env = {
        **os.environ,
        "KUBECONFIG": str(populated.kubeconfig),
        "NO_COLOR": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    via_kubectl = subprocess.run(
        [binary("kubectl"), "tidelease", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert via_kubectl.returncode == 0, via_kubectl.stderr
    assert via_kubectl.stdout == plugin.stdout


def test_what_is_missing_is_one_clear_line(populated: ApiServer) -> None:
    for args, message in (
        (["node", "node-zz"], "no GpuNode node-zz (is its agent running?)"),
        (["lease", "nope", "-n", NS], f"no GpuLease {NS}/nope"),
        (["explain", "nope", "-n", NS], f"pod {NS}/nope not found"),
    ):
        done = ctl(populated, *args)
        assert done.returncode == 1
        assert done.stderr.strip() == f"kubectl tidelease: {message}"


async def _token_of_nobody(api: ApiServer) -> str:
    """A ServiceAccount's token, with no role bound to it."""
    kube = await KubeClient.connect(api.kubeconfig)
    try:
        accounts = f"/api/v1/namespaces/{NS}/serviceaccounts"
        with contextlib.suppress(Conflict):
            await kube.json("POST", accounts, body={"metadata": {"name": "ctl-nobody"}})
        made = await kube.json(
            "POST",
            f"{accounts}/ctl-nobody/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )
        return str(made["status"]["token"])
    finally:
        await kube.close()


def test_a_user_who_may_not_read_gets_one_clear_line(populated: ApiServer, tmp_path: Path) -> None:
    token = asyncio.run(_token_of_nobody(populated))
    kubeconfig = write_kubeconfig(tmp_path / "nobody", populated.server, token, populated.ca)
    done = ctl(populated, "status", "--kubeconfig", str(kubeconfig))
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("kubectl tidelease: not allowed to list GpuNode objects: ")
    assert "forbidden" in line


def test_the_agents_namespace_comes_from_the_chart_not_from_planted_leases(
    apiserver: ApiServer,
) -> None:
    """``kubectl tidelease`` without ``--agent-namespace`` reads the namespace of the agents'
    ServiceAccount from the chart's ClusterRoleBinding (cluster-scoped: a tenant cannot write
    one), so Leases dressed as the agents' in a tenant's namespace, more of them than the real
    ones, do not send an admin's view there. Only a caller who may not read the binding falls
    back to counting Leases."""
    from extender.ctl.reading import AGENT_BINDING, find_agent_namespace

    rbac = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    planted_ns, release_ns = "ctl-planted", "ctl-release"

    async def scenario() -> tuple[str, str]:
        kube = await KubeClient.connect(apiserver.kubeconfig)
        saved: dict[str, Any] | None = None
        try:
            with contextlib.suppress(NotFound):
                saved = await kube.json("GET", f"{rbac}/{AGENT_BINDING}")
                await kube.json("DELETE", f"{rbac}/{AGENT_BINDING}")
            for ns in (planted_ns, release_ns):
                with contextlib.suppress(Conflict):
                    await kube.json("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
            for i in range(5):
                lease = agent_lease(f"planted-{i}", time.time())
                lease["metadata"]["namespace"] = planted_ns
                with contextlib.suppress(Conflict):
                    await kube.json(
                        "POST",
                        f"/apis/coordination.k8s.io/v1/namespaces/{planted_ns}/leases",
                        body=lease,
                    )
            without_binding = await find_agent_namespace(kube)
            await kube.json(
                "POST",
                rbac,
                body={
                    "metadata": {"name": AGENT_BINDING},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": AGENT_BINDING,
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": AGENT_BINDING, "namespace": release_ns}
                    ],
                },
            )
            return without_binding, await find_agent_namespace(kube)
        finally:
            with contextlib.suppress(NotFound):
                await kube.json("DELETE", f"{rbac}/{AGENT_BINDING}")
            if saved is not None:
                restored = {k: saved[k] for k in ("metadata", "roleRef", "subjects") if k in saved}
                restored["metadata"] = {
                    "name": AGENT_BINDING,
                    **{
                        k: v for k, v in saved["metadata"].items() if k in ("labels", "annotations")
                    },
                }
                await kube.json("POST", rbac, body=restored)
            for ns in (planted_ns, release_ns):
                with contextlib.suppress(NotFound):
                    await kube.json("DELETE", f"/api/v1/namespaces/{ns}")
            await kube.close()

    without_binding, with_binding = asyncio.run(scenario())
    assert without_binding == planted_ns  # the fallback counts Leases: the planted ones win
    assert with_binding == release_ns  # the chart's binding wins over any Lease
