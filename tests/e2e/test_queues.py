"""Cornucopia's MLFQ as live admission on the local cluster: the chart's MutatingAdmissionPolicy
gates class-declaring GPU pods at creation, a real `tidelease controllers --queues-controller`
releases them in the queues' order, and the real kube-scheduler places what is released through
the extender (its preempt verb taking GPUs from the batch job worth least).

* With the GPUs full of batch pods, each of 20 interactive arrivals is released first and
  placed; the median from creation to placement is what cornucopia promises: under a second.
* A batch job running past the demotion threshold goes to queue 3; stripped of its GPUs and
  waiting past the promotion threshold, it comes back to queue 2: in its pods' annotations and
  Events.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common import builders, contract
from common.keyfile import key_file
from common.model import Priority
from common.queuerelease import release_problem
from tests.chart import ROOT, render
from tests.e2e.harness import Cluster, NodeGroup, workload
from tests.e2e.kube import wait_for
from tests.ports import free_port

pytestmark = pytest.mark.cluster

BATCH = "e2e-q-batch"
INTERACTIVE = "e2e-q-interactive"
ARRIVALS = 20


@pytest.fixture
def gate(cluster: Cluster, namespace: str) -> Iterator[None]:
    """The chart's gate policy, bound to this test's namespace only (other tests' pods that
    declare a class are not gated)."""
    policy = next(
        o for o in render("queues.gatePolicy=true") if o["kind"] == "MutatingAdmissionPolicy"
    )
    name = policy["metadata"]["name"]
    cluster.kube.create(policy)
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1beta1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": f"{name}-{namespace}"},
        "spec": {
            "policyName": name,
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    cluster.kube.create(binding)
    # In force once a probe pod comes out gated (the API server loads policies in the background).
    probe = builders.pod("probe", 1, namespace=namespace, extra_annotations={
        contract.ANN_JOB_CLASS: "batch"})  # fmt: skip
    probe["metadata"].pop("uid")
    probe.pop("status")
    probe["spec"]["nodeSelector"] = {"no-such-node": "x"}

    def gated() -> bool:
        cluster.kube.create(probe)
        obj = cluster.kube.get("Pod", "probe", namespace) or {}
        cluster.kube.delete("Pod", "probe", namespace)
        wait_for(lambda: cluster.kube.get("Pod", "probe", namespace) is None, what="probe gone")
        gates = (obj.get("spec") or {}).get("schedulingGates") or []
        return any(g.get("name") == contract.SCHEDULING_GATE for g in gates)

    wait_for(gated, what="the gate policy in force", timeout=30, interval=1)
    try:
        yield
    finally:
        cluster.kube.delete("MutatingAdmissionPolicyBinding", f"{name}-{namespace}")
        cluster.kube.delete("MutatingAdmissionPolicy", name)


@contextlib.contextmanager
def queues_controller(
    cluster: Cluster, log: Path, settings: dict[str, str], *args: str
) -> Iterator[Path]:
    """`tidelease controllers --queues-controller` (``args`` beside), with the cluster's key of
    the release proofs, which its extender checks (hack/lib/cluster.sh), and the extender
    settings ``settings`` (TIDELEASE_EXTENDER_<NAME>); its log, once ready."""
    port = free_port()
    env = {
        **os.environ,
        "TIDELEASE_EXTENDER_QUEUE_RELEASE_KEY_FILE": str(cluster.dir / "queue-release.key"),
        **{f"TIDELEASE_EXTENDER_{k.upper()}": v for k, v in settings.items()},
    }
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(ROOT / ".venv/bin/tidelease"), "controllers", "--queues-controller", *args,
             "--kubeconfig", str(cluster.as_account("tidelease-controllers")),
             "--probe-host", "127.0.0.1",
             "--probe-port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            assert proc.poll() is None, log.read_text()
            return False

    try:
        wait_for(ready, what="the queues controller ready", timeout=60, interval=0.5)
        yield log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def queues(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """The queues controller with thresholds of seconds; its log."""
    thresholds = {"queue_demote_batch_s": "4", "queue_promote_s": "4", "queue_interval_s": "1"}
    with queues_controller(cluster, tmp_path / "queues.log", thresholds) as log:
        yield log


def batch_pod(group: NodeGroup, namespace: str, owner: str, gpus: int) -> dict[str, Any]:
    return group.pod(
        namespace,
        owner,
        gpus,
        owner=owner,
        priority=Priority.LOW,
        priority_class=BATCH,
        extra_annotations={contract.ANN_JOB_CLASS: "batch"},
    )


def placed(cluster: Cluster, namespace: str, prefix: str) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.kube.list("Pod", namespace)
        if p["metadata"]["name"].startswith(prefix)
        and p["spec"].get("nodeName")
        and not p["metadata"].get("deletionTimestamp")
    ]


def wait_placed(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return wait_for(
        lambda: placed(cluster, namespace, name) or None,
        what=f"{name} placed",
        timeout=30,
        interval=0.02,
    )


def wait_whole(cluster: Cluster, namespace: str, gone: str) -> None:
    """The batch job's evicted replica back (gated, then released into the freed GPUs)."""
    wait_for(
        lambda: (
            len(placed(cluster, namespace, "train-")) == 4 and not placed(cluster, namespace, gone)
        ),
        what="the batch job whole again",
        timeout=60,
    )


