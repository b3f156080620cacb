"""Borrower gangs on the local cluster (issue 36, docs/gangs.md), with kube-scheduler's gang
scheduling on (the Workload API, alpha in 1.35: the e2e cluster's API server and
kube-scheduler run with its feature gates, as the chart's ``scheduling.gangScheduling`` asks).

* A gang of 3 pods x 4 GPUs, with 8 lent GPUs free (and standby ones it may not use), stays
  Pending whole: no member bound. With 12 lent it is placed whole, each member on lent
  devices of its own. When the owner takes 4 of them back, all three members get the notice
  and are evicted, wherever they run.
* A 2-pod gang and a lone pod on one node, a high-priority pod needing four of its GPUs: the
  lone pod goes, the gang stays, though kube-scheduler alone would evict a gang member (the
  lone pod has the higher pod priority).
* A gang member kube-scheduler preempts on one node takes its mate on another with it (the
  gang controller), and nothing else.
* The gang borrower of manifests/examples is what the API server takes (a dry run).

The controllers run in the chart's default mode (the extender mode's leasing).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import builders, contract
from common.gangs import WORKLOAD_API, gang_of
from common.model import Priority
from tests.e2e.harness import BORROWER, ONLINE, Cluster, NodeGroup, devices_of
from tests.e2e.kube import path_of, wait_for
from tests.e2e.leasingjob import Job, lent_devices

pytestmark = pytest.mark.cluster

GPUS = 4
# A class above tidelease-borrower and below the online one: kube-scheduler alone would keep
# a pod of it and evict a borrower beside it.
MIDDLE = "e2e-gang-middle"
EXAMPLE = Path(__file__).resolve().parents[2] / "manifests/examples/gang-borrower.yaml"


@pytest.fixture(scope="module", autouse=True)
def default_mode(cluster: Cluster) -> Iterator[None]:
    with cluster.controllers_mode(dra=False):
        yield


def workload(namespace: str, name: str, members: int) -> dict[str, Any]:
    """A Workload whose pod group ``workers`` is a gang of ``members``."""
    return {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": members}}}]},
    }


def member(group: NodeGroup, namespace: str, gang: str, i: int, **kwargs: Any) -> dict[str, Any]:
    pod = group.pod(
        namespace,
        f"{gang}-{i}",
        GPUS,
        priority=Priority.LOW,
        priority_class=kwargs.pop("priority_class", BORROWER),
        **kwargs,
    )
    pod["spec"]["workloadRef"] = {"name": gang, "podGroup": "workers"}
    return pod


def pods(cluster: Cluster, namespace: str, prefix: str) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in cluster.kube.list("Pod", namespace)
        if p["metadata"]["name"].startswith(prefix)
    }


def bound(cluster: Cluster, namespace: str, prefix: str) -> dict[str, list[str]]:
    return {
        n: devices_of(p)
        for n, p in pods(cluster, namespace, prefix).items()
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    }


def test_a_gang_waits_whole_is_placed_whole_and_leaves_whole(
    cluster: Cluster, group: NodeGroup, namespace: str
) -> None:
    cluster.ensure_priority_class(BORROWER, 10)
    group.add_node("n1", lambda name: builders.devices(name, 8))
    group.add_node("n2", lambda name: builders.devices(name, 8))
    group.add_node("s1", lambda name: builders.devices(name, 8, standby=True))
    group.wait_ready()
    job = Job(cluster, group, namespace, replicas=4)
    job.replicas_placed(4)
    lent = job.lend_groups(keep=2)
    assert sum(len(d) for d in lent.values()) == 8
    kube = cluster.kube
    kube.create(workload(namespace, "sweep", 3))
    for i in range(3):
        kube.create(member(group, namespace, "sweep", i))
    # 8 lent GPUs for 12 wanted (the standby node's 8 are not a borrower's): nobody is bound,
    # for as long as we look (the gang's members wait at kube-scheduler's Permit, whole).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert bound(cluster, namespace, "sweep-") == {}, job.describe()
        time.sleep(0.5)
    # 12 lent: placed whole, each member on lent devices, none shared.
    lent = job.lend_groups(keep=1)
    lent_uuids = {u for d in lent.values() for u in d}
    assert len(lent_uuids) == 12
    placed = wait_for(
        lambda: (lambda b: b if len(b) == 3 else None)(bound(cluster, namespace, "sweep-")),
        what="the gang placed whole",
        timeout=120,
        describe=job.describe,
    )
    held = [u for d in placed.values() for u in d]
    assert len(held) == len(set(held)) == 12, placed
    assert set(held) == lent_uuids, placed
    uids = {n: p["metadata"]["uid"] for n, p in pods(cluster, namespace, "sweep-").items()}
    # The owner takes one replica's 4 back: one member holds them; all three get the notice
    # and go.
    noticed: set[str] = set()

    def all_gone() -> bool:
        now = pods(cluster, namespace, "sweep-")
        for name, p in now.items():
            if contract.ANN_RECLAIM_NOTICE in (p["metadata"].get("annotations") or {}):
                noticed.add(name)
        return all(n not in now or now[n]["metadata"]["uid"] != uids[n] for n in uids)

    job.set_desired(2 * GPUS)
    wait_for(all_gone, what="every member of the gang evicted", timeout=90, interval=0.1)
    assert noticed == set(uids), f"noticed {sorted(noticed)} of {sorted(uids)}"
    status = job.wait_steady("the reclaim done", lambda s: s.get("reclaims") == 1)
    assert len(lent_devices({"status": status})) == 8


def test_preemption_breaks_no_gang_where_a_lone_pod_will_do(
    cluster: Cluster, group: NodeGroup, namespace: str
) -> None:
    cluster.ensure_priority_class(BORROWER, 10)
    cluster.ensure_priority_class(MIDDLE, 20)
    n1 = group.add_node("n1", lambda name: builders.devices(name, 8))
    n2 = group.add_node("n2", lambda name: builders.devices(name, 4))
    group.wait_ready()
    kube = cluster.kube
    # The lone pod first, on n1; then the pair, one on n1 beside it and one on n2.
    kube.create(
        group.pod(namespace, "lone", GPUS, priority=Priority.LOW, priority_class=MIDDLE, node=n1)
    )
    cluster.wait_bound(namespace, "lone")
    kube.create(workload(namespace, "pair", 2))
    kube.create(member(group, namespace, "pair", 0, node=n1))
    kube.create(member(group, namespace, "pair", 1, node=n2))
    wait_for(
        lambda: len(bound(cluster, namespace, "pair-")) == 2, what="the pair placed", timeout=60
    )
    before = {n: p["metadata"]["uid"] for n, p in pods(cluster, namespace, "").items()}
    kube.create(
        group.pod(namespace, "online", GPUS, priority=Priority.HIGH, priority_class=ONLINE, node=n1)
    )
    cluster.wait_bound(namespace, "online", timeout=60)
    now = {n: p["metadata"]["uid"] for n, p in pods(cluster, namespace, "").items()}
    assert now.get("lone") != before["lone"]  # the lone pod went
    for name in ("pair-0", "pair-1"):  # the gang stayed, whole
        assert now.get(name) == before[name], f"{name} was evicted"


def test_a_gang_member_preempted_takes_its_mates_elsewhere_with_it(
    cluster: Cluster, group: NodeGroup, namespace: str
) -> None:
    """A 2-pod gang, one member on n1 (four GPUs, nothing else there), one on n2; a
    high-priority pod pinned to n1 makes kube-scheduler preempt the member there, the only
    victim that frees them (it deletes the victims of that node only). The gang controller then
    evicts the member on n2, with a Warning Event naming the one that went. A lone pod on n2
    beside it stays."""
    cluster.ensure_priority_class(BORROWER, 10)
    n1 = group.add_node("n1", lambda name: builders.devices(name, 4))
    n2 = group.add_node("n2", lambda name: builders.devices(name, 8))
    group.wait_ready()
    kube = cluster.kube
    kube.create(workload(namespace, "pair", 2))
    kube.create(member(group, namespace, "pair", 0, node=n1))
    kube.create(member(group, namespace, "pair", 1, node=n2))
    kube.create(
        group.pod(namespace, "lone", GPUS, priority=Priority.LOW, priority_class=BORROWER, node=n2)
    )
    wait_for(
        lambda: len(bound(cluster, namespace, "pair-")) == 2, what="the pair placed", timeout=60
    )
    cluster.wait_bound(namespace, "lone")
    before = {n: p["metadata"]["uid"] for n, p in pods(cluster, namespace, "").items()}
    kube.create(
        group.pod(namespace, "online", GPUS, priority=Priority.HIGH, priority_class=ONLINE, node=n1)
    )
    cluster.wait_bound(namespace, "online", timeout=60)

    def mates_gone() -> bool | None:
        return not bound(cluster, namespace, "pair-") or None

    wait_for(mates_gone, what="the member on n2 evicted with the one preempted", timeout=60)
    assert pods(cluster, namespace, "lone")["lone"]["metadata"]["uid"] == before["lone"]
    events = [
        e
        for e in kube.list("Event", namespace)
        if e.get("reason") == "GangMemberEvicted"
        and e["involvedObject"]["name"] == "pair-1"
        and e["involvedObject"]["uid"] == before["pair-1"]
    ]
    assert events, "no GangMemberEvicted event on pair-1"
    assert "pair-0 was disrupted (PreemptionByScheduler)" in events[0]["message"]


def test_the_gang_borrower_example_is_what_the_api_server_takes(
    cluster: Cluster, namespace: str
) -> None:
    """manifests/examples/gang-borrower.yaml, created with a server-side dry run: the Workload
    API's own validation, and the Job's pods in the gang tidelease reads from them."""
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    assert [d["kind"] for d in docs] == ["Workload", "Job"]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        created = cluster.kube.request(
            "POST", path_of(doc["kind"], namespace=namespace) + "?dryRun=All", doc
        )
        assert created["metadata"]["name"] == "sweep"
    template = {**docs[1]["spec"]["template"], "metadata": {"namespace": namespace}}
    assert gang_of(template) == f"{namespace}/workload/sweep/workers"
    minimum = docs[0]["spec"]["podGroups"][0]["policy"]["gang"]["minCount"]
    assert minimum == docs[1]["spec"]["parallelism"]
