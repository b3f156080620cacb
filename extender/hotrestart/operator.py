"""The hot-restart operator (control plane): watches pods, writes hot-restart requests that the
pods' node agents carry out in place (:mod:`extender.hotrestart.policy` decides;
:mod:`nodeagent.hotrestart.podwatch` executes); watches StatefulSets too, and turns a template
image change of an opted-in one (``OnDelete``) into wishes on its pods. Runs in the extender
deployment under its own leader election (``tidelease controllers --hot-restart-operator``).

Each opted-in pod is a key of a :class:`~common.reconcile.ReconcileLoop`: a change of the pod,
or of the template of the StatefulSet that owns it, reconciles it (decides on the pod as last
watched and writes at most one annotation). A write on a stale pod (Conflict) or a pod that is
gone (NotFound) is left to the watch, which brings the new version or the deletion; any other
failure is retried by the loop with backoff. Nothing is timed: no resync, no requeue."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from common import contract
from common.errors import Conflict, NotFound
from common.hotrestartpods import KubePods
from common.hotrestartwire import PodView, Request, pod_view
from common.kubeclient import KubeClient
from common.reconcile import ReconcileLoop, ReconcileSettings, Result, run_checked
from common.watches import Watches, object_key
from extender.hotrestart.policy import (
    Reject,
    Template,
    WriteRequest,
    decide,
    owner_key,
    template_wish,
    workload_template,
)

log = logging.getLogger(__name__)

LEASE_NAME = "tidelease-hot-restart-operator"


class Requests(Protocol):
    async def request(self, pod: PodView, request: Request) -> None: ...

    async def wish(self, pod: PodView, wish: str, workload: str) -> None: ...

    async def reject(self, pod: PodView, reject: Reject) -> None: ...


class KubeRequests:
    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._pods = KubePods(kube, component="tidelease-hot-restart-operator")

    async def _annotate(self, pod: PodView, annotations: dict[str, str | None]) -> None:
        """Set (None: remove) annotations of ``pod`` as the operator saw it: a compare-and-swap
        on its resourceVersion (Conflict when the pod changed meanwhile, e.g. the wish or the
        agent's status), so every write is decided on the current pod."""
        await self._kube.json(
            "PATCH",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            body={
                "metadata": {
                    "uid": pod.uid,
                    "resourceVersion": pod.resource_version,
                    "annotations": annotations,
                }
            },
            content_type="application/merge-patch+json",
        )

    async def request(self, pod: PodView, request: Request) -> None:
        await self._annotate(pod, {contract.ANN_HOT_RESTART_REQUEST: request.to_annotation()})
        await self._pods.event(
            pod,
            "HotRestartRequested",
            f"container {request.container}: restart in place on {request.image} "
            f"(request {request.id})",
            warning=False,
        )

    async def wish(self, pod: PodView, wish: str, workload: str) -> None:
        await self._annotate(pod, {contract.ANN_HOT_RESTART_IMAGE: wish})
        await self._pods.event(
            pod, "HotRestartWished", f"{workload}'s template changed: {wish}", warning=False
        )

    async def reject(self, pod: PodView, reject: Reject) -> None:
        await self._annotate(
            pod,
            {
                contract.ANN_HOT_RESTART_STATUS: reject.status.to_annotation(),
                contract.ANN_HOT_RESTART_REQUEST: None,
            },
        )
        await self._pods.event(pod, "HotRestartRejected", reject.status.reason, warning=True)


class HotRestartOperator:
    def __init__(self, *, requests: Requests, clock: Callable[[], float] = time.time) -> None:
        self.requests, self.clock = requests, clock

    async def step(self, raw: dict[str, Any], template: Template | None = None) -> None:
        pod = pod_view(raw)
        wish = None if template is None else template_wish(template, pod)
        if template is not None and wish is not None:
            log.info("pod %s: following %s's template: %s", pod.key, template.key, wish)
            await self.requests.wish(pod, wish, template.key)
            return  # the watch brings the pod with its wish back
        action = decide(pod, self.clock())
        if isinstance(action, WriteRequest):
            log.info("pod %s: hot restart requested: %s", pod.key, action.why)
            await self.requests.request(pod, action.request)
        elif isinstance(action, Reject):
            log.warning("pod %s: hot restart rejected: %s", pod.key, action.status.reason)
            await self.requests.reject(pod, action)


# The first retry of a failed write; doubling from there (the loop's cap). Two seconds, as the
# operator always waited: an API server hiccup, not worth hammering.
RETRY_BASE_S = 2.0


async def run_hot_restart_operator(
    *,
    kube: KubeClient,
    operator: HotRestartOperator,
    ready: asyncio.Event | None = None,
    registry: CollectorRegistry | None = None,
) -> None:
    """Watch every pod and StatefulSet; reconcile opted-in pods on each change, until cancelled
    or a watch ends. ``ready`` is set once both are listed; the loop's metrics go to
    ``registry`` (None: a registry of their own)."""
    # This term's view, from its own lists (the operator itself outlives terms).
    latest: dict[str, dict[str, Any]] = {}  # opted-in pods by key
    owners: dict[str, str] = {}  # pod key -> its StatefulSet's key
    templates: dict[str, Template] = {}  # opted-in StatefulSets by key

    async def reconcile(key: str) -> Result:
        raw = latest.get(key)
        if raw is None:
            return None  # deleted or opted out since it was added
        owner = owners.get(key)
        try:
            await operator.step(raw, templates.get(owner) if owner else None)
        except (Conflict, NotFound) as e:
            log.debug("pod %s: %s (the watch brings the new version)", key, e)
        return None

    loop = ReconcileLoop(
        "hot-restart-operator",
        reconcile,
        keys=lambda: list(latest),
        settings=ReconcileSettings(retry_base_s=RETRY_BASE_S),
        registry=registry,
    )

    def on_pod(event: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        if event == "DELETED" or contract.ANN_HOT_RESTART not in ann:
            latest.pop(key, None)
            owners.pop(key, None)
            return
        latest[key] = obj
        owner = owner_key(obj)
        if owner is not None:
            owners[key] = owner
        loop.add(key)

    def on_statefulset(event: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        template = None if event == "DELETED" else workload_template(obj)
        if template is None:
            templates.pop(key, None)
            return
        previous = templates.get(key)
        if previous == template:
            return
        templates[key] = template
        members = [k for k, owner in owners.items() if owner == key]
        if previous is not None and members:
            log.info("StatefulSet %s: template changed, %d pod(s) to follow", key, len(members))
        for member in members:
            loop.add(member)

    async with Watches(kube, "hot-restart-operator") as watches:
        watches.add("pods", "/api/v1/pods", on_pod)
        watches.add("statefulsets", "/apis/apps/v1/statefulsets", on_statefulset)
        await watches.wait_synced()
        if ready is not None:
            ready.set()
        await run_checked(loop, watches.check)
