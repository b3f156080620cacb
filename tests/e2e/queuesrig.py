"""The shared queues on the local cluster, for the e2e tests and the queue benchmark: the chart's
gate policy bound to one namespace, a `tidelease controllers --queues-controller`, the batch job
that fills a node and the arrivals that take GPUs from it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import builders, contract
from common.model import Priority
from tests.chart import ROOT, render
from tests.e2e.harness import Cluster, NodeGroup, parked_pod, workload
from tests.e2e.kube import wait_for
from tests.ports import free_port

BATCH = "e2e-q-batch"
INTERACTIVE = "e2e-q-interactive"


@contextlib.contextmanager
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
    probe = parked_pod("probe", namespace, 1, extra_annotations={contract.ANN_JOB_CLASS: "batch"})

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


def fill_node(cluster: Cluster, group: NodeGroup, namespace: str) -> None:
    """A kwok node of 8 GPUs in ``group``, full of a batch Deployment's four 2-GPU pods (class
    batch: gated and released by the queues); the PriorityClasses of both queues' pods."""
    cluster.ensure_priority_class(BATCH, 20)
    cluster.ensure_priority_class(INTERACTIVE, 5000, policy="PreemptLowerPriority")
    group.add_node("q", lambda n: builders.devices(n, 8))
    group.wait_ready()
    train = batch_pod(group, namespace, "train", 2)
    cluster.kube.create(workload("Deployment", "train", namespace, train, replicas=4))
    wait_for(
        lambda: len(placed(cluster, namespace, "train-")) == 4,
        what="4 batch pods placed",
        timeout=60,
    )


def arrival(
    cluster: Cluster, group: NodeGroup, namespace: str, name: str, *, queued: bool = True
) -> tuple[float, dict[str, Any]]:
    """An interactive 2-GPU pod into :func:`fill_node`'s full node: through the queues (its
    class declared: gated at creation, released by the controller, then placed, preempting a
    batch pod) or, ``queued=False``, the same pod without a class (kube-scheduler's preemption
    alone). Seconds from its creation to its placement, and the pod as placed; then it is
    deleted and the batch job waited for whole again."""
    extra = {contract.ANN_JOB_CLASS: "interactive"} if queued else {}
    pod = group.pod(
        namespace, name, 2, owner=name, priority=Priority.LOW, priority_class=INTERACTIVE,
        extra_annotations=extra,
    )  # fmt: skip
    start = time.monotonic()
    cluster.kube.create(pod)
    got = wait_placed(cluster, namespace, name)
    took = time.monotonic() - start
    cluster.kube.delete("Pod", name, namespace)
    wait_whole(cluster, namespace, name)
    return took, got[0]
