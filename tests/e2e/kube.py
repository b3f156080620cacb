"""A small synchronous client of the e2e cluster's API server and extender, plus polling.

Plain ``urllib`` against the REST API with the cluster's bearer token and CA: objects stay JSON
dicts, as everywhere in tidelease, and a test reads like the requests it makes.
"""

from __future__ import annotations

import dataclasses
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from common import contract
from common.gangs import WORKLOAD_API

T = TypeVar("T")

# kind -> (API path prefix, plural, namespaced)
_KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Event": ("/api/v1", "events", True),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    contract.KIND_GPU_NODE: (
        f"/apis/{contract.GROUP}/{contract.VERSION}",
        contract.PLURAL_GPU_NODE,
        False,
    ),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    contract.KIND_GPU_LEASE: (
        f"/apis/{contract.GROUP}/{contract.VERSION}",
        contract.PLURAL_GPU_LEASE,
        True,
    ),
    contract.KIND_GPU_ALLOCATION: (
        f"/apis/{contract.GROUP}/{contract.VERSION}",
        contract.PLURAL_GPU_ALLOCATION,
        False,
    ),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Workload": (f"/apis/{WORKLOAD_API}", "workloads", True),
    # Kueue's (tests/e2e/test_kueue.py); its Workload is "KueueWorkload" here, beside the
    # Workload API's.
    "KueueWorkload": ("/apis/kueue.x-k8s.io/v1beta2", "workloads", True),
    "ClusterQueue": ("/apis/kueue.x-k8s.io/v1beta2", "clusterqueues", False),
    "LocalQueue": ("/apis/kueue.x-k8s.io/v1beta2", "localqueues", True),
    "ResourceFlavor": ("/apis/kueue.x-k8s.io/v1beta2", "resourceflavors", False),
    "AdmissionCheck": ("/apis/kueue.x-k8s.io/v1beta2", "admissionchecks", False),
    "MutatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1beta1",
        "mutatingadmissionpolicies",
        False,
    ),
    "MutatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1beta1",
        "mutatingadmissionpolicybindings",
        False,
    ),
}


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.path = path
        # The Status object's message, whole (the body itself when it is not one).
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        self.message = str(parsed.get("message", body)) if isinstance(parsed, dict) else body


def path_of(kind: str, name: str = "", namespace: str | None = None) -> str:
    prefix, plural, namespaced = _KINDS[kind]
    path = prefix
    if namespaced and namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{plural}"
    return f"{path}/{name}" if name else path


@dataclass
class Kube:
    server: str
    token: str
    ca: str
    # Requests made as this user (impersonation: RBAC and admission judge that user, e.g. a
    # tenant with the `edit` role in its namespace); "" for the token's own user.
    user: str = ""

    def __post_init__(self) -> None:
        self._ssl = ssl.create_default_context(cafile=self.ca)

    def as_user(self, user: str) -> Kube:
        """This client, its requests made as ``user`` (with the group system:authenticated)."""
        return dataclasses.replace(self, user=user)

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/json",
                "Content-Type": content_type,
                **(
                    {"Impersonate-User": self.user, "Impersonate-Group": "system:authenticated"}
                    if self.user
                    else {}
                ),
            },
        )
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            with e:
                raise ApiError(method, path, e.code, e.read().decode(errors="replace")) from None

    # --- objects ---
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        result: dict[str, Any] = self.request(
            "POST", path_of(obj["kind"], namespace=meta.get("namespace")), obj
        )
        return result

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = self.request("GET", path_of(kind, name, namespace))
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return result

    def list(
        self, kind: str, namespace: str | None = None, selector: str = ""
    ) -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        items: list[dict[str, Any]] = (
            self.request("GET", path_of(kind, namespace=namespace) + query).get("items") or []
        )
        return items

    def patch(
        self,
        kind: str,
        name: str,
        patch: dict[str, Any],
        namespace: str | None = None,
        subresource: str = "",
    ) -> dict[str, Any]:
        path = path_of(kind, name, namespace) + (f"/{subresource}" if subresource else "")
        result: dict[str, Any] = self.request(
            "PATCH", path, patch, content_type="application/merge-patch+json"
        )
        return result

    def watch(
        self, kind: str, namespace: str | None, resource_version: str, timeout_s: int = 600
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The watch's events (type, object) from ``resource_version`` on, until the API server
        ends it (at most ``timeout_s``) or the caller stops reading."""
        path = (
            path_of(kind, namespace=namespace)
            + f"?watch=1&resourceVersion={resource_version}&timeoutSeconds={timeout_s}"
            + "&allowWatchBookmarks=false"
        )
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(req, context=self._ssl, timeout=timeout_s + 30) as resp:
            for line in resp:
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        try:
            self.request("DELETE", path_of(kind, name, namespace))
        except ApiError as e:
            if e.status != 404:
                raise


def wait_for(
    probe: Callable[[], T | None],
    *,
    what: str,
    timeout: float = 30.0,
    interval: float = 0.2,
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def post_json(
    url: str, body: object, timeout: float = 10, *, tls: ssl.SSLContext | None = None
) -> Any:
    """POST to an endpoint (the extender's verbs: over HTTPS with ``tls``, a context with the
    client certificate) and decode the JSON reply."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout, context=tls) as resp:
        return json.loads(resp.read())


def get_text(url: str, timeout: float = 10, *, token: str | None = None) -> str:
    """GET a text endpoint; with ``token``, as the bearer of it (the extender's /metrics)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text: str = resp.read().decode()
        return text