def test_interactive_arrivals_are_released_first_and_placed_within_a_second(
    cluster: Cluster, namespace: str, group: NodeGroup, gate: None, queues: Path
) -> None:
    cluster.ensure_priority_class(BATCH, 20)
    cluster.ensure_priority_class(INTERACTIVE, 5000, policy="PreemptLowerPriority")
    group.add_node("q", lambda n: builders.devices(n, 8))
    group.wait_ready()
    train = batch_pod(group, namespace, "train", 2)
    cluster.kube.create(workload("Deployment", "train", namespace, train, replicas=4))
    wait_for(lambda: len(placed(cluster, namespace, "train-")) == 4, what="4 batch pods placed",
             timeout=60)  # fmt: skip

    latencies = []
    for i in range(ARRIVALS):
        name = f"chat-{i}"
        pod = group.pod(
            namespace, name, 2, owner=name, priority=Priority.LOW, priority_class=INTERACTIVE,
            extra_annotations={contract.ANN_JOB_CLASS: "interactive"},
        )  # fmt: skip
        start = time.monotonic()
        cluster.kube.create(pod)
        got = wait_placed(cluster, namespace, name)
        latencies.append(time.monotonic() - start)
        annotations = got[0]["metadata"].get("annotations") or {}
        assert annotations.get(contract.ANN_QUEUE) == "1"  # released by the controller
        # With its proof, for its UID (the extender placed it: it checked the proof too).
        assert release_problem(got[0], key_file(cluster.dir / "queue-release.key").key()) is None
        cluster.kube.delete("Pod", name, namespace)
        wait_whole(cluster, namespace, name)
    median = statistics.median(latencies)
    print(f"interactive creation to placement over {ARRIVALS}: median {median:.3f} s, "
          f"max {max(latencies):.3f} s, all {[round(x, 2) for x in latencies]}")  # fmt: skip
    assert median <= 1.0, latencies


def events_of(cluster: Cluster, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.kube.list("Event", namespace) if e.get("reason") == reason]


