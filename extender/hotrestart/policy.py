"""The hot-restart operator's decision (pure): turn a wished image change of an opted-in pod
into a request the pod's node agent carries out in place (docs/hot-restart.md).

A change is ``tidelease.io/hot-restart-image: <container>=<image>`` on a pod that carries
``tidelease.io/hot-restart: "true"``, whose container's image differs from the wish. The
operator writes ``tidelease.io/hot-restart-request`` with a new id; one request per pod at a
time (a newer wish waits until the current request ends); a request that failed is not
retried for the same wish (change the wish, or set it again, to retry). Wishes that can never
be carried out (malformed, unknown container) get a Failed status and an Event once no request
is in progress; the last request's annotation is removed with its status.

Workloads: when a StatefulSet with ``updateStrategy: OnDelete`` whose pod template is opted in
changes a container's image, the operator writes the wish on each of its pods (``template_wish``),
so a template change becomes a hot restart of every pod instead of a re-creation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common import contract
from common.errors import InvalidInput
from common.hotrestartwire import (
    Phase,
    PodView,
    Request,
    Status,
    parse_wish,
    request_id,
    same_image,
)
from common.podrequest import controller_of


@dataclass(frozen=True, slots=True)
class WriteRequest:
    request: Request
    why: str


@dataclass(frozen=True, slots=True)
class Reject:
    """Write ``status`` (Failed) and remove the last request: the agent takes a request whose
    status has another id for a new one, so the request must not outlive its status."""

    status: Status


OperatorAction = WriteRequest | Reject | None


def decide(pod: PodView, now: float) -> OperatorAction:
    if not pod.opted_in or pod.wish is None:
        return None
    current = pod.request
    pending = current is not None and (
        pod.status is None or pod.status.id != current.id or not pod.status.phase.terminal
    )
    try:
        container, image = parse_wish(pod.wish)
        if container not in pod.images:
            raise InvalidInput(f"the pod has no container {container!r}")
    except InvalidInput as e:
        rid = request_id(pod.uid, "invalid", pod.wish, "")
        if pending or (pod.status is not None and pod.status.id == rid):
            return None  # the rejection replaces the status: not while a request runs
        return Reject(
            Status(
                id=rid,
                phase=Phase.FAILED,
                container="",
                image="",
                reason=f"{e}; nothing was changed",
                started_at=now,
                finished_at=now,
            )
        )
    if current is not None and current.container == container and current.image == image:
        return None  # requested already: in progress, done, or failed for this wish
    if pending:
        return None  # one restart at a time; the wish is looked at again when it ends
    if not pod.node or pod.phase != "Running":
        return None  # not running yet: the pod will start on its spec; nothing to restart
    if same_image(pod.images[container], image):
        return None  # already runs the wished image
    request = Request(request_id(pod.uid, container, image, pod.resource_version), container, image)
    return WriteRequest(
        request, f"{container}: {pod.images[container]} -> {image} on node {pod.node}"
    )


@dataclass(frozen=True, slots=True)
class Template:
    """An opted-in workload's pod template, as far as hot restarts go: a StatefulSet with
    ``updateStrategy: OnDelete`` (its controller then leaves running pods alone) whose template
    carries ``tidelease.io/hot-restart: "true"``."""

    key: str  # namespace/name of the workload
    images: dict[str, str]  # container -> image


def template_wish(template: Template, pod: PodView) -> str | None:
    """The wish that brings ``pod`` to its workload's template, one container at a time (the
    first, by name, whose image differs); None when the pod is there already, or when that wish
    is on the pod already."""
    if not pod.opted_in:
        return None
    for container in sorted(template.images):
        current = pod.images.get(container)
        if current is None or same_image(current, template.images[container]):
            continue
        wish = f"{container}={template.images[container]}"
        return None if pod.wish == wish else wish
    return None


def workload_template(raw: dict[str, Any]) -> Template | None:
    """The Template of a StatefulSet object, or None when it is not opted in (no annotation on
    its pod template, or an update strategy under which its controller re-creates pods)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    if (spec.get("updateStrategy") or {}).get("type") != "OnDelete":
        return None
    pod_template = spec.get("template") or {}
    annotations = (pod_template.get("metadata") or {}).get("annotations") or {}
    if annotations.get(contract.ANN_HOT_RESTART) != "true":
        return None
    images = {
        str(c.get("name")): str(c.get("image"))
        for c in (pod_template.get("spec") or {}).get("containers") or []
        if c.get("name") and c.get("image")
    }
    return Template(f"{meta.get('namespace', '')}/{meta.get('name', '')}", images)


def owner_key(raw: dict[str, Any]) -> str | None:
    """namespace/name of the StatefulSet that controls a pod, if one does."""
    meta = raw.get("metadata") or {}
    controller = controller_of(meta)
    if controller is None or controller[0] != "StatefulSet":
        return None
    return f"{meta.get('namespace', '')}/{controller[1]}"
