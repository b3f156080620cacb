"""Cornucopia's MLFQ as live admission on the local cluster: the chart's MutatingAdmissionPolicy
gates class-declaring GPU pods at creation, a real `tidelease controllers --queues-controller`
releases them in the queues' order, and the real kube-scheduler places what is released through
the extender (its preempt verb taking GPUs from the batch job worth least).

* With the GPUs full of batch pods, each of 20 interactive arrivals is released first and
  placed (how fast: benchmarks/bench_queues.py, against the same pods without the queues).
* A batch job running past the demotion threshold goes to queue 3; stripped of its GPUs and
  waiting past the promotion threshold, it comes back to queue 2: in its pods' annotations and
  Events.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common import builders, contract
from common.keyfile import key_file
from common.model import Priority
from common.queuerelease import release_problem
from tests.e2e import queuesrig
from tests.e2e.harness import Cluster, NodeGroup, workload
from tests.e2e.kube import wait_for
from tests.e2e.queuesrig import (
    BATCH,
    INTERACTIVE,
    batch_pod,
    placed,
    wait_placed,
)

pytestmark = pytest.mark.cluster

ARRIVALS = 20


@pytest.fixture
def gate(cluster: Cluster, namespace: str) -> Iterator[None]:
    with queuesrig.gate(cluster, namespace):
        yield


@pytest.fixture
def queues(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """The queues controller with thresholds of seconds; its log."""
    thresholds = {"queue_demote_batch_s": "4", "queue_promote_s": "4", "queue_interval_s": "1"}
    with queuesrig.queues_controller(cluster, tmp_path / "queues.log", thresholds) as log:
        yield log


def test_interactive_arrivals_are_released_first_and_placed(
    cluster: Cluster, namespace: str, group: NodeGroup, gate: None, queues: Path
) -> None:
    """Each arrival, with the GPUs full of batch pods, is released by the queues controller
    (its queue annotation and a release proof for its UID, which the extender checked too) and
    placed, taking a batch pod's GPUs. How long that takes is benchmarks/bench_queues.py's
    figure (against the same pod without the queues), not this test's."""
    queuesrig.fill_node(cluster, group, namespace)
    key = key_file(cluster.dir / "queue-release.key").key()
    for i in range(ARRIVALS):
        _, got = queuesrig.arrival(cluster, group, namespace, f"chat-{i}")
        annotations = got["metadata"].get("annotations") or {}
        assert annotations.get(contract.ANN_QUEUE) == "1"  # released by the controller
        assert release_problem(got, key) is None  # with its proof, for its UID


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

    # Running past 4 s of executed time in queue 2: demoted. (The waits are generous: they end
    # as soon as the state is reached; a loaded two-core machine once needed more than 30 s.)
    wait_for(lambda: queue_of("long-") == "3", what="long demoted to queue 3", timeout=90)
    assert events_of(cluster, namespace, "QueueDemoted")

    # Another batch job waits; long loses its pod. Queue 2 goes first: other is released into
    # the freed GPUs, long's new pod waits at the gate, stripped of every GPU.
    other = batch_pod(group, namespace, "other", 8)
    cluster.kube.create(workload("Deployment", "other", namespace, other, replicas=1))
    (old,) = placed(cluster, namespace, "long-")
    cluster.kube.delete("Pod", old["metadata"]["name"], namespace)
    wait_for(lambda: placed(cluster, namespace, "other-") or None, what="other placed",
             timeout=90)  # fmt: skip

    def promoted() -> list[dict[str, Any]] | None:
        return [
            e for e in events_of(cluster, namespace, "QueuePromoted")
            if f"job {namespace}/long: queue 3 -> 2" in e.get("message", "")  # jobs by namespace
        ] or None  # fmt: skip

    got = wait_for(promoted, what="long promoted back to queue 2", timeout=90)
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
