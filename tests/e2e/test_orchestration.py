"""Topology-aware orchestration on the local cluster (weflex 3.4, table 1).

- 100 launches per framework (MPI, PyTorch, Ray, TensorFlow) of small jobs whose pods start in a
  random order at random times on kwok nodes; each launch's commands are issued naively (at a
  fixed delay after the job is created) and through the orchestrator, and judged by launcher
  stand-ins against the API server at the moment of issue. The orchestrator is restarted twice
  mid-run; no command may run twice.
- A few MPI-style launches on the real node, through ``tidelease orchestrator`` and pods/exec:
  the launcher really reaches every worker over HTTP, and the job's discover_hosts ConfigMap
  lists the ready workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from common.kubeclient import KubeClient
from extender.orchestration.controller import (
    Orchestrator,
    OrchestratorSettings,
    run_orchestrator,
)
from extender.orchestration.jobreadiness import LABEL_JOB, LABEL_ROLE
from extender.orchestration.jobs import (
    DATA_DEPENDENCIES,
    DATA_REPLICAS,
    DISCOVERY_HOSTS,
    JOB,
    LABEL_ORCHESTRATION,
)
from extender.orchestration.podexec import ExecRequest, KubeExec
from extender.orchestration.records import ANN_RECORDS, Record, State, parse_records
from extender.orchestration.storing import KubeJobStore
from tests.e2e.harness import Cluster, NodeGroup, RealNode
from tests.e2e.kube import wait_for
from tests.e2e.orchestration_rig import SHAPES, Launch, Rig, StandIn, table

pytestmark = [pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
LAUNCHES = int(os.environ.get("TIDELEASE_E2E_ORCHESTRATION_LAUNCHES", "100"))
PARALLEL = 48
KWOK_NODES = 4


async def test_table_1_naive_vs_orchestrated_launches(
    cluster: Cluster, namespace: str, group: NodeGroup
) -> None:
    for i in range(KWOK_NODES):
        group.add_node(f"o{i}", lambda name: [])
    group.wait_ready()
    kube = await KubeClient.connect(cluster.kubeconfig)
    rig = Rig(
        kube=kube,
        namespace=namespace,
        nodes=list(group.nodes),
        group=group.id,
        naive=StandIn(kube, namespace, "naive"),
        orchestrated=StandIn(kube, namespace, "orchestrated"),
    )
    terms = 0

    async def start() -> tuple[asyncio.Task[None], asyncio.Event]:
        nonlocal terms
        terms += 1
        ready = asyncio.Event()
        orchestrator = Orchestrator(
            store=KubeJobStore(kube),
            executor=rig.orchestrated,
            settings=OrchestratorSettings(namespace=namespace, identity=f"e2e-term-{terms}"),
        )
        task = asyncio.create_task(
            run_orchestrator(kube=kube, orchestrator=orchestrator, ready=ready)
        )
        await asyncio.wait_for(ready.wait(), 30)
        return task, ready

    task, _ = await start()
    jobs = [(fw, f"{fw[:3]}-{i}") for i in range(LAUNCHES) for fw in SHAPES]
    random.Random(4).shuffle(jobs)
    slots = asyncio.Semaphore(PARALLEL)
    done: list[Launch] = []
    progressed = asyncio.Event()

    async def one(framework: str, job: str) -> None:
        async with slots:
            done.append(await rig.launch(framework, job))
            progressed.set()

    async def restarts() -> None:
        """Stop the orchestrator (as on SIGTERM or a lost lease) at 1/3 and 2/3 of the run and
        start a fresh one: it knows only what the API server tells it."""
        nonlocal task
        for fraction in (1 / 3, 2 / 3):
            while len(done) < fraction * len(jobs):
                progressed.clear()
                await progressed.wait()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            task, _ = await start()

    started = time.monotonic()
    try:
        restarter = asyncio.create_task(restarts())
        await asyncio.gather(*(one(fw, job) for fw, job in jobs))
        await restarter
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()
    elapsed = time.monotonic() - started

    report = table(done)
    print(f"\n{report}\n{len(done)} launches in {elapsed:.1f} s, orchestrator terms: {terms}")
    by = {fw: [launch for launch in done if launch.framework == fw] for fw in SHAPES}
    for fw, launches in by.items():
        assert len(launches) == LAUNCHES
        failed = [f"{x.job}: {x.orchestrated_reason}" for x in launches if x.orchestrated_failed]
        assert not failed, f"{fw}: orchestrated launches failed:\n" + "\n".join(failed[:10])
    for fw in ("mpi", "pytorch", "ray"):
        naive = sum(x.naive_failed for x in by[fw])
        assert naive > LAUNCHES // 2, f"{fw}: only {naive} naive failures\n{report}"
    assert not any(x.naive_failed for x in by["tensorflow"]), report
    # Exactly once across three orchestrator terms: no command succeeded twice in one pod.
    repeats = {
        (job, key): n
        for job, outcomes in rig.orchestrated.outcomes.items()
        for key, n in Counter((c, uid) for c, uid, ok, _ in outcomes if ok).items()
        if n > 1
    }
    assert not repeats, repeats
    assert terms == 3


REAL_DEPENDENCIES = """\
apiVersion: tidelease.io/v1alpha1
kind: Dependencies
framework: mpi
roles:
  launcher: {replicas: 1}
  worker: {}
