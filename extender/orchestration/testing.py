"""Faithful fakes of the orchestrator's seams and named factories, for tests and benchmarks:
:class:`FakeJobStore` (the job ConfigMaps' records, compare-and-swap included),
:class:`FakeExecutor` (scripted exits, every call recorded), ``pod(...)`` and ``job(...)``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from common.errors import NotFound, Unavailable
from extender.orchestration.jobreadiness import LABEL_JOB, LABEL_ROLE
from extender.orchestration.jobs import (
    DATA_DEPENDENCIES,
    DATA_REPLICAS,
    JOB,
    LABEL_ORCHESTRATION,
    JobRef,
)
from extender.orchestration.podexec import ExecRequest, ExecResult
from extender.orchestration.records import ANN_RECORDS, Record, dump_records, parse_records
from extender.orchestration.storing import Change


def pod(
    name: str,
    role: str,
    *,
    job: str = "job",
    namespace: str = "ns",
    ready: bool = True,
    ip: str | None = None,
    uid: str | None = None,
    gpus: int = 0,
    deleting: bool = False,
) -> dict[str, Any]:
    """A pod of ``job`` playing ``role``, as the API server shows it."""
    container: dict[str, Any] = {"name": "main", "image": "img"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{name}",
        "labels": {LABEL_JOB: job, LABEL_ROLE: role},
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [container]},
        "status": {
            "phase": "Running" if ready else "Pending",
            "podIP": ip or f"10.0.{len(name)}.{sum(map(ord, name)) % 250 + 1}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def job(
    name: str,
    dependencies: str,
    replicas: Mapping[str, int] | None = None,
    *,
    namespace: str = "ns",
    uid: str | None = None,
    records: Mapping[str, Record] | None = None,
    resource_version: str = "1",
) -> dict[str, Any]:
    """A job ConfigMap."""
    ann = {ANN_RECORDS: dump_records(records)} if records else {}
    data = {DATA_DEPENDENCIES: dependencies}
    if replicas is not None:
        data[DATA_REPLICAS] = yaml.safe_dump(dict(replicas))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "resourceVersion": resource_version,
            "labels": {LABEL_ORCHESTRATION: JOB},
            "annotations": ann,
        },
        "data": data,
    }


@dataclass
class FakeJobStore:
    """The records of each job (by key), with a version bumped on every write."""

    records: dict[str, dict[str, Record]] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    conflicts: int = 0  # the next N writes lose a race (re-read and re-applied)
    unavailable: int = 0  # the next N calls fail as an API server outage would

    def add(self, ref: JobRef) -> None:
        self.uids[ref.key] = ref.uid
        self.records.setdefault(ref.key, {})
        self.versions.setdefault(ref.key, 1)

    def _check(self, ref: JobRef) -> None:
        if self.unavailable:
            self.unavailable -= 1
            raise Unavailable("fake API server unavailable")
        if self.uids.get(ref.key) != ref.uid:
            raise NotFound(f"job {ref.key}")

    async def update_records(self, job: JobRef, change: Change) -> Mapping[str, Record] | None:
        for _ in range(20):
            self._check(job)
            await asyncio.sleep(0)
            new = change(dict(self.records[job.key]))
            if new is None:
                return None
            if self.conflicts:
                self.conflicts -= 1
                continue
            # Through the annotation's JSON, as the API server would store it (times rounded).
            stored = parse_records(dump_records(new))
            self.records[job.key] = stored
            self.versions[job.key] += 1
            return stored
        raise Unavailable("conflicts")

    async def write_hosts(self, job: JobRef, script: str, hosts: str) -> None:
        self._check(job)
        self.hosts[job.key], self.scripts[job.key] = hosts, script

    async def report(self, job: JobRef, reason: str, message: str, *, warning: bool) -> None:
        self.events.append((job.key, reason, message))


@dataclass
class FakeExecutor:
    """Exits 0 unless ``script`` says otherwise: ``script(request)`` gives an ExecResult or
    raises; every request is kept in ``calls``; ``gate`` (when set) holds every command until
    it is set."""

    script: Callable[[ExecRequest], ExecResult] | None = None
    calls: list[ExecRequest] = field(default_factory=list)
    gate: asyncio.Event | None = None

    async def execute(self, request: ExecRequest) -> ExecResult:
        self.calls.append(request)
        if self.gate is not None:
            await self.gate.wait()
        if self.script is None:
            return ExecResult(0, "ok")
        return self.script(request)

    def issued(self) -> list[tuple[str, str]]:
        """(command, pod) of every call, in order."""
        return [(c.command, c.pod) for c in self.calls]
