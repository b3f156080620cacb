"""The soak run's observations: what the API server holds, every second, as an Observation.

Pods, GpuNodes, GpuAllocations, GpuLeases and Nodes are listed (the cluster admin's token);
pod deletions come from the difference between successive lists: a pod present before and gone
now was deleted, its last state the last one listed. It counts as noticed when any state of it
seen carried the reclaim notice (a notice comes at least the grace, 2 s, before the eviction:
with a list a second, the notice is seen first unless the lists stall longer than that, as
during an etcd pause). Deletions the runner made itself (borrowers it finished) are left out;
a pod whose node is gone (deleted by a fault, or not in the list) is marked so.

Processes are sampled from /proc (RSS from VmRSS, open fds), named ``<role>#<generation>``
(a restart starts a new series: a slope over two processes says nothing).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common import contract
from tests.e2e.kube import Kube, path_of
from tests.soak.invariants import Deletion, Observation, ProcessSample

LISTED = (
    ("Pod", "pods"),
    (contract.KIND_GPU_NODE, "gpu_nodes"),
    (contract.KIND_GPU_ALLOCATION, "ledgers"),
    (contract.KIND_GPU_LEASE, "leases"),
    ("Node", "nodes"),
)


def sample(pid: int) -> ProcessSample | None:
    """RSS and open fds of ``pid``; None once it is gone."""
    try:
        rss = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return ProcessSample(rss, fds)


class Observer:
    def __init__(self, kube: Kube, *, timeout_s: float = 5.0) -> None:
        self.kube = kube
        self.timeout_s = timeout_s
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> last state listed
        self._noticed: set[str] = set()  # uids seen with the reclaim notice
        self.ours: set[str] = set()  # uids the runner deleted itself
        self.lost_nodes: set[str] = set()  # nodes a fault deleted (until made again)
        self.deletions_seen = 0
        self.failed = 0

    def lists(self) -> dict[str, list[dict[str, Any]]] | None:
        """Every listed kind, or None when the API server did not answer them all."""
        out: dict[str, list[dict[str, Any]]] = {}
        try:
            for kind, name in LISTED:
                reply = self.kube.request("GET", path_of(kind), timeout=self.timeout_s)
                out[name] = list(reply.get("items") or [])
        except Exception:  # any failure to list: the observation is skipped
            self.failed += 1
            return None
        return out

    def observe(self, t: float, processes: Mapping[str, int]) -> Observation | None:
        """The observation at ``t``; ``processes``: name -> pid to sample."""
        listed = self.lists()
        if listed is None:
            return None
        pods = listed["pods"]
        node_names = {str(n["metadata"]["name"]) for n in listed["nodes"]}
        now: dict[str, dict[str, Any]] = {}
        for pod in pods:
            uid = str(pod["metadata"].get("uid", ""))
            now[uid] = pod
            if contract.ANN_RECLAIM_NOTICE in (pod["metadata"].get("annotations") or {}):
                self._noticed.add(uid)
        deletions = []
        for uid in self._pods.keys() - now.keys():
            last = self._pods[uid]
            noticed = uid in self._noticed
            self._noticed.discard(uid)
            if uid in self.ours:
                self.ours.discard(uid)
                continue
            node = str((last.get("spec") or {}).get("nodeName") or "")
            gone = bool(node) and (node in self.lost_nodes or node not in node_names)
            deletions.append(Deletion(last, noticed, gone))
        self._pods = now
        self.deletions_seen += len(deletions)
        samples = {}
        for name, pid in processes.items():
            s = sample(pid)
            if s is not None:
                samples[name] = s
        return Observation(
            t=t,
            pods=pods,
            gpu_nodes=listed["gpu_nodes"],
            ledgers=listed["ledgers"],
            leases=listed["leases"],
            nodes=listed["nodes"],
            deletions=tuple(deletions),
            processes=samples,
        )
