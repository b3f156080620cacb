"""The node agent's decision for a hot-restart request on a pod a kubelet manages. Pure: parsed
pods (:mod:`common.hotrestartwire`, the annotation contract) and times in, decisions out.

The agent's steps for a request (:func:`decide`): pre-pull the image through CRI, then patch
the pod's container image and the status (Restarting) in one write; the kubelet restarts that
container in the existing sandbox; once the pod reports a new container of the new image
running, Succeeded. A pull failure leaves the pod untouched (Failed). A restarted container that
does not come up (image or start errors reported by the kubelet, or the timeout) is Failed and
the pod's image is set back to the old one, so the kubelet restarts the old version.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.hotrestartwire import FAILING_REASONS, Phase, PodView, Request, Status, same_image


@dataclass(frozen=True, slots=True)
class Begin:
    """Pre-pull ``request.image``; then patch the pod's image with a Restarting status."""

    request: Request
    old_image: str
    old_container_id: str


@dataclass(frozen=True, slots=True)
class Finish:
    """Write the terminal ``status`` (and an Event); set the image back to ``rollback_to`` if
    given, so that the kubelet restarts the old version."""

    status: Status
    rollback_to: str = ""


@dataclass(frozen=True, slots=True)
class Wait:
    until: float


Decision = Begin | Finish | Wait | None


def decide(pod: PodView, now: float, timeout_s: float) -> Decision:
    """What the node agent does next for ``pod`` (None: nothing to do)."""
    request, status = pod.request, pod.status
    if request is None:
        return None
    if status is not None and status.id == request.id and status.phase.terminal:
        return None
    if request.container not in pod.images:
        return Finish(
            Status(
                id=request.id,
                phase=Phase.FAILED,
                container=request.container,
                image=request.image,
                reason=f"the pod has no container {request.container!r}; nothing was changed",
                started_at=now,
                finished_at=now,
            )
        )
    if status is None or status.id != request.id or status.phase is Phase.PULLING:
        obs = pod.observed.get(request.container)
        return Begin(request, pod.images[request.container], obs.container_id if obs else "")
    # Restarting: the image is patched; wait for the kubelet's new container.
    obs = pod.observed.get(request.container)

    def failed(reason: str) -> Finish:
        return Finish(
            Status(
                id=request.id,
                phase=Phase.FAILED,
                container=request.container,
                image=request.image,
                reason=reason,
                old_image=status.old_image,
                old_container_id=status.old_container_id,
                new_container_id=obs.container_id if obs else "",
                started_at=status.started_at,
                finished_at=now,
            ),
            rollback_to=status.old_image,
        )

    if (
        obs is not None
        and obs.container_id != status.old_container_id
        and obs.running
        and same_image(obs.image, request.image)
    ):
        return Finish(
            Status(
                id=request.id,
                phase=Phase.SUCCEEDED,
                container=request.container,
                image=request.image,
                reason="restarted in place on the new image",
                old_image=status.old_image,
                old_container_id=status.old_container_id,
                new_container_id=obs.container_id,
                started_at=status.started_at,
                finished_at=now,
            )
        )
    if obs is not None and obs.waiting_reason in FAILING_REASONS:
        return failed(
            f"the kubelet reports {obs.waiting_reason}: {obs.message}".rstrip(": ")
            + f"; the image is set back to {status.old_image}"
        )
    deadline = status.started_at + timeout_s
    if now >= deadline:
        return failed(
            f"no running container of the new image within {timeout_s:g} s; "
            f"the image is set back to {status.old_image}"
        )
    return Wait(deadline)
