"""A workload CRD shaped like LeaderWorkerSet for the e2e leasing tests, and the controller that
makes its pods.

The LeaderWorkerSet module is not served here, so the test defines a CRD of that kind in a test
API group (``workloads.tidelease.test``), with a ``scale`` subresource over ``spec.replicas``
(the number of groups), and :class:`GroupController` plays its controller: for each group
``g`` below the replicas a leader ``NAME-g`` and workers ``NAME-g-w``, each labelled with the
group's index as LeaderWorkerSet labels them and controlled by the workload (an owner reference
with ``controller: true``); the pods of groups at or above the replicas deleted. A thread polls
the API server; pods are made as a client makes them (never bound by the test).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tests.e2e.kube import ApiError, Kube, wait_for

GROUP = "workloads.tidelease.test"
VERSION = "v1"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"
API_VERSION = f"{GROUP}/{VERSION}"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd() -> dict[str, Any]:
    """The test's CRD: namespaced, any spec, ``scale`` over ``spec.replicas``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "plural": PLURAL, "singular": KIND.lower()},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                        },
                    },
                }
            ],
        },
    }


def ensure_crd(kube: Kube) -> None:
    """The CRD, created if missing, once the API server serves it."""
    try:
        kube.request("POST", _CRDS, crd())
    except ApiError as e:
        if e.status != 409:
            raise

    def served() -> bool | None:
        got = kube.request("GET", f"{_CRDS}/{PLURAL}.{GROUP}")
        conditions = (got.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions) or None

    wait_for(served, what=f"CRD {PLURAL}.{GROUP} established")


def _path(namespace: str, name: str = "") -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}" + (f"/{name}" if name else "")


class GroupController:
    """Makes the pods of one group workload: ``size`` per group (the leader, then workers),
    each ``pod(name)``, a client's pod body."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        replicas: int,
        size: int,
        pod: Callable[[str], dict[str, Any]],
    ) -> None:
        self.kube, self.ns, self.name, self.size, self.pod = kube, namespace, name, size, pod
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "size": size},
        }
        self.uid = kube.request("POST", _path(namespace), body)["metadata"]["uid"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lws-{name}", daemon=True)
        self._thread.start()

    def members(self, group: int) -> list[str]:
        return [f"{self.name}-{group}"] + [f"{self.name}-{group}-{w}" for w in range(1, self.size)]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self._sync()
            except ApiError as e:
                if e.status == 404 and e.path == _path(self.ns, self.name):
                    return  # the workload is gone (its namespace deleted): nothing to make
            except OSError:
                continue  # the API server away a moment: the next round tries again

    def _sync(self) -> None:
        obj = self.kube.request("GET", _path(self.ns, self.name))
        replicas = int((obj.get("spec") or {}).get("replicas") or 0)
        pods = {
            p["metadata"]["name"]: p
            for p in self.kube.list("Pod", self.ns, selector=f"app={self.name}")
        }
        wanted = {n: g for g in range(replicas) for n in self.members(g)}
        for name, pod in pods.items():
            if name not in wanted and not pod["metadata"].get("deletionTimestamp"):
                self.kube.delete("Pod", name, self.ns)
        for name, g in wanted.items():
            if name in pods:
                continue
            body = self.pod(name)
            meta = body["metadata"]
            meta.setdefault("labels", {}).update({"app": self.name, GROUP_INDEX_LABEL: str(g)})
            meta["ownerReferences"] = [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": self.name,
                    "uid": self.uid,
                    "controller": True,
                }
            ]
            try:
                self.kube.create(body)
            except ApiError as e:
                if e.status != 409:  # still terminating from the last scale-down
                    raise
        ready = sum(1 for g in range(replicas) if all(n in pods for n in self.members(g)))
        self.kube.request(
            "PATCH",
            _path(self.ns, self.name) + "/status",
            {"status": {"replicas": ready}},
            content_type="application/merge-patch+json",
        )
