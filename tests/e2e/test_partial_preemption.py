"""Cornucopia's scaling-aware partial preemption through kube-scheduler and the preempt verb.

An interactive pod (``tidelease.io/job-class: interactive``) that does not fit preempts one pod
of the batch job that loses least by it: ``big``, which holds six GPUs and goes on with four,
not ``small``'s only pod, which kube-scheduler's own choice (lowest priority first) would evict
and which would halt that job.
"""

from __future__ import annotations

import pytest

from common import builders, contract
from common.model import Priority
from tests.e2e.harness import Cluster, NodeGroup
from tests.e2e.kube import wait_for

pytestmark = pytest.mark.cluster

LOWEST = "e2e-lowest"
BATCH = "e2e-batch"
INTERACTIVE = "e2e-interactive"
BATCH_CLASS = {contract.ANN_JOB_CLASS: "batch"}


def test_an_interactive_pod_takes_one_gpu_pair_from_the_job_that_loses_least(
    cluster: Cluster, namespace: str, group: NodeGroup
) -> None:
    cluster.ensure_priority_class(LOWEST, 10)
    cluster.ensure_priority_class(BATCH, 20)
    cluster.ensure_priority_class(INTERACTIVE, 5000, policy="PreemptLowerPriority")
    group.add_node("x", lambda n: builders.devices(n, 8))
    group.wait_ready()
    uids = {}
    group.create_pod(
        namespace,
        "small-0",
        2,
        owner="small",
        priority=Priority.LOW,
        priority_class=LOWEST,
        extra_annotations=BATCH_CLASS,
    )
    cluster.release(namespace, "small-0")  # as the queues controller would (its order aside)
    uids["small-0"] = cluster.wait_bound(namespace, "small-0")["metadata"]["uid"]
    for i in range(3):
        name = f"big-{i}"
        group.create_pod(
            namespace,
            name,
            2,
            owner="big",
            priority=Priority.LOW,
            priority_class=BATCH,
            extra_annotations=BATCH_CLASS,
        )
        cluster.release(namespace, name)
        uids[name] = cluster.wait_bound(namespace, name)["metadata"]["uid"]

    group.create_pod(
        namespace,
        "chat",
        2,
        owner="chat",
        priority=Priority.LOW,
        priority_class=INTERACTIVE,
        extra_annotations={contract.ANN_JOB_CLASS: "interactive"},
    )
    cluster.release(namespace, "chat")
    cluster.wait_bound(namespace, "chat", timeout=40)

    def alive(name: str) -> bool:
        pod = cluster.kube.get("Pod", name, namespace)
        return (
            pod is not None
            and pod["metadata"]["uid"] == uids[name]
            and not pod["metadata"].get("deletionTimestamp")
        )

    # No window to wait out: chat is bound, and kube-scheduler deletes (or marks deleting) all
    # its victims in the preemption cycle, before the cycle that binds the preemptor; what has
    # not been deleted by now never is for chat.
    gone = wait_for(
        lambda: [n for n in uids if not alive(n)] or None,
        what="a victim to be evicted",
        timeout=20,
    )
    assert len(gone) == 1, gone
    assert gone[0].startswith("big-"), gone
    assert alive("small-0")