discovery: {role: worker}
commands:
  - name: mpirun
    role: launcher
    # Stands in for mpirun: reach every host it is given, else fail as mpirun would.
    run:
      - sh
      - -c
      - >-
        IFS=,; for h in $1; do { echo "GET /version HTTP/1.0"; echo; }
        | nc -w 2 "${h%%:*}" 8080 | grep -q v1
        || { echo "host $h is not up"; exit 3; }; done; echo "$1" >/www/$2; echo launched
      - mpirun
      - "{{hosts:worker}}"
      - orchestrated
    when:
      - {role: worker, ready: all}
    timeoutSeconds: 30
    retry: {attempts: 3, initialSeconds: 1, maxSeconds: 4}
"""
REAL_LAUNCHES = 3
REAL_WORKERS = 2


def real_pod(
    real_node: RealNode, namespace: str, job: str, role: str, index: int, delay_s: int
) -> dict[str, Any]:
    pod = real_node.pod(namespace, f"{job}-{role}-{index}")
    pod["metadata"]["labels"] = {LABEL_JOB: job, LABEL_ROLE: role}
    container = pod["spec"]["containers"][0]
    # The worker comes up late: its server starts after delay_s, its readiness probe sees it.
    container["command"] = [
        "/bin/sh",
        "-c",
        f"trap 'exit 0' TERM; sleep {delay_s}; mkdir -p /www; echo v1 >/www/version; "
        "httpd -f -p 8080 -h /www & wait",
    ]
    container["readinessProbe"] = {
        "httpGet": {"path": "/version", "port": 8080},
        "periodSeconds": 1,
    }
    return pod


async def test_commands_run_for_real_through_exec_on_the_real_node(
    cluster: Cluster, real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    log = tmp_path / "orchestrator.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            str(ROOT / ".venv" / "bin" / "tidelease"),
            "orchestrator",
            "--kubeconfig",
            str(cluster.as_account("tidelease-orchestrator")),
            "--namespace",
            namespace,
            "--lease-namespace",
            "tidelease-system",
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    kube = await KubeClient.connect(cluster.kubeconfig)
    exe = await KubeExec.connect(cluster.kubeconfig)
    rng = random.Random(9)
    naive: dict[str, str] = {}
    try:
        jobs = [f"real-{i}" for i in range(REAL_LAUNCHES)]
        for job in jobs:
            await kube.json(
                "POST",
                f"/api/v1/namespaces/{namespace}/configmaps",
                body={
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": job, "labels": {LABEL_ORCHESTRATION: JOB}},
                    "data": {
                        DATA_DEPENDENCIES: REAL_DEPENDENCIES,
                        DATA_REPLICAS: f"worker: {REAL_WORKERS}\n",
                    },
                },
            )
            pods = [real_pod(real_node, namespace, job, "launcher", 0, 0)] + [
                real_pod(real_node, namespace, job, "worker", i, rng.randint(2, 5))
                for i in range(REAL_WORKERS)
            ]
            rng.shuffle(pods)
            for pod in pods:
                await kube.json("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)

        # The naive platform: as soon as the launcher runs, the same command, through the
        # same exec path, with the workers that have an address by then.
        async def naive_issue(job: str) -> None:
            launcher = f"{job}-launcher-0"
            while True:
                pod = await kube.json("GET", f"/api/v1/namespaces/{namespace}/pods/{launcher}")
                statuses = (pod.get("status") or {}).get("containerStatuses") or []
                if statuses and "running" in (statuses[0].get("state") or {}):
                    break
                await asyncio.sleep(0.2)
            listed = await kube.json(
                "GET",
                f"/api/v1/namespaces/{namespace}/pods",
                query={"labelSelector": f"{LABEL_JOB}={job},{LABEL_ROLE}=worker"},
            )
            ips = [(p.get("status") or {}).get("podIP") for p in listed["items"]]
            hosts = ",".join(f"{ip}:1" for ip in ips if ip)
            if len([ip for ip in ips if ip]) < REAL_WORKERS:
                naive[job] = f"only {hosts!r} have addresses"
                return
            script = REAL_DEPENDENCIES.split(">-\n", 1)[1].split("\n      - mpirun")[0]
            result = await exe.execute(
                ExecRequest(
                    namespace,
                    launcher,
                    ("sh", "-c", " ".join(script.split()), "mpirun", hosts, "naive"),
                    30.0,
                )
            )
            naive[job] = "ok" if result.ok else f"exit {result.exit_code}: {result.output}"

        await asyncio.gather(*(naive_issue(job) for job in jobs))

        for job in jobs:

            def launched(job: str = job) -> Record | None:
                cm = cluster.kube.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{job}")
                ann = cm["metadata"].get("annotations") or {}
                r = parse_records(ann.get(ANN_RECORDS)).get("mpirun")
                return r if r is not None and r.state is State.DONE else None

            record = wait_for(
                launched,
                what=f"{job}: mpirun done through the orchestrator",
                timeout=90,
                describe=lambda: log.read_text()[-3000:],
            )
            assert record.attempts == 1, record  # issued once, when every worker was up
            workers = [
                cluster.pod(namespace, f"{job}-worker-{i}")["status"]["podIP"]
                for i in range(REAL_WORKERS)
            ]
            hosts = sorted(f"{ip}:1" for ip in workers)
            # The command really ran in the launcher, with every worker reachable.
            written = cluster.exec(namespace, f"{job}-launcher-0", "cat", "/www/orchestrated")
            assert sorted(written.strip().split(",")) == hosts
            # discover_hosts lists the ready workers, one host:slots line each.
            cm = cluster.kube.request(
                "GET", f"/api/v1/namespaces/{namespace}/configmaps/{job}-discover-hosts"
            )
            assert sorted(cm["data"][DISCOVERY_HOSTS].split()) == hosts
            assert cm["data"]["discover_hosts.sh"].startswith("#!/bin/sh")
        print("\nreal node, naive launches: " + json.dumps(naive))
        print(f"real node, orchestrated launches: {len(jobs)} of {len(jobs)} done on attempt 1")
        assert all(v != "ok" for v in naive.values()), naive
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        await exe.close()
        await kube.close()
        sys.stdout.write(f"\norchestrator log tail:\n{log.read_text()[-1500:]}\n")
