"""The orchestrator on fakes: issues at the right moment, exactly once, across restarts, with
retries and backoff; keeps discover_hosts current; rejects bad jobs loudly."""

from __future__ import annotations

import json
import random
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from common.reconcile import Requeue
from extender.orchestration.controller import Orchestrator, OrchestratorSettings
from extender.orchestration.jobs import job_ref
from extender.orchestration.podexec import OUTPUT_TAIL, ExecRequest, ExecResult, KubeExec
from extender.orchestration.records import Record, State
from extender.orchestration.testing import FakeExecutor, FakeJobStore, job, pod

ROOT = Path(__file__).resolve().parents[2]
MPI = (ROOT / "manifests" / "orchestration" / "frameworks" / "mpi.yaml").read_text()
RAY = (ROOT / "manifests" / "orchestration" / "frameworks" / "ray.yaml").read_text()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    def __init__(self, store: FakeJobStore | None = None, **executor: Any) -> None:
        self.store = store or FakeJobStore()
        self.executor = FakeExecutor(**executor)
        self.clock = Clock()
        self.orch = self.fresh()

    def fresh(self) -> Orchestrator:
        """A new controller incarnation on the same API server."""
        return Orchestrator(
            store=self.store,
            executor=self.executor,
            settings=OrchestratorSettings(identity=f"c{random.random()}"),
            clock=self.clock,
            rand=lambda: 1.0,
        )

    def add_job(self, raw: dict[str, Any]) -> None:
        self.store.add(job_ref(raw))
        self.orch.on_job("ADDED", raw)

    def job_object(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The job as the API server now shows it (with the records written so far)."""
        ref = job_ref(raw)
        data = raw["data"]
        return job(
            ref.name,
            data["dependencies.yaml"],
            None,
            uid=ref.uid,
            records=self.store.records[ref.key],
            resource_version=str(self.store.versions[ref.key]),
        ) | {"data": data}

    async def settle(self) -> None:
        for _ in range(20):
            await self.orch.step()
            await self.orch.drain()
            if not self.orch.loop.depth:
                return


def mpi_job(workers: int = 3) -> dict[str, Any]:
    return job("train", MPI, {"worker": workers})


async def test_mpirun_is_issued_once_after_every_worker_is_ready() -> None:
    rig = Rig()
    raw = mpi_job()
    rig.add_job(raw)
    pods = [pod("train-launcher", "launcher", job="train")] + [
        pod(f"train-worker-{i}", "worker", job="train", ip=f"10.0.0.{i + 1}") for i in range(3)
    ]
    random.Random(7).shuffle(pods)
    for p in pods:
        p["status"]["conditions"][0]["status"] = "False"
        rig.orch.on_pod("ADDED", p)
        await rig.settle()
    for p in pods:
        assert rig.executor.calls == []
        p["status"]["conditions"][0]["status"] = "True"
        rig.orch.on_pod("MODIFIED", p)
        await rig.settle()
    (call,) = rig.executor.calls
    assert (call.pod, call.command, call.namespace) == ("train-launcher", "mpirun", "ns")
    assert "10.0.0.1:1,10.0.0.2:1,10.0.0.3:1" in call.argv
    assert rig.store.records["ns/train"]["mpirun"].state is State.DONE
    # More changes, a resync: never again.
    rig.orch.on_pod("MODIFIED", pods[0])
    rig.clock.now += 3600
    await rig.settle()
    assert len(rig.executor.calls) == 1


async def test_a_restarted_controller_repeats_nothing() -> None:
    rig = Rig()
    raw = job("r", RAY, {"worker": 2})
    rig.add_job(raw)
    pods = [pod("r-head", "head", job="r")] + [pod(f"r-w-{i}", "worker", job="r") for i in (0, 1)]
    for p in pods:
        rig.orch.on_pod("ADDED", p)
    await rig.settle()
    assert sorted(rig.executor.issued()) == [
        ("head-start", "r-head"),
        ("submit", "r-head"),
        ("worker-join", "r-w-0"),
        ("worker-join", "r-w-1"),
    ]
    for _ in range(3):
        await rig.orch.close()
        rig.orch = rig.fresh()
        rig.orch.on_job("ADDED", rig.job_object(raw))
        for p in pods:
            rig.orch.on_pod("ADDED", p)
        await rig.settle()
    assert len(rig.executor.calls) == 4
    # A third worker joins later: only it is issued its command.
    rig.orch.on_pod("ADDED", pod("r-w-2", "worker", job="r"))
    await rig.settle()
    assert rig.executor.issued()[4:] == [("worker-join", "r-w-2")]


async def test_the_claim_rechecks_the_api_servers_records() -> None:
    """A stale view (the watch lagging) proposes a re-issue; the claim reads DONE and stops."""
    rig = Rig()
    raw = mpi_job(1)
    rig.add_job(raw)
    rig.orch.on_pod("ADDED", pod("l", "launcher", job="train"))
    rig.orch.on_pod("ADDED", pod("w-0", "worker", job="train"))
    await rig.settle()
    assert len(rig.executor.calls) == 1
    rig.orch.jobs["ns/train"].records = {}  # as if an old watch event had arrived last
    rig.orch.loop.add("ns/train")
    await rig.settle()
    assert len(rig.executor.calls) == 1


async def test_failures_are_retried_with_backoff_then_given_up() -> None:
    def fail(req: ExecRequest) -> ExecResult:
        return ExecResult(1, "connection refused")

    rig = Rig(script=fail)
    rig.add_job(mpi_job(1))
    rig.orch.on_pod("ADDED", pod("l", "launcher", job="train"))
    rig.orch.on_pod("ADDED", pod("w-0", "worker", job="train"))
    await rig.settle()
    assert len(rig.executor.calls) == 1
    record = rig.store.records["ns/train"]["mpirun"]
    assert record.state is State.FAILED
    assert "connection refused" in record.error
    # mpi.yaml: attempts 3, initialSeconds 5, maxSeconds 60; rand 1.0 gives the ceiling.
    assert record.retry_at - record.at == 5.0
    rig.clock.now += 4.9
    await rig.settle()
    assert len(rig.executor.calls) == 1
    rig.clock.now += 0.1
    await rig.settle()
    assert len(rig.executor.calls) == 2
    assert rig.store.records["ns/train"]["mpirun"].retry_at - rig.clock.now == 10.0
    rig.clock.now += 10
    await rig.settle()
    assert len(rig.executor.calls) == 3
    assert rig.store.records["ns/train"]["mpirun"].state is State.GAVE_UP
    assert [e[1] for e in rig.store.events] == ["CommandGaveUp"]
    rig.clock.now += 1000
    await rig.settle()
    assert len(rig.executor.calls) == 3


async def test_lost_races_and_outages_still_issue_exactly_once() -> None:
    store = FakeJobStore(conflicts=3)
    rig = Rig(store)
    rig.add_job(mpi_job(1))
    store.unavailable = 2  # the discover_hosts write, then the claim
    rig.orch.on_pod("ADDED", pod("l", "launcher", job="train"))
    rig.orch.on_pod("ADDED", pod("w-0", "worker", job="train"))
    await rig.settle()
    assert rig.executor.calls == []  # the claim failed: retried a second later
    rig.clock.now += 1.0
    await rig.settle()
    assert len(rig.executor.calls) == 1
    assert store.records["ns/train"]["mpirun"].state is State.DONE


async def test_an_attempt_left_running_by_a_dead_controller_is_retried_after_its_timeout() -> None:
    rig = Rig()
    raw = mpi_job(1)
    rig.store.add(job_ref(raw))
    left = Record(State.RUNNING, 1, "l", "uid-l", rig.clock.now, holder="dead")
    rig.store.records["ns/train"] = {"mpirun": left}
    rig.orch.on_job("ADDED", rig.job_object(raw))
    rig.orch.on_pod("ADDED", pod("l", "launcher", job="train"))
    rig.orch.on_pod("ADDED", pod("w-0", "worker", job="train"))
    await rig.settle()
    assert rig.executor.calls == []
    rig.clock.now += 86400  # mpi.yaml's timeoutSeconds
    await rig.settle()
    assert [c.attempt for c in rig.executor.calls] == [2]


async def test_discover_hosts_follows_ready_workers() -> None:
    rig = Rig()
    rig.add_job(mpi_job(2))
    workers = [pod(f"w-{i}", "worker", job="train", ip=f"10.1.0.{i}", gpus=8) for i in range(3)]
    for w in workers[:2]:
        rig.orch.on_pod("ADDED", w)
    await rig.settle()
    assert rig.store.hosts["ns/train"] == "10.1.0.0:8\n10.1.0.1:8\n"
    rig.orch.on_pod("ADDED", workers[2])
    await rig.settle()
    assert rig.store.hosts["ns/train"].splitlines() == ["10.1.0.0:8", "10.1.0.1:8", "10.1.0.2:8"]
    rig.orch.on_pod("DELETED", workers[0])
    workers[1]["status"]["conditions"][0]["status"] = "False"
    rig.orch.on_pod("MODIFIED", workers[1])
    await rig.settle()
    assert rig.store.hosts["ns/train"] == "10.1.0.2:8\n"
    assert "10.1.0.2:8\n" in rig.store.scripts["ns/train"]


async def test_a_bad_job_is_reported_and_nothing_is_issued() -> None:
    rig = Rig()
    bad = job("bad", MPI.replace("role: launcher\n", "role: chief\n"), {"worker": 1})
    rig.add_job(bad)
    rig.orch.on_job("MODIFIED", bad)  # the same version: reported once
    rig.orch.on_pod("ADDED", pod("l", "launcher", job="bad"))
    await rig.settle()
    assert rig.executor.calls == []
    ((key, reason, message),) = rig.store.events
    assert (key, reason) == ("ns/bad", "InvalidDependencies")
    assert message.startswith('dependencies.yaml: commands[0].role: unknown role "chief"')


async def test_commands_wait_while_in_flight_and_jobs_run_in_parallel() -> None:
    import asyncio

    gate = asyncio.Event()
    rig = Rig(gate=gate)
    for name in ("a", "b"):
        rig.add_job(job(name, MPI, {"worker": 1}))
        rig.orch.on_pod("ADDED", pod(f"{name}-l", "launcher", job=name))
        rig.orch.on_pod("ADDED", pod(f"{name}-w", "worker", job=name))
    for _ in range(5):
        await rig.orch.step()
        await asyncio.sleep(0)
        rig.orch.loop.add("ns/a")
        rig.orch.loop.add("ns/b")
    assert sorted(rig.executor.issued()) == [("mpirun", "a-l"), ("mpirun", "b-l")]
    gate.set()
    await rig.settle()
    assert len(rig.executor.calls) == 2


async def test_a_timed_out_last_attempt_left_running_does_not_spin_the_controller() -> None:
    """The last attempt, left RUNNING by a dead controller, timed out: nothing can be issued
    any more, so step() must not ask to be called again at once (it returned 0 s: a hot loop)."""
    rig = Rig()
    raw = mpi_job(1)
    rig.store.add(job_ref(raw))
    left = Record(State.RUNNING, 3, "l", "uid-l", rig.clock.now, holder="dead")
    rig.store.records["ns/train"] = {"mpirun": left}
    rig.orch.on_job("ADDED", rig.job_object(raw))
    rig.orch.on_pod("ADDED", pod("l", "launcher", job="train"))
    rig.orch.on_pod("ADDED", pod("w-0", "worker", job="train"))
    await rig.settle()
    assert rig.store.records["ns/train"]["mpirun"].state is State.RUNNING  # not timed out yet
    assert rig.store.events == []
    rig.clock.now += 86400  # mpi.yaml's timeoutSeconds
    await rig.settle()
    assert rig.executor.calls == []
    assert await rig.orch.step() == rig.orch.settings.resync_s
    assert "ns/train" not in rig.orch.wake
    # Recorded as given up, and said so: it no longer reads "running" for ever.
    record = rig.store.records["ns/train"]["mpirun"]
    assert (record.state, record.attempts, record.holder) == (State.GAVE_UP, 3, "")
    assert "left running by dead, timed out" in record.error
    assert [e[1] for e in rig.store.events] == ["CommandGaveUp"]
    await rig.settle()
    assert [e[1] for e in rig.store.events] == ["CommandGaveUp"]  # once


async def test_a_failed_command_has_its_job_reconciled_again_at_its_retry_time() -> None:
    def fail(req: ExecRequest) -> ExecResult:
        return ExecResult(1, "connection refused")

    rig = Rig(script=fail)
    rig.add_job(mpi_job(1))
    rig.orch.on_pod("ADDED", pod("l", "launcher", job="train"))
    rig.orch.on_pod("ADDED", pod("w-0", "worker", job="train"))
    await rig.settle()
    # mpi.yaml's first retry: 5 s after the failure (the controller's clock stood still).
    assert await rig.orch.reconcile("ns/train") == Requeue(5.0)
    assert rig.orch.loop.due_in("ns/train") == pytest.approx(5.0, abs=1.0)
    assert rig.orch.wake.keys() == {"ns/train"}


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.type, self.data = aiohttp.WSMsgType.BINARY, data


class _Stream:
    """A pods/exec websocket: ``chunks`` of stdout, then the exit status on channel 3."""

    def __init__(self, chunks: int, size: int) -> None:
        self.chunks, self.size = chunks, size

    async def __aenter__(self) -> _Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def __aiter__(self) -> AsyncIterator[_Msg]:
        for i in range(self.chunks):
            yield _Msg(b"\x01" + bytes([ord("a") + i % 26]) * self.size)
        yield _Msg(b"\x03" + json.dumps({"status": "Success"}).encode())


class _Core:
    def __init__(self, stream: _Stream) -> None:
        self.stream = stream

    async def connect_get_namespaced_pod_exec(self, *args: Any, **kwargs: Any) -> _Stream:
        return self.stream


async def test_exec_keeps_only_the_tail_of_a_chatty_commands_output() -> None:
    """A command that writes 16 MiB is held as its tail, not as 16 MiB of strings."""
    kube_exec = KubeExec.__new__(KubeExec)  # no API server: the websocket is scripted
    kube_exec._core = _Core(_Stream(chunks=256, size=64 * 1024))  # type: ignore[assignment]
    request = ExecRequest(namespace="ns", pod="p", argv=("train",), timeout_s=60)
    tracemalloc.start()
    try:
        result = await kube_exec.execute(request)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0
    assert result.output == chr(ord("a") + 255 % 26) * OUTPUT_TAIL
    assert peak < 2 * 1024 * 1024, f"peak {peak} bytes"
