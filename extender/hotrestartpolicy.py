"""The hot-restart operator's decision (pure): turn a wished image change of an opted-in pod
into a request the pod's node agent carries out in place (docs/hot-restart.md).

A change is ``tidelease.io/hot-restart-image: <container>=<image>`` on a pod that carries
``tidelease.io/hot-restart: "true"``, whose container's image differs from the wish. The
operator writes ``tidelease.io/hot-restart-request`` with a new id; one request per pod at a
time (a newer wish waits until the current request ends); a request that failed is not
retried for the same wish (change the wish, or set it again, to retry). Wishes that can never
be carried out (malformed, unknown container) get a Failed status and an Event.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import InvalidInput
from nodeagent.restarting.requests import (
    Phase,
    PodView,
    Request,
    Status,
    parse_wish,
    request_id,
    same_image,
)


@dataclass(frozen=True, slots=True)
class WriteRequest:
    request: Request
    why: str


@dataclass(frozen=True, slots=True)
class Reject:
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
        if pod.status is not None and pod.status.id == rid:
            return None
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
