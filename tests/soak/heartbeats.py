"""The kwok GPU nodes' agents, as far as the control plane sees them: their heartbeat Leases.

kwok nodes have no tidelease agent; the soak renews each node's ``tidelease-agent-<node>``
Lease (nodeagent/publishing.py's object) every :data:`RENEW_S` from a thread of its own, so
that the extender and the controllers judge the nodes' agents as they do on a real cluster, and
the ``agent-silent`` fault can stop one: the node's devices are then offered to no pod, and a
lent group on it cannot come back (a reclaim takes stand-ins or ends Degraded). A node deleted
by a fault stops beating too, until it is made again.
"""

from __future__ import annotations

import threading
import time

from common import contract
from nodeagent.publishing import lease_object
from tests.e2e.kube import ApiError, Kube

RENEW_S = 2.0
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


class Heartbeats:
    def __init__(self, kube: Kube, nodes: list[str], *, namespace: str, duration_s: int) -> None:
        self.kube = kube
        self.namespace = namespace
        self.duration_s = duration_s
        self.lock = threading.Lock()
        self.beating = set(nodes)
        self.renewals = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-heartbeats", daemon=True)

    def start(self) -> None:
        for node in sorted(self.beating):
            self._renew(node)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def silence(self, node: str) -> None:
        with self.lock:
            self.beating.discard(node)

    def resume(self, node: str) -> None:
        with self.lock:
            self.beating.add(node)

    def _renew(self, node: str) -> None:
        lease = lease_object(self.namespace, node, time.time(), self.duration_s)
        path = LEASES.format(ns=self.namespace)
        name = contract.AGENT_LEASE_PREFIX + node
        try:
            try:
                self.kube.request(
                    "PATCH",
                    f"{path}/{name}",
                    {"spec": lease["spec"]},
                    content_type="application/merge-patch+json",
                    timeout=5,
                )
            except ApiError as e:
                if e.status != 404:
                    raise
                self.kube.request("POST", path, lease, timeout=5)
            self.renewals += 1
        except Exception:  # the API server away: the next round tries again
            self.failures += 1

    def _run(self) -> None:
        while not self._stop.wait(RENEW_S):
            with self.lock:
                nodes = sorted(self.beating)
            for node in nodes:
                self._renew(node)