def test_a_long_batch_job_is_demoted_and_promoted_back_once_starved(
    cluster: Cluster, namespace: str, group: NodeGroup, gate: None, queues: Path
) -> None:
    cluster.ensure_priority_class(BATCH, 20)
    group.add_node("q", lambda n: builders.devices(n, 8))
    group.wait_ready()
    long = batch_pod(group, namespace, "long", 8)
    cluster.kube.create(workload("Deployment", "long", namespace, long, replicas=1))

    def queue_of(prefix: str) -> str | None:
        pods = placed(cluster, namespace, prefix)
        return pods[0]["metadata"].get("annotations", {}).get(contract.ANN_QUEUE) if pods else None

    # Running past 4 s of executed time in queue 2: demoted.
    wait_for(lambda: queue_of("long-") == "3", what="long demoted to queue 3", timeout=30)
    assert events_of(cluster, namespace, "QueueDemoted")

    # Another batch job waits; long loses its pod. Queue 2 goes first: other is released into
    # the freed GPUs, long's new pod waits at the gate, stripped of every GPU.
    other = batch_pod(group, namespace, "other", 8)
    cluster.kube.create(workload("Deployment", "other", namespace, other, replicas=1))
    (old,) = placed(cluster, namespace, "long-")
    cluster.kube.delete("Pod", old["metadata"]["name"], namespace)
    wait_for(lambda: placed(cluster, namespace, "other-") or None, what="other placed",
             timeout=30)  # fmt: skip

    def promoted() -> list[dict[str, Any]] | None:
        return [
            e for e in events_of(cluster, namespace, "QueuePromoted")
            if f"job {namespace}/long: queue 3 -> 2" in e.get("message", "")  # jobs by namespace
        ] or None  # fmt: skip

    got = wait_for(promoted, what="long promoted back to queue 2", timeout=30)
    assert "starved" in got[0]["message"]
    waiting = [
        p for p in cluster.kube.list("Pod", namespace)
        if p["metadata"]["name"].startswith("long-") and not p["spec"].get("nodeName")
    ]  # fmt: skip
    assert waiting
    assert waiting[0]["metadata"]["annotations"].get(contract.ANN_QUEUE) == "2"


def test_free_gpus_go_to_the_job_that_scales_best_and_an_interactive_arrival_shrinks_it(
    cluster: Cluster, namespace: str, group: NodeGroup, gate: None, queues: Path
) -> None:
    """Two elastic batch Deployments of 1-GPU replicas, 2 each, on 8 GPUs. a scales linearly to
    5 GPUs (its 6th is worth half), b sub-linearly from its 2nd (a third): the 4 free GPUs go to
    a, one replica at a time, up to its maximum of 6. An interactive pod of 1 GPU then shrinks a
    by one replica (its 6th GPU is the one worth least), not b, and is placed."""
    cluster.ensure_priority_class(BATCH, 20)
    cluster.ensure_priority_class(INTERACTIVE, 5000, policy="PreemptLowerPriority")
    group.add_node("q", lambda n: builders.devices(n, 8))
    group.wait_ready()
    for name, profile in (("a", "100,200,300,400,500,550,560"), ("b", "100,130,140,145")):
        pod = batch_pod(group, namespace, name, 1)
        pod["metadata"]["annotations"].update(
            {
                contract.ANN_WORKLOAD: f"Deployment/{name}",
                contract.ANN_MAX_REPLICAS: "6",
                contract.ANN_THROUGHPUT: profile,
            }
        )
        cluster.kube.create(workload("Deployment", name, namespace, pod, replicas=2))

    def replicas(name: str) -> int:
        obj = cluster.kube.get("Deployment", name, namespace) or {}
        return int((obj.get("spec") or {}).get("replicas", 0))

    wait_for(
        lambda: len(placed(cluster, namespace, "a-")) == 6 and replicas("a") == 6,
        what="a grown to its 6 replicas",
        timeout=90,
    )
    assert replicas("b") == 2
    b_pods = {p["metadata"]["name"] for p in placed(cluster, namespace, "b-")}
    assert len(b_pods) == 2

    chat = group.pod(
        namespace, "chat", 1, owner="chat", priority=Priority.LOW, priority_class=INTERACTIVE,
        extra_annotations={contract.ANN_JOB_CLASS: "interactive"},
    )  # fmt: skip
    cluster.kube.create(chat)
    wait_placed(cluster, namespace, "chat")
    assert replicas("a") == 5
    assert replicas("b") == 2
    wait_for(lambda: len(placed(cluster, namespace, "a-")) == 5, what="a at 5 pods", timeout=30)
    assert {p["metadata"]["name"] for p in placed(cluster, namespace, "b-")} == b_pods
