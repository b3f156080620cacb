"""Where the orchestrator keeps what it did: the job ConfigMap's records annotation
(compare-and-swap on its resourceVersion), the job's discover_hosts ConfigMap, and Events.
:class:`JobStore` is the seam; :mod:`extender.orchestration.testing` has an in-memory fake.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from common.errors import Conflict, NotFound
from common.events import Involved, post_event
from common.kubeclient import KubeClient
from extender.orchestration.jobs import (
    DISCOVERY_HOSTS,
    DISCOVERY_SCRIPT,
    LABEL_ORCHESTRATION,
    JobRef,
)
from extender.orchestration.records import ANN_RECORDS, Record, dump_records, parse_records

log = logging.getLogger(__name__)

CAS_TRIES = 20

Change = Callable[[Mapping[str, Record]], Mapping[str, Record] | None]


class JobStore(Protocol):
    async def update_records(self, job: JobRef, change: Change) -> Mapping[str, Record] | None:
        """Read the job's records, apply ``change`` and write the result if the job did not
        change meanwhile (else re-read and apply again). ``change`` returning None writes
        nothing and gives None. Raises NotFound when the job is gone or was replaced."""
        ...

    async def write_hosts(self, job: JobRef, script: str, hosts: str) -> None:
        """Create or update the job's discover_hosts ConfigMap."""
        ...

    async def report(self, job: JobRef, reason: str, message: str, *, warning: bool) -> None:
        """An Event on the job's ConfigMap."""
        ...


class KubeJobStore:
    def __init__(self, kube: KubeClient, component: str = "tidelease-orchestrator") -> None:
        self._kube, self._component = kube, component

    @staticmethod
    def _path(namespace: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{namespace}/configmaps"
        return f"{base}/{name}" if name else base

    async def update_records(self, job: JobRef, change: Change) -> Mapping[str, Record] | None:
        path = self._path(job.namespace, job.name)
        for _ in range(CAS_TRIES):
            obj = await self._kube.json("GET", path)
            meta = obj.get("metadata") or {}
            if meta.get("uid") != job.uid:
                raise NotFound(f"job {job.key} was replaced")
            current = parse_records((meta.get("annotations") or {}).get(ANN_RECORDS))
            new = change(current)
            if new is None:
                return None
            try:
                await self._kube.json(
                    "PATCH",
                    path,
                    body={
                        "metadata": {
                            "uid": job.uid,
                            "resourceVersion": meta.get("resourceVersion"),
                            "annotations": {ANN_RECORDS: dump_records(new)},
                        }
                    },
                    content_type="application/merge-patch+json",
                )
            except Conflict:
                continue
            return new
        raise Conflict(f"job {job.key}: records kept changing")

    async def write_hosts(self, job: JobRef, script: str, hosts: str) -> None:
        name = job.discovery_config_map
        data = {DISCOVERY_SCRIPT: script, DISCOVERY_HOSTS: hosts}
        for _ in range(CAS_TRIES):
            try:
                obj = await self._kube.json("GET", self._path(job.namespace, name))
            except NotFound:
                body: dict[str, Any] = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": name,
                        "namespace": job.namespace,
                        "labels": {LABEL_ORCHESTRATION: "discover-hosts"},
                        # Deleted with the job.
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "ConfigMap",
                                "name": job.name,
                                "uid": job.uid,
                            }
                        ],
                    },
                    "data": data,
                }
                try:
                    await self._kube.json("POST", self._path(job.namespace), body=body)
                    return
                except Conflict:
                    continue
            if obj.get("data") == data:
                return
            obj["data"] = data
            try:
                await self._kube.json("PUT", self._path(job.namespace, name), body=obj)
                return
            except Conflict:
                continue
        raise Conflict(f"job {job.key}: discover_hosts ConfigMap kept changing")

    async def report(self, job: JobRef, reason: str, message: str, *, warning: bool) -> None:
        with contextlib.suppress(NotFound):
            await post_event(
                self._kube,
                Involved("ConfigMap", job.namespace, job.name, job.uid),
                reason,
                message,
                warning=warning,
                component=self._component,
            )
