"""The soak run's observations: what the API server holds, every second, as an Observation.

Pods, GpuNodes, GpuAllocations, GpuLeases, Nodes and the agents' heartbeat Leases are listed
(the cluster admin's token) every second; pods are also watched (:class:`PodWatch`, a thread of
its own), so that states a list a second misses are seen: a borrower's reclaim notice, kube-
scheduler's ``DisruptionTarget`` condition on a victim it preempts, the last state of a pod
deleted with no grace, pods made and deleted between two lists. A pod counts as deleted when the
watch said so or when it was listed before and is not now (the watch restarts after the API
server was away, and may miss what happened in between); its last state is the newest either
saw, and it counts as noticed when any state of it seen carried the reclaim notice. Deletions
the runner made itself (borrowers it finished) are left out; a pod whose node is gone (deleted
by a fault, or not in the list) is marked so.

Processes are sampled from /proc (RSS from VmRSS, open fds), named ``<role>#<generation>``
(a restart starts a new series: a slope over two processes says nothing).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common import contract
from common.heartbeat import heartbeat
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


def _newer(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether pod state ``a`` is newer than ``b`` (resourceVersions compare as integers in
    etcd-backed API servers; anything else: not newer)."""
    try:
        return int(a["metadata"]["resourceVersion"]) > int(b["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False


class Watch:
    """A list, then a watch, of every object at ``path``, each event handed to :meth:`record`
    (under :attr:`lock`); started again from a fresh list whenever the watch ends or fails (the
    API server restarting, an expired resourceVersion). A thread of its own."""

    def __init__(self, kube: Kube, path: str, *, timeout_s: float = 60.0) -> None:
        self.kube = kube
        self.path = path
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        self.events = 0
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"soak-watch{path}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def record(self, kind: str, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.events += 1
            self.record(kind, obj)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.kube.request("GET", self.path, timeout=10)
                for obj in listed.get("items") or []:
                    self._handle("LISTED", obj)
                self._watch(str(listed["metadata"]["resourceVersion"]))
            except Exception:  # the API server away, a watch expired: list and watch again
                pass
            self.restarts += 1
            self._stop.wait(1.0)

    def _watch(self, version: str) -> None:
        query = f"?watch=1&resourceVersion={version}&timeoutSeconds={int(self.timeout_s)}"
        req = urllib.request.Request(
            self.kube.server + self.path + query,
            headers={"Authorization": f"Bearer {self.kube.token}", "Accept": "application/json"},
        )
        context = self.kube._ssl
        with urllib.request.urlopen(req, context=context, timeout=self.timeout_s + 15) as resp:
            for line in resp:
                if self._stop.is_set():
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":  # e.g. 410 Gone: the version is too old; list again
                    return
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._handle(str(kind), obj)


class PodWatch(Watch):
    """Every pod state the API server sends, kept for the observer: the newest state of each
    pod (by uid), the uids seen with the reclaim notice, the pods the watch saw deleted."""

    def __init__(self, kube: Kube, *, timeout_s: float = 60.0) -> None:
        super().__init__(kube, path_of("Pod"), timeout_s=timeout_s)
        self.latest: dict[str, dict[str, Any]] = {}  # uid -> newest state seen
        self.noticed: set[str] = set()
        self.deleted: dict[str, dict[str, Any]] = {}  # uid -> last state, until taken

    def record(self, kind: str, pod: dict[str, Any]) -> None:
        uid = str(pod.get("metadata", {}).get("uid", ""))
        if not uid:
            return
        if contract.ANN_RECLAIM_NOTICE in (pod["metadata"].get("annotations") or {}):
            self.noticed.add(uid)
        known = self.latest.get(uid)
        if known is None or not _newer(known, pod):
            self.latest[uid] = pod
        if kind == "DELETED":
            self.deleted[uid] = self.latest.pop(uid)

    def take_deleted(self) -> dict[str, dict[str, Any]]:
        """The pods deleted since the last call, with their last state."""
        with self.lock:
            out, self.deleted = self.deleted, {}
            return out


class LeaseWatch(Watch):
    """Every GpuLease state the API server sends, in order: a reclaim of a fraction of a second
    starts and ends between two lists, and the checkers must still see it."""

    def __init__(self, kube: Kube, *, timeout_s: float = 60.0) -> None:
        super().__init__(kube, path_of(contract.KIND_GPU_LEASE), timeout_s=timeout_s)
        self.states: list[dict[str, Any]] = []

    def record(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self.states.append(obj)

    def take(self) -> list[dict[str, Any]]:
        """The states seen since the last call, oldest first."""
        with self.lock:
            out, self.states = self.states, []
            return out


class Observer:
    def __init__(
        self,
        kube: Kube,
        *,
        timeout_s: float = 5.0,
        watch: bool = True,
        agent_namespace: str = contract.DEFAULT_AGENT_NAMESPACE,
    ) -> None:
        self.kube = kube
        self.agent_namespace = agent_namespace
        self.timeout_s = timeout_s
        self.watch = PodWatch(kube) if watch else None
        self.lease_watch = LeaseWatch(kube) if watch else None
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> last state listed
        self._noticed: set[str] = set()  # uids seen with the reclaim notice
        self.ours: set[str] = set()  # uids the runner deleted itself
        self.lost_nodes: set[str] = set()  # nodes a fault deleted (until made again)
        self.deletions_seen = 0
        self.last_error = ""  # why the last failed observation failed
        self._pending: dict[str, dict[str, Any]] = {}  # deleted per the watch, still listed
        self.failed = 0

    def start(self) -> None:
        for w in (self.watch, self.lease_watch):
            if w is not None:
                w.start()

    def stop(self) -> None:
        for w in (self.watch, self.lease_watch):
            if w is not None:
                w.stop()

    def lists(self) -> dict[str, list[dict[str, Any]]] | None:
        """Every listed kind, or None when the API server did not answer them all."""
        out: dict[str, list[dict[str, Any]]] = {}
        try:
            for kind, name in LISTED:
                reply = self.kube.request("GET", path_of(kind), timeout=self.timeout_s)
                out[name] = list(reply.get("items") or [])
            leases = f"/apis/coordination.k8s.io/v1/namespaces/{self.agent_namespace}/leases"
            reply = self.kube.request("GET", leases, timeout=self.timeout_s)
            out["agent_leases"] = [
                lease
                for lease in reply.get("items") or []
                if lease["metadata"]["name"].startswith(contract.AGENT_LEASE_PREFIX)
            ]
        except Exception as e:  # any failure to list: the observation is skipped
            self.failed += 1
            self.last_error = f"{e!r}"
            return None
        return out

    def observe(
        self, t: float, processes: Mapping[str, int], *, full_disks: frozenset[str] = frozenset()
    ) -> Observation | None:
        """The observation at ``t``; ``processes``: name -> pid to sample; ``full_disks``: the
        nodes whose cache disk the runner has filled now."""
        listed = self.lists()
        if listed is None:
            return None
        wall = time.time()
        heartbeats: dict[str, float] = {}
        for lease in listed["agent_leases"]:
            holder, renewed = heartbeat(lease)
            if renewed is not None:
                heartbeats[str(holder)] = renewed
        pods = listed["pods"]
        node_names = {str(n["metadata"]["name"]) for n in listed["nodes"]}
        now: dict[str, dict[str, Any]] = {}
        for pod in pods:
            uid = str(pod["metadata"].get("uid", ""))
            now[uid] = pod
            if contract.ANN_RECLAIM_NOTICE in (pod["metadata"].get("annotations") or {}):
                self._noticed.add(uid)
        gone = {uid: self._pods[uid] for uid in self._pods.keys() - now.keys()}
        if self.watch is not None:
            with self.watch.lock:
                self._noticed |= self.watch.noticed
                self.watch.noticed.clear()
                latest = dict(self.watch.latest)
            for uid, last in self.watch.take_deleted().items():
                if uid in now:  # listed before the watch said: the next list will not have it
                    self._pending[uid] = last
                    continue
                if uid not in gone or _newer(last, gone[uid]):
                    gone[uid] = last
            for uid in list(self._pending):
                if uid not in now:
                    last = self._pending.pop(uid)
                    if uid not in gone or _newer(last, gone[uid]):
                        gone[uid] = last
            for uid, last in list(gone.items()):
                newer = latest.get(uid)
                if newer is not None and _newer(newer, last):
                    gone[uid] = newer
            with self.watch.lock:  # a deletion the watch missed (it was away) ends here
                for uid in gone:
                    self.watch.latest.pop(uid, None)
        deletions = []
        for uid, last in gone.items():
            noticed = uid in self._noticed
            self._noticed.discard(uid)
            if uid in self.ours:
                self.ours.discard(uid)
                continue
            node = str((last.get("spec") or {}).get("nodeName") or "")
            lost = bool(node) and (node in self.lost_nodes or node not in node_names)
            deletions.append(Deletion(last, noticed, lost))
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
            heartbeats=heartbeats,
            wall=wall,
            lease_history=tuple(self.lease_watch.take()) if self.lease_watch else (),
            full_disks=full_disks,
        )
