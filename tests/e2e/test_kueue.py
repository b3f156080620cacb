"""Kueue admitting into lent GPUs (issue 37, docs/kueue.md), with the real Kueue controller
manager (built from its pinned module, hack/kueue-up.sh: its CRDs, its webhooks served with
their certificates) and the real kube-scheduler calling the extender, and tidelease's
controllers running the admission check (``--kueue-admission-check``).

* A Job of 2 pods x 4 GPUs through a LocalQueue of the example's ClusterQueue is not admitted
  while 4 GPUs are lent (its Workload's check says why, the Job stays suspended, no pod), is
  admitted and runs on lent UUIDs once 8 are, and on reclaim is evicted (both pods, after their
  notice) and requeued by Kueue (its Workload counts the eviction by the admission check, shows
  Kueue's Requeued condition and Event EvictedDueToAdmissionCheck; the Job is suspended again,
  not failed); it is admitted again on the next lend.
* A burst of 10 Jobs of mixed sizes: at every step, the GPUs of the Workloads Kueue has
  admitted never exceed the GPUs lent; Jobs deleted one by one let the others in, until all
  ten have been admitted.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import builders, contract
from common.keptmarks import decode
from common.model import Priority
from common.timefmt import epoch
from tests.background import running
from tests.e2e.harness import BORROWER, Cluster, NodeGroup, devices_of, workload
from tests.e2e.kube import ApiError, path_of, wait_for
from tests.e2e.leasingjob import Job, lent_devices

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests/examples/kueue-lent-gpus.yaml"
QUEUE = "borrowed"
CHECK = "tidelease-lent-gpus"
KWOK_RUNS_FOREVER = "tidelease.test/kwok-runs-forever"  # hack/lib/cluster.sh
START_TIMEOUT_S = 900  # the first run builds the kueue binary (minutes on two cores)


def example(kind: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    return next(d for d in docs if d["kind"] == kind)


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Kueue on the session's cluster, and the controllers with the admission check, for the
    module; the example's AdmissionCheck, ResourceFlavor and ClusterQueue made once."""
    base = tmp_path_factory.mktemp("kueue")
    env = {**os.environ, "TL_KUEUE_PARENT_PID": str(os.getpid())}
    with running(
        [str(ROOT / "hack" / "kueue-up.sh"), str(cluster.kubeconfig), str(base)],
        state=base / "kueue.env",
        log=base / "kueue-up.log",
        what="hack/kueue-up.sh",
        start_timeout_s=START_TIMEOUT_S,
        stop_timeout_s=60,
        env=env,
    ):
        kube = cluster.kube
        for kind in ("AdmissionCheck", "ResourceFlavor", "ClusterQueue"):
            obj = example(kind)
            if kube.get(kind, obj["metadata"]["name"]) is None:
                kube.create(obj)
        procs = cluster.processes
        spec = procs.specs["controllers"]
        procs.stop("controllers")
        procs.start(
            "controllers", dataclasses.replace(spec, argv=(*spec.argv, "--kueue-admission-check"))
        )
        try:
            cluster.wait_controllers_leading()
            wait_for(
                lambda: active(cluster),
                what="the AdmissionCheck Active and the ClusterQueue active",
                timeout=60,
            )
            yield base
        finally:
            procs.stop("controllers")
            procs.start("controllers", spec)
            cluster.wait_controllers_leading()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards and waited for until it is gone (the
    conftest's does not wait): a Job of Kueue's still in it, requeued when its lease's node
    group goes, would otherwise be admitted on the next test's lent GPUs, which any borrower
    of the shared ClusterQueue may take."""
    name = cluster.namespace("e2e")
    yield name
    cluster.kube.delete("Namespace", name)
    wait_for(
        lambda: cluster.kube.get("Namespace", name) is None,
        what=f"namespace {name} gone",
        timeout=180,
        interval=1,
    )


def active(cluster: Cluster) -> bool:
    kube = cluster.kube
    check = kube.get("AdmissionCheck", CHECK) or {}
    queue = kube.get("ClusterQueue", "borrowed-gpus") or {}
    return condition(check, "Active") == "True" and condition(queue, "Active") == "True"


def condition(obj: dict[str, Any], kind: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return ""


def local_queue(cluster: Cluster, namespace: str) -> None:
    queue = example("LocalQueue")
    queue["metadata"]["namespace"] = namespace
    cluster.kube.create(queue)


def borrower_job(
    group: NodeGroup, namespace: str, name: str, pods: int, gpus: int
) -> dict[str, Any]:
    """A Job of ``pods`` pods x ``gpus`` GPUs through the LocalQueue, kept to the group's
    nodes; kwok runs its pods until they are deleted (its default stages complete a Job's pods
    the moment they run: hack/lib/cluster.sh, TL_CLUSTER_KWOK_RUNS_FOREVER)."""
    pod = group.pod(namespace, name, gpus, priority=Priority.LOW, priority_class=BORROWER)
    pod["metadata"]["annotations"][KWOK_RUNS_FOREVER] = "true"
    pod["spec"]["restartPolicy"] = "Never"
    job = workload("Job", name, namespace, pod, parallelism=pods, completions=pods)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": QUEUE}
    return job


def workload_of(cluster: Cluster, namespace: str, job: str) -> dict[str, Any] | None:
    for w in cluster.kube.list("KueueWorkload", namespace):
        refs = w["metadata"].get("ownerReferences") or []
        if any(r.get("kind") == "Job" and r.get("name") == job for r in refs):
            return w
    return None


def check_state(w: dict[str, Any]) -> tuple[str, str]:
    for c in (w.get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == CHECK:
            return str(c.get("state")), str(c.get("message") or "")
    return "", ""


def story(cluster: Cluster, namespace: str, job: str) -> str:
    """The Job's and its Workload's status and the namespace's last Events (a failure's tale)."""
    kube = cluster.kube
    j = kube.get("Job", job, namespace) or {}
    w = workload_of(cluster, namespace, job) or {}
    events = sorted(
        kube.list("Event", namespace),
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
    )[-25:]
    lines = [
        f"job suspend={j.get('spec', {}).get('suspend')} status={j.get('status')}",
        f"workload status={w.get('status')}",
        *(
            f"event {e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: "
            f"{e.get('reason')}: {e.get('message')}"
            for e in events
        ),
    ]
    return "\n".join(lines)


def job_pods(cluster: Cluster, namespace: str, job: str) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.kube.list("Pod", namespace, selector=f"job-name={job}")
        if not p["metadata"].get("deletionTimestamp")
        and p["status"].get("phase") not in ("Succeeded", "Failed")
    ]


def wait_placed(
    cluster: Cluster, namespace: str, job: str, count: int, what: str, timeout: float = 90
) -> list[dict[str, Any]]:
    """Until ``count`` pods of the Job hold devices; those pods."""

    def placed() -> list[dict[str, Any]] | None:
        pods = [p for p in job_pods(cluster, namespace, job) if devices_of(p)]
        return pods if len(pods) == count else None

    found: list[dict[str, Any]] = wait_for(
        placed, what=what, timeout=timeout, describe=lambda: story(cluster, namespace, job)
    )
    return found


def online_job(cluster: Cluster, group: NodeGroup, namespace: str) -> Job:
    """An online job of 4 x 4 GPUs filling two 8-GPU nodes of the group (nothing lent yet, no
    free GPU beside it), and the LocalQueue of the namespace."""
    cluster.ensure_priority_class(BORROWER, 10)
    group.add_node("n1", lambda name: builders.devices(name, 8))
    group.add_node("n2", lambda name: builders.devices(name, 8))
    group.wait_ready()
    online = Job(cluster, group, namespace, replicas=4)
    online.replicas_placed(4)
    local_queue(cluster, namespace)
    return online


def test_a_job_waits_for_lent_gpus_runs_on_them_and_is_requeued_at_reclaim(
    cluster: Cluster, group: NodeGroup, namespace: str, kueue: Path
) -> None:
    online = online_job(cluster, group, namespace)
    kube = cluster.kube

    # 4 lent: Kueue reserves quota, tidelease's check holds it back.
    online.lend_groups(keep=3)
    kube.create(borrower_job(group, namespace, "finetune", 2, 4))
    w = wait_for(
        lambda: (
            lambda w: (
                w if w and check_state(w)[0] == "Pending" and "lent" in check_state(w)[1] else None
            )
        )(workload_of(cluster, namespace, "finetune")),
        what="the Workload waiting on tidelease's check",
        timeout=60,
    )
    assert condition(w, "QuotaReserved") == "True", w["status"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        w = workload_of(cluster, namespace, "finetune") or {}
        assert condition(w, "Admitted") != "True", w.get("status")
        job = kube.get("Job", "finetune", namespace) or {}
        assert job["spec"].get("suspend") is True, job["spec"]
        assert job_pods(cluster, namespace, "finetune") == []
        time.sleep(0.5)

    # 8 lent: admitted, both pods on lent devices, none shared.
    lent = online.lend_groups(keep=2)
    lent_uuids = {u for d in lent.values() for u in d}
    assert len(lent_uuids) == 8

    pods = wait_placed(cluster, namespace, "finetune", 2, "the Job admitted and both pods placed")
    w = workload_of(cluster, namespace, "finetune") or {}
    assert condition(w, "Admitted") == "True", w.get("status")
    held = [u for p in pods for u in devices_of(p)]
    assert len(held) == len(set(held)) == 8, held
    assert set(held) == lent_uuids, (held, lent_uuids)
    assert all(p["metadata"]["annotations"].get(contract.ANN_LENT_ONLY) == "true" for p in pods), (
        "the check's podSetUpdates reach the pods"
    )
    uids = {p["metadata"]["uid"] for p in pods}

    # The owner takes all 8 back: both pods get the notice; Kueue evicts and requeues.
    notices: dict[str, float] = {}
    gone_at: dict[str, float] = {}

    def evicted() -> bool:
        now = time.time()
        for p in cluster.kube.list("Pod", namespace, selector="job-name=finetune"):
            uid = p["metadata"]["uid"]
            notice = (p["metadata"].get("annotations") or {}).get(contract.ANN_RECLAIM_NOTICE)
            if uid in uids and notice:
                notices[uid] = epoch(notice) or 0.0
        live = {p["metadata"]["uid"] for p in job_pods(cluster, namespace, "finetune")}
        for uid in uids - live:
            gone_at.setdefault(uid, now)
        return set(gone_at) == uids

    online.set_desired(16)
    wait_for(
        evicted,
        what="both pods evicted",
        timeout=90,
        interval=0.05,
        describe=lambda: f"gone {gone_at}\n" + story(cluster, namespace, "finetune"),
    )
    assert set(notices) == uids, f"both pods noticed: {notices}"
    for uid in uids:
        assert gone_at[uid] >= notices[uid] - 1.0, (uid, gone_at[uid], notices[uid])

    def requeued() -> dict[str, Any] | None:
        # Kueue's eviction by the admission check and its requeue: counted in the Workload's
        # schedulingStats (reason AdmissionCheck), the check's Retry counted, the Workload back
        # in its queue (Requeued) with the check reset to Pending, not admitted. (Kueue
        # requeues in a fraction of a second: by then its Evicted condition reads False,
        # "Previously: At least one admission check is false".)
        w = workload_of(cluster, namespace, "finetune") or {"status": {}}
        status = w["status"]
        evictions = {
            e.get("reason"): e.get("count")
            for e in (status.get("schedulingStats") or {}).get("evictions") or []
        }
        entry = next((c for c in status.get("admissionChecks") or [] if c.get("name") == CHECK), {})
        if (
            evictions.get("AdmissionCheck") == 1
            and entry.get("retryCount") == 1
            and entry.get("state") == "Pending"
            and condition(w, "Requeued") == "True"
            and condition(w, "Admitted") != "True"
        ):
            return w
        return None

    w = wait_for(
        requeued,
        what="the Workload evicted and requeued by Kueue",
        timeout=60,
        describe=lambda: story(cluster, namespace, "finetune"),
    )
    evicted_events = [
        e
        for e in kube.list("Event", namespace)
        if e.get("reason") == "EvictedDueToAdmissionCheck"
        and e["involvedObject"].get("name") == w["metadata"]["name"]
    ]
    assert evicted_events, story(cluster, namespace, "finetune")
    job = kube.get("Job", "finetune", namespace) or {}
    assert job["spec"].get("suspend") is True, job["spec"]
    assert not any(
        c.get("type") == "Failed" and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    ), job.get("status")
    online.wait_steady("the reclaim done", lambda s: s.get("reclaims") == 1)

    # The next lend: admitted again, on the newly lent devices.
    lent = online.lend_groups(keep=2)
    again = wait_placed(
        cluster, namespace, "finetune", 2, "the Job admitted again and placed", timeout=120
    )
    held = [u for p in again for u in devices_of(p)]
    assert set(held) == {u for d in lent.values() for u in d}, held


SIZES = [(1, 1), (1, 2), (2, 2), (1, 4), (2, 4), (1, 8), (3, 1), (2, 1), (1, 3), (2, 3)]
STALL_S = 10.0


def test_kueue_never_admits_more_borrowed_gpus_than_are_lent(
    cluster: Cluster, group: NodeGroup, namespace: str, kueue: Path
) -> None:
    online = online_job(cluster, group, namespace)
    lent = online.lend_groups(keep=1)
    lent_count = sum(len(d) for d in lent.values())
    assert lent_count == 12
    kube = cluster.kube
    names = [f"burst-{i}" for i in range(len(SIZES))]
    gpus = {n: p * g for n, (p, g) in zip(names, SIZES, strict=True)}
    for n, (p, g) in zip(names, SIZES, strict=True):
        kube.create(borrower_job(group, namespace, n, p, g))
    ever: set[str] = set()
    deleted: set[str] = set()
    steps = 0
    seen: set[str] = set()
    placed: set[str] = set()
    since = time.monotonic()
    deadline = time.monotonic() + 300
    while len(ever) < len(names):
        assert time.monotonic() < deadline, (
            f"admitted {sorted(ever)} of {names}; now admitted {sorted(seen)}, placed "
            f"{sorted(placed)}, deleted {sorted(deleted)}"
        )
        admitted = {
            job
            for w in kube.list("KueueWorkload", namespace)
            if condition(w, "Admitted") == "True"
            for job in [next((r["name"] for r in w["metadata"]["ownerReferences"]), "")]
            if job in gpus and job not in deleted
        }
        held = sum(gpus[j] for j in admitted)
        assert held <= lent_count, f"admitted {sorted(admitted)}: {held} GPUs, {lent_count} lent"
        lent_now = len(lent_devices(online.lease()))
        assert held <= lent_now, f"{held} GPUs admitted, {lent_now} lent"
        ever |= admitted
        steps += 1
        # Once the admitted ones are placed, the oldest finishes (its Job deleted): room for
        # the next. Kueue admits by count, not by shape: lent devices that smaller pods split
        # may leave an admitted Job of 4-GPU pods unplaced until another finishes, so after
        # STALL_S with some unplaced, the oldest placed one finishes all the same.
        placed = {
            j
            for j in admitted
            if len([p for p in job_pods(cluster, namespace, j) if devices_of(p)])
            == SIZES[names.index(j)][0]
        }
        if admitted != seen:
            seen, since = admitted, time.monotonic()
        if placed and (placed == admitted or time.monotonic() - since > STALL_S):
            done = min(placed, key=names.index)
            since = time.monotonic()
            kube.request(
                "DELETE",
                f"/apis/batch/v1/namespaces/{namespace}/jobs/{done}",
                {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            )
            deleted.add(done)
        time.sleep(0.2)
    # All ten admitted, never more GPUs at once than lent: every Job but those admitted last
    # (at most the lent GPUs) was admitted, placed and deleted first, one at a time.
    gone = sum(gpus[j] for j in deleted)
    assert gone >= sum(gpus.values()) - lent_count, (sorted(deleted), steps)


CONTROLLERS = "system:serviceaccount:tidelease-system:tidelease-controllers"  # hack/lib/cluster.sh
MERGE = "application/merge-patch+json"
POLICY = ROOT / "manifests/charts/tidelease/templates/controllers-policy.yaml"


def refused(call: Callable[[], object], words: str) -> str:
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.status in (403, 422), e.value
    assert words in e.value.message, e.value.message
    return e.value.message


def test_the_controllers_token_writes_only_its_own_checks(
    cluster: Cluster, group: NodeGroup, namespace: str, kueue: Path
) -> None:
    """The chart's tidelease-controllers-kueue policy, with the controllers' own identity (the
    grants hack/lib/cluster.sh applies, as the chart renders them): of a Workload's status only
    the entry of its own check; of AdmissionChecks only those naming its controllerName. What it
    writes as the check (the tests above) passes the same policy."""
    kube = cluster.kube
    me = kube.as_user(CONTROLLERS)
    kube.create({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
        "metadata": {"name": "someone-elses"}, "spec": {"controllerName": "example.com/other"},
    })  # fmt: skip
    try:
        path = path_of("AdmissionCheck", "someone-elses") + "/status"
        active = {"status": {"conditions": [{
            "type": "Active", "status": "True", "reason": "Active", "message": "forged",
            "lastTransitionTime": "2026-11-30T00:00:00Z",
        }]}}  # fmt: skip
        refused(
            lambda: me.request("PATCH", path, active, content_type=MERGE),
            "mark only the AdmissionChecks of controllerName tidelease.io/lent-gpus",
        )
    finally:
        kube.delete("AdmissionCheck", "someone-elses")

    # A Workload of a Job waiting in the queue (nothing lent: Pending on the check).
    local_queue(cluster, namespace)
    job = borrower_job(group, namespace, "forger", 1, 4)
    kube.create(job)
    w = wait_for(
        lambda: (lambda w: w if w and check_state(w)[0] == "Pending" else None)(
            workload_of(cluster, namespace, "forger")
        ),
        what="the Workload waiting on tidelease's check",
        timeout=60,
    )
    path = path_of("KueueWorkload", w["metadata"]["name"], namespace) + "/status"
    entry = {"state": "Ready", "message": "forged", "lastTransitionTime": "2026-11-30T00:00:00Z"}
    for patch, words in (
        # another check's entry: Ready, as if that check had passed
        ({"status": {"admissionChecks": [{"name": "someone-elses", **entry}]}},
         "write only the admission checks tidelease-lent-gpus"),
        # quota held, as if Kueue had admitted it; a condition of Kueue's
        ({"status": {"requeueState": {"count": 7}}}, "only in its admission checks"),
        ({"status": {"conditions": [{
            "type": "Admitted", "status": "True", "reason": "Admitted", "message": "forged",
            "lastTransitionTime": "2026-11-30T00:00:00Z",
        }]}}, "only in its admission checks"),
    ):  # fmt: skip
        refused(lambda p=patch: me.request("PATCH", path, p, content_type=MERGE), words)  # type: ignore[misc]
    stored = workload_of(cluster, namespace, "forger") or {}
    assert condition(stored, "Admitted") != "True", stored["status"]
    assert [c["name"] for c in stored["status"]["admissionChecks"]] == [CHECK]
    kube.delete("Job", "forger", namespace)


def test_the_policy_names_every_field_of_kueues_workload_status(
    cluster: Cluster, kueue: Path
) -> None:
    """The policy keeps every field of a Workload's status but admissionChecks as it was, by
    name: the names are those of the pinned Kueue's CRD (a Kueue upgrade that adds a field fails
    here until the policy names it)."""
    crd = cluster.kube.request(
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workloads.kueue.x-k8s.io",
    )
    (v1beta2,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    fields = set(v1beta2["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"])
    text = POLICY.read_text()
    policy = text[text.index("name: tidelease-controllers-kueue") :]
    named = set(re.findall(r"object\.status\.\?(\w+) == oldObject\.status\.\?\1", policy))
    assert named == fields - {"admissionChecks"}, sorted(named ^ (fields - {"admissionChecks"}))


def test_lent_gpus_kept_for_an_admitted_job_go_to_no_other_borrower(
    cluster: Cluster, group: NodeGroup, namespace: str, kueue: Path
) -> None:
    """Between Kueue's admission and the placement of the Job's pods (held here by a
    scheduling gate of the tenant's own), the 8 lent GPUs counted for it are marked on their
    GpuNodes for its Job; a borrower of another tenant that does not go through Kueue is kept
    off them with the filter's reason; once the gate is lifted the Job's pods take exactly those
    GPUs and the marks are removed."""
    online = online_job(cluster, group, namespace)
    kube = cluster.kube
    lent = online.lend_groups(keep=2)
    lent_uuids = {u for d in lent.values() for u in d}
    assert len(lent_uuids) == 8
    job = borrower_job(group, namespace, "held", 2, 4)
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "tidelease.test/hold"}]
    kube.create(job)

    def marks() -> dict[str, str]:
        out: dict[str, str] = {}
        for node in group.nodes:
            obj = kube.get("GpuNode", node) or {}
            value = (obj["metadata"].get("annotations") or {}).get(contract.ANN_KEPT_FOR_KUEUE)
            out.update(decode(value).devices)
        return out

    def gated() -> list[dict[str, Any]] | None:
        pods = job_pods(cluster, namespace, "held")
        return pods if len(pods) == 2 and marks() else None

    pods = wait_for(
        gated,
        what="the Job admitted, its pods gated, the lent GPUs marked",
        timeout=90,
        describe=lambda: story(cluster, namespace, "held"),
    )
    assert all(not p["spec"].get("nodeName") for p in pods)
    kept = marks()
    assert set(kept) == lent_uuids, (kept, lent_uuids)
    assert set(kept.values()) == {f"{namespace}/Job/held"}

    # Another tenant's borrower, not through Kueue: kept off the kept GPUs (none else is free).
    other = cluster.namespace("kept-other", online=False)
    sneak = group.pod(other, "sneak", 4, priority=Priority.LOW, priority_class=BORROWER)
    kube.create(sneak)

    def refused() -> str | None:
        for e in kube.list("Event", other):
            if e.get("reason") == "FailedScheduling" and "kept for a Kueue workload" in str(
                e.get("message")
            ):
                return str(e["message"])
        return None

    wait_for(refused, what="the borrower refused the kept GPUs", timeout=60)
    assert not (kube.get("Pod", "sneak", other) or {})["spec"].get("nodeName")

    # The gate lifted: the Job's pods on exactly the kept GPUs; the marks gone.
    for p in pods:
        kube.patch("Pod", p["metadata"]["name"], {"spec": {"schedulingGates": None}}, namespace)

    pods = wait_placed(cluster, namespace, "held", 2, "the Job's pods placed")
    held = [u for p in pods for u in devices_of(p)]
    assert sorted(held) == sorted(lent_uuids), held
    wait_for(lambda: not marks(), what="the kept marks removed", timeout=30)
    sneaked = kube.get("Pod", "sneak", other) or {}
    assert not sneaked["spec"].get("nodeName"), "no lent GPU was left for it"
    kube.delete("Pod", "sneak", other)
    kube.delete("Namespace", other)
