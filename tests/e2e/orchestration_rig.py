"""The orchestration e2e rig: launches of small framework jobs on kwok nodes with a random pod
start order and random start delays, commands judged by per-framework launcher stand-ins, issued
naively (at a fixed delay after the job is created) and through the orchestrator.

A stand-in "fails exactly when a peer it needs is not up": at the moment a command is issued it
reads the job's pods from the API server (Running, Ready, not being deleted) and what earlier
commands started (a process in a pod, keyed by the pod's uid, kept in the stand-in as the
container would keep it). TensorFlow's start script carries its own readiness checks (weflex
table 1), so its stand-in waits for its peers instead of failing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.kubeclient import KubeClient
from extender.orchestration.depfile import Target
from extender.orchestration.graph import Dag, load
from extender.orchestration.jobreadiness import LABEL_JOB, LABEL_ROLE
from extender.orchestration.jobs import DATA_DEPENDENCIES, DATA_REPLICAS, JOB, LABEL_ORCHESTRATION
from extender.orchestration.podexec import ExecRequest, ExecResult
from tests.e2e.harness import GROUP_LABEL

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ROOT / "manifests" / "orchestration" / "frameworks"

# Small jobs: 3-4 pods each.
SHAPES: dict[str, dict[str, int]] = {
    "mpi": {"launcher": 1, "worker": 3},
    "pytorch": {"coordinator": 1, "worker": 2},
    "ray": {"head": 1, "worker": 2},
    "tensorflow": {"ps": 1, "chief": 1, "worker": 1},
}
# What each command needs up when it is issued: (role, "all" pods of it ready) and the
# commands that must have started in pods of a role.
TF_WAIT_S = 20.0  # how long TensorFlow's own start script waits for its peers


def is_ready(pod: Mapping[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return (
        not meta.get("deletionTimestamp")
        and status.get("phase") == "Running"
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
    )


@dataclass
class StandIn:
    """The launchers of the four frameworks (an Executor), judging against the API server."""

    kube: KubeClient
    namespace: str
    mode: str  # "naive" or "orchestrated": each has its own processes
    started: set[tuple[str, str]] = field(default_factory=set)  # (pod uid, command)
    outcomes: dict[str, list[tuple[str, str, bool, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # job -> (command, pod uid, ok, why)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    framework_of: dict[str, str] = field(default_factory=dict)

    async def pods(self, job: str) -> dict[str, dict[str, Any]]:
        listed = await self.kube.json(
            "GET",
            f"/api/v1/namespaces/{self.namespace}/pods",
            query={"labelSelector": f"{LABEL_JOB}={job}"},
        )
        return {p["metadata"]["name"]: p for p in listed.get("items") or []}

    async def execute(self, request: ExecRequest) -> ExecResult:
        framework = self.framework_of[request.job]
        if framework == "tensorflow":
            ok, why, uid = await self._tensorflow(request)
        else:
            pods = await self.pods(request.job)
            ok, why, uid = self.judge(framework, request, pods)
        if ok:
            self.started.add((uid, request.command))
        self.outcomes[request.job].append((request.command, uid, ok, why))
        self.changed.set()
        return ExecResult(0, "ok") if ok else ExecResult(1, why)

    def judge(
        self, framework: str, request: ExecRequest, pods: Mapping[str, Mapping[str, Any]]
    ) -> tuple[bool, str, str]:
        me = pods.get(request.pod)
        uid = str((me or {}).get("metadata", {}).get("uid", ""))
        if me is None or not is_ready(me):
            return False, f"pod {request.pod} is not up (exec fails)", uid
        shape = SHAPES[framework]

        def role(name: str) -> list[Mapping[str, Any]]:
            return [p for p in pods.values() if p["metadata"]["labels"].get(LABEL_ROLE) == name]

        def all_ready(name: str) -> bool:
            return sum(1 for p in role(name) if is_ready(p)) >= shape[name]

        def started(name: str, command: str, count: int) -> bool:
            return (
                sum(
                    1
                    for p in role(name)
                    if is_ready(p) and (p["metadata"]["uid"], command) in self.started
                )
                >= count
            )

        checks: dict[tuple[str, str], tuple[Callable[[], bool], str]] = {
            ("mpi", "mpirun"): (
                lambda: all_ready("worker"),
                "mpirun: a host in -H is not up",
            ),
            ("pytorch", "worker-join"): (
                lambda: started("coordinator", "rendezvous", 1),
                "torchrun: the rendezvous endpoint is not up",
            ),
            ("ray", "worker-join"): (
                lambda: started("head", "head-start", 1),
                "ray start: no head at --address",
            ),
            ("ray", "submit"): (
                lambda: (
                    started("head", "head-start", 1)
                    and started("worker", "worker-join", shape["worker"])
                ),
                "ray job submit: the cluster is not formed",
            ),
        }
        check = checks.get((framework, request.command))
        if check is not None and not check[0]():
            return False, check[1], uid
        return True, "", uid

    async def _tensorflow(self, request: ExecRequest) -> tuple[bool, str, str]:
        """The start script waits for its own pod and its peers (TF_CONFIG), then runs."""
        needs = {"start-ps": [], "start-worker": ["ps"], "start-chief": ["ps", "worker"]}
        deadline = time.monotonic() + TF_WAIT_S
        while True:
            pods = await self.pods(request.job)
            me = pods.get(request.pod)
            peers_up = all(
                sum(
                    1
                    for p in pods.values()
                    if p["metadata"]["labels"].get(LABEL_ROLE) == r and is_ready(p)
                )
                >= SHAPES["tensorflow"][r]
                for r in needs[request.command]
            )
            if me is not None and is_ready(me) and peers_up:
                return True, "", str(me["metadata"]["uid"])
            if time.monotonic() > deadline:
                return False, "start script: peers not up in time", ""
            await asyncio.sleep(0.1)


def dag_of(framework: str) -> Dag:
    return load((FRAMEWORKS / f"{framework}.yaml").read_text())


def expected_issues(framework: str) -> int:
    """Successful issues a complete launch makes (each-commands once per pod)."""
    shape = SHAPES[framework]
    return sum(shape[c.role] if c.target is Target.EACH else 1 for c in dag_of(framework).order)


@dataclass
class Launch:
    framework: str
    job: str
    naive_failed: bool = False
    naive_reason: str = ""
    orchestrated_failed: bool = False
    orchestrated_reason: str = ""
    seconds: float = 0.0


@dataclass
class Rig:
    kube: KubeClient
    namespace: str
    nodes: list[str]
    group: str
    naive: StandIn
    orchestrated: StandIn
    spread_s: float = 1.0  # pods start at random times within this window
    naive_delay_s: float = 0.3  # the naive platform issues this long after creating the job
    rng: random.Random = field(default_factory=lambda: random.Random(20250))

    def config_map(self, framework: str, job: str) -> dict[str, Any]:
        shape = SHAPES[framework]
        workerish = {r: n for r, n in shape.items() if dag_of(framework).roles[r] is None}
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": job,
                "namespace": self.namespace,
                "labels": {LABEL_ORCHESTRATION: JOB},
            },
            "data": {
                DATA_DEPENDENCIES: (FRAMEWORKS / f"{framework}.yaml").read_text(),
                DATA_REPLICAS: yaml.safe_dump(workerish),
            },
        }

    def pod(self, job: str, role: str, index: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job}-{role}-{index}",
                "namespace": self.namespace,
                "labels": {LABEL_JOB: job, LABEL_ROLE: role},
            },
            "spec": {
                "nodeName": self.rng.choice(self.nodes),
                "tolerations": [{"key": GROUP_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "containers": [{"name": "main", "image": f"{role}:stand-in"}],
            },
        }

    async def naive_issue(self, framework: str, job: str) -> tuple[bool, str]:
        """Every command in the file's order, each into the pods the platform created for it
        (it knows their names), without waiting for anything."""
        for command in dag_of(framework).order:
            count = SHAPES[framework][command.role] if command.target is Target.EACH else 1
            for i in range(count):
                result = await self.naive.execute(
                    ExecRequest(
                        self.namespace,
                        f"{job}-{command.role}-{i}",
                        command.run,
                        30.0,
                        job=job,
                        command=command.name,
                    )
                )
                if not result.ok:
                    return False, f"{command.name}: {result.output}"
        return True, ""

    async def launch(self, framework: str, job: str, timeout_s: float = 60.0) -> Launch:
        started = time.monotonic()
        self.naive.framework_of[job] = framework
        self.orchestrated.framework_of[job] = framework
        ns = self.namespace
        await self.kube.json(
            "POST", f"/api/v1/namespaces/{ns}/configmaps", body=self.config_map(framework, job)
        )
        pods = [self.pod(job, role, i) for role, n in SHAPES[framework].items() for i in range(n)]
        self.rng.shuffle(pods)
        offsets = sorted(self.rng.uniform(0, self.spread_s) for _ in pods)

        async def create_all() -> None:
            t0 = time.monotonic()
            for pod, at in zip(pods, offsets, strict=True):
                await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
                await self.kube.json("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)

        async def naive() -> tuple[bool, str]:
            await asyncio.sleep(self.naive_delay_s)
            return await self.naive_issue(framework, job)

        creating = asyncio.create_task(create_all())
        naive_ok, naive_why = await naive()
        await creating
        want = expected_issues(framework)
        deadline = time.monotonic() + timeout_s
        while sum(1 for o in self.orchestrated.outcomes[job] if o[2]) < want:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{framework} launch {job} incomplete after {timeout_s:.0f} s: "
                    f"{self.orchestrated.outcomes[job]}"
                )
            await asyncio.sleep(0.1)
        failures = [o for o in self.orchestrated.outcomes[job] if not o[2]]
        result = Launch(
            framework,
            job,
            naive_failed=not naive_ok,
            naive_reason=naive_why,
            orchestrated_failed=bool(failures),
            orchestrated_reason="; ".join(f"{o[0]}: {o[3]}" for o in failures),
            seconds=time.monotonic() - started,
        )
        await self.kube.json(
            "DELETE",
            f"/api/v1/namespaces/{ns}/pods",
            query={"labelSelector": f"{LABEL_JOB}={job}", "gracePeriodSeconds": 0},
        )
        await self.kube.json("DELETE", f"/api/v1/namespaces/{ns}/configmaps/{job}")
        return result


def table(launches: list[Launch]) -> str:
    """Weflex table 1's form."""
    commands = {
        "mpi": ("MPI", "mpirun"),
        "pytorch": ("PyTorch Distributed", "torchrun"),
        "ray": ("Ray", "ray start"),
        "tensorflow": ("TensorFlow Distributed", "start script"),
    }
    lines = [
        f"{'framework':<24}{'command':<14}{'launches':>9}{'failures naive':>16}"
        f"{'failures orchestrated':>23}"
    ]
    for fw, (name, command) in commands.items():
        mine = [launch for launch in launches if launch.framework == fw]
        if not mine:
            continue
        n = len(mine)
        naive = sum(launch.naive_failed for launch in mine)
        orch = sum(launch.orchestrated_failed for launch in mine)
        lines.append(
            f"{name:<24}{command:<14}{n:>9}{f'{naive} ({100 * naive / n:.0f}%)':>16}"
            f"{f'{orch} ({100 * orch / n:.0f}%)':>23}"
        )
    return "\n".join(lines)
