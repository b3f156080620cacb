"""The Kueue admission check's I/O around its pure decision (extender.kueue.controller): pods
counted per owner and namespace, the check's entry as applied (server-side apply of its own
entry, the workload's UID as a precondition, the pods told to take lent GPUs only), an
AdmissionCheck marked Active once, and an unreadable Workload rejected once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from common import contract
from common.keptmarks import NO_MARK, KeptMark, decode
from common.model import Device, DeviceClass, GpuUuid, JobKey, NodeName, Tier
from extender.kueue.controller import (
    CONTROLLER_NAME,
    FIELD_MANAGER,
    KueueCheck,
    KueueMetrics,
    pods_by_owner,
)
from tests.unit.test_kueue_workloads import CHECK, workload

LENT = DeviceClass("H20", Tier.HA, True, JobKey("online/recsys"))
NOW = 1796011500.0


def pod(
    name: str, owner_uid: str, *, namespace: str = "ml", node: str = "", **ann: str
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [{"kind": "Job", "uid": owner_uid, "controller": True}],
            "labels": {"kueue.x-k8s.io/podset": "main"},
            "annotations": dict(ann),
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Running" if node else "Pending"},
    }


def test_pods_are_counted_per_owner_in_their_own_namespace() -> None:
    notice = {contract.ANN_RECLAIM_NOTICE: "2026-11-30T04:05:00.000000Z"}
    got = pods_by_owner(
        [
            pod("a", "j1", node="n1"),
            pod("b", "j1", node="n2", **notice),
            pod("c", "j1"),  # not placed yet
            pod("x", "j1", namespace="other", node="n1"),  # names the UID from elsewhere
        ]
    )
    assert got["ml/j1"].placed == {"main": 2}
    assert got["ml/j1"].notice_at == 1796011500.0
    assert got["other/j1"].placed == {"main": 1}


@dataclass
class FakeKube:
    calls: list[tuple[str, str, dict[str, Any], dict[str, str], str]] = field(default_factory=list)

    async def json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.calls.append(
            (method, path, kw.get("body") or {}, kw.get("query") or {}, kw.get("content_type", ""))
        )
        return {}


def node(name: str, free: dict[DeviceClass, int], kept: KeptMark = NO_MARK) -> Any:
    """A node of the leasing controller's view: its free devices (UUIDs ``<node>-<i>``), no
    pod holding any, and the kept mark its GpuNode carries."""
    devices = [
        Device(NodeName(name), i, GpuUuid(f"{name}-{i}"), cls)
        for i, cls in enumerate(c for c, n in free.items() for _ in range(n))
    ]
    return SimpleNamespace(free=free, devices=devices, allocations={}, kept=kept)


def view(
    free: dict[str, dict[DeviceClass, int]],
    pods: list[dict[str, Any]],
    kept: dict[str, KeptMark] | None = None,
) -> Any:
    synced = asyncio.Event()
    synced.set()
    nodes = {NodeName(n): node(n, f, (kept or {}).get(n, NO_MARK)) for n, f in free.items()}
    return SimpleNamespace(
        active=True,
        synced=synced,
        cluster=SimpleNamespace(nodes=nodes),
        pods=SimpleNamespace(raw_pods=lambda: pods),
    )


def checker(
    kube: FakeKube,
    free: dict[str, dict[DeviceClass, int]],
    kept: dict[str, KeptMark] | None = None,
    clock: Callable[[], float] = lambda: NOW,
) -> KueueCheck:
    check = KueueCheck(
        kube,  # type: ignore[arg-type]
        view(free, [], kept),
        KueueMetrics(CollectorRegistry()),
        clock=clock,
    )
    check.on_check(
        "ADDED",
        {"metadata": {"name": CHECK, "generation": 1}, "spec": {"controllerName": CONTROLLER_NAME}},
    )
    check.on_check("ADDED", {"metadata": {"name": "other"}, "spec": {"controllerName": "x"}})
    return check


async def test_ready_is_applied_as_the_checks_own_entry() -> None:
    kube = FakeKube()
    check = checker(kube, {"n1": {LENT: 4}, "n2": {LENT: 4}})
    check.on_workload("ADDED", workload(("main", 2, 4), name="train"))
    await check.reconcile("all")
    activate, *keeps, write = kube.calls  # the kept marks before the Ready
    assert [k[1] for k in keeps] == [
        "/apis/tidelease.io/v1alpha1/gpunodes/n1", "/apis/tidelease.io/v1alpha1/gpunodes/n2",
    ]  # fmt: skip
    assert activate[1] == f"/apis/kueue.x-k8s.io/v1beta2/admissionchecks/{CHECK}/status"
    assert activate[2]["status"]["conditions"][0]["type"] == "Active"
    method, path, body, query, content_type = write
    assert (method, content_type) == ("PATCH", "application/apply-patch+yaml")
    assert path == "/apis/kueue.x-k8s.io/v1beta2/namespaces/ml/workloads/train/status"
    assert query == {"fieldManager": FIELD_MANAGER, "force": "true"}
    assert body["metadata"]["uid"] == "w-train"
    (entry,) = body["status"]["admissionChecks"]
    assert (entry["name"], entry["state"]) == (CHECK, "Ready")
    assert entry["podSetUpdates"] == [
        {"name": "main", "annotations": {contract.ANN_LENT_ONLY: "true"}}
    ]
    # The check is Active now: marked once.
    check.on_check(
        "MODIFIED",
        {
            "metadata": {"name": CHECK},
            "spec": {"controllerName": CONTROLLER_NAME},
            "status": {"conditions": [{"type": "Active", "status": "True"}]},
        },
    )
    kube.calls.clear()
    ready = workload(("main", 2, 4), name="train", state="Ready")
    check.on_workload("MODIFIED", ready)
    await check.reconcile("all")
    assert kube.calls == []


async def test_a_template_that_says_lent_only_already_gets_no_update_of_it() -> None:
    kube = FakeKube()
    check = checker(kube, {"n1": {LENT: 8}})
    check.on_workload(
        "ADDED",
        workload(("main", 1, 4), name="t", annotations={contract.ANN_LENT_ONLY: "true"}),
    )
    await check.reconcile("all")
    entry = kube.calls[-1][2]["status"]["admissionChecks"][0]
    assert entry["state"] == "Ready"
    assert "podSetUpdates" not in entry


async def test_an_unreadable_workload_is_rejected_once() -> None:
    kube = FakeKube()
    check = checker(kube, {"n1": {LENT: 8}})
    bad = workload(("main", 1, 4), name="bad", annotations={contract.ANN_RELIABILITY: "best"})
    check.on_workload("ADDED", bad)
    await check.reconcile("all")
    writes = [c for c in kube.calls if "/workloads/" in c[1]]
    assert len(writes) == 1
    entry = writes[0][2]["status"]["admissionChecks"][0]
    assert entry["state"] == "Rejected"
    assert "tidelease.io/reliability" in entry["message"]
    await check.reconcile("all")
    assert len([c for c in kube.calls if "/workloads/" in c[1]]) == 1


async def test_a_check_naming_it_but_not_among_its_names_is_marked_not_active() -> None:
    """An AdmissionCheck naming tidelease's controllerName that the admin did not list
    (kueue_checks): not Active, with why, once; its entries of Workloads are never written
    (the chart's policy would refuse them)."""
    kube = FakeKube()
    check = checker(kube, {"n1": {LENT: 8}})
    stray = {"metadata": {"name": "stray"}, "spec": {"controllerName": CONTROLLER_NAME}}
    check.on_check("ADDED", stray)
    check.on_workload("ADDED", workload(("main", 1, 4), name="t", check="stray"))
    await check.reconcile("all")
    paths = {c[1]: c[2] for c in kube.calls}
    marked = paths["/apis/kueue.x-k8s.io/v1beta2/admissionchecks/stray/status"]
    (condition,) = marked["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Active", "False", "NotListed",
    )  # fmt: skip
    assert CHECK in condition["message"]
    assert not any("/workloads/" in p for p in paths)
    kube.calls.clear()
    check.on_check("MODIFIED", {**stray, "status": {"conditions": [condition]}})
    await check.reconcile("all")
    assert not any("stray" in c[1] for c in kube.calls)


def mark_of(call: tuple[str, str, dict[str, Any], dict[str, str], str]) -> KeptMark:
    assert call[4] == "application/merge-patch+json"
    return decode(call[2]["metadata"]["annotations"][contract.ANN_KEPT_FOR_KUEUE])


async def test_the_lent_gpus_kept_for_a_workload_are_marked_renewed_and_unmarked() -> None:
    """Let through: its 8 lent GPUs marked on their GpuNodes for its Job (the owner key its
    pods will carry), until a minute from now; renewed past half of that; once its pods are
    placed (the view's pods), the marks are removed."""
    kube = FakeKube()
    now = [NOW]
    check = checker(kube, {"n1": {LENT: 4}, "n2": {LENT: 6}}, clock=lambda: now[0])
    check.on_workload("ADDED", workload(("main", 2, 4), name="train"))
    await check.reconcile("all")
    marks = {c[1].rsplit("/", 1)[1]: mark_of(c) for c in kube.calls if "/gpunodes/" in c[1]}
    assert {n: sorted(m.devices) for n, m in marks.items()} == {
        "n1": [f"n1-{i}" for i in range(4)], "n2": [f"n2-{i}" for i in range(4)],
    }  # fmt: skip
    assert {o for m in marks.values() for o in m.devices.values()} == {"ml/Job/train"}
    assert {m.until for m in marks.values()} == {NOW + 60}

    # The watch brings the marks back; 40 s on, they are renewed (the same devices).
    nodes = check._view.cluster.nodes  # type: ignore[union-attr]
    for n, m in marks.items():
        nodes[NodeName(n)].kept = m
    check.on_workload("MODIFIED", workload(("main", 2, 4), name="train", state="Ready"))
    kube.calls.clear()
    now[0] = NOW + 10
    await check.reconcile("all")
    assert [c for c in kube.calls if "/gpunodes/" in c[1]] == []
    now[0] = NOW + 40
    await check.reconcile("all")
    renewed = {c[1].rsplit("/", 1)[1]: mark_of(c) for c in kube.calls if "/gpunodes/" in c[1]}
    assert {n: m.devices for n, m in renewed.items()} == {n: m.devices for n, m in marks.items()}
    assert {m.until for m in renewed.values()} == {NOW + 100}

    # Its pods placed: nothing kept any more, the marks removed.
    for n, m in renewed.items():
        nodes[NodeName(n)].kept = m
    check._view.pods = SimpleNamespace(  # type: ignore[union-attr]
        raw_pods=lambda: [pod("a", "job-train", node="n1"), pod("b", "job-train", node="n2")]
    )
    kube.calls.clear()
    now[0] = NOW + 50
    await check.reconcile("all")
    gone = [c for c in kube.calls if "/gpunodes/" in c[1]]
    assert [c[2]["metadata"]["annotations"][contract.ANN_KEPT_FOR_KUEUE] for c in gone] == [
        None, None,
    ]  # fmt: skip


async def test_a_workload_let_through_holds_its_gpus_before_the_watch_shows_it() -> None:
    """Let through on 4 lent GPUs while an older workload of 8 waits; 4 more are lent a moment
    later, before the watch brings back the Ready just written: the older one is still not let
    through (12 GPUs on 8 lent), nor is the Ready taken back; once the watch shows the Ready,
    the same."""
    kube = FakeKube()
    now = [NOW]
    check = checker(kube, {"n1": {LENT: 4}}, clock=lambda: now[0])
    older = ("main", 2, 4)
    check.on_workload("ADDED", workload(older, name="older", created="2026-11-30T04:00:00Z"))
    check.on_workload(
        "ADDED", workload(("main", 1, 4), name="newer", created="2026-11-30T04:01:00Z")
    )

    def states() -> dict[str, str]:
        return {
            c[1].rsplit("/", 2)[1]: c[2]["status"]["admissionChecks"][0]["state"]
            for c in kube.calls
            if "/workloads/" in c[1]
        }

    await check.reconcile("all")
    assert states() == {"older": "Pending", "newer": "Ready"}
    check._view = view({"n1": {LENT: 4}, "n2": {LENT: 4}}, [])
    for when, newer_state in ((NOW + 1, "Pending"), (NOW + 2, "Ready")):
        check.on_workload(
            "MODIFIED",
            workload(
                ("main", 1, 4), name="newer", created="2026-11-30T04:01:00Z", state=newer_state
            ),
        )
        kube.calls.clear()
        now[0] = when
        await check.reconcile("all")
        assert "Ready" not in states().values(), (when, states())
        assert "newer" not in states(), (when, states())
