"""The hot-restart wire format: the annotations on pods (docs/hot-restart.md) between the
operator (control plane) and the node agent. Pure: parsing and formatting, no I/O.

- ``tidelease.io/hot-restart: "true"`` (pod author): image changes of this pod restart in place.
- ``tidelease.io/hot-restart-image: <container>=<image>`` (pod author, a tool, or the operator
  following a StatefulSet's template): the wanted image of one container.
- ``tidelease.io/hot-restart-request`` (the operator): ``{"id", "container", "image"}``, the
  restart the node agent is to carry out; a new id is a new request.
- ``tidelease.io/hot-restart-status`` (the node agent; the operator for a rejected wish):
  ``{"id", "phase", "reason", "container", "image", "oldImage", "oldContainerId",
  "newContainerId", "startedAt", "finishedAt", "durationSeconds"}``; phase is Pulling,
  Restarting, Succeeded or Failed.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from common import contract
from common.coercion import finite, number
from common.errors import InvalidInput


class Phase(enum.Enum):
    PULLING = "Pulling"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


# Waiting reasons of a container status that mean the restarted container will not come up.
FAILING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)


@dataclass(frozen=True, slots=True)
class Request:
    id: str
    container: str
    image: str

    def to_annotation(self) -> str:
        return json.dumps(
            {"id": self.id, "container": self.container, "image": self.image},
            sort_keys=True,
            separators=(",", ":"),
        )


def request_id(pod_uid: str, container: str, image: str, version: str) -> str:
    """A request's id: new for every wish (the pod's resourceVersion when it was seen)."""
    digest = hashlib.sha256(f"{pod_uid}/{container}={image}@{version}".encode()).hexdigest()
    return digest[:12]


@dataclass(frozen=True, slots=True)
class Status:
    id: str
    phase: Phase
    container: str
    image: str
    reason: str = ""
    old_image: str = ""
    old_container_id: str = ""
    new_container_id: str = ""
    started_at: float = 0.0  # epoch seconds
    finished_at: float = 0.0

    def to_annotation(self) -> str:
        doc: dict[str, Any] = {
            "id": self.id,
            "phase": self.phase.value,
            "container": self.container,
            "image": self.image,
            "reason": self.reason,
            "oldImage": self.old_image,
            "oldContainerId": self.old_container_id,
            "newContainerId": self.new_container_id,
            "startedAt": round(self.started_at, 3),
        }
        if self.phase.terminal:
            doc["finishedAt"] = round(self.finished_at, 3)
            doc["durationSeconds"] = round(max(0.0, self.finished_at - self.started_at), 3)
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _object(value: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(value)
    except RecursionError:
        raise InvalidInput(f"{what}: not JSON: nested too deeply") from None
    except ValueError as e:
        raise InvalidInput(f"{what}: not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise InvalidInput(f"{what}: want a JSON object")
    return doc


def parse_request(value: str) -> Request:
    doc = _object(value, contract.ANN_HOT_RESTART_REQUEST)
    fields = {k: doc.get(k) for k in ("id", "container", "image")}
    missing = [k for k, v in fields.items() if not isinstance(v, str) or not v]
    if missing:
        raise InvalidInput(f"{contract.ANN_HOT_RESTART_REQUEST}: missing {', '.join(missing)}")
    return Request(str(fields["id"]), str(fields["container"]), str(fields["image"]))


def parse_status(value: str) -> Status:
    doc = _object(value, contract.ANN_HOT_RESTART_STATUS)
    try:
        phase = Phase(doc.get("phase"))
    except ValueError as e:
        raise InvalidInput(f"{contract.ANN_HOT_RESTART_STATUS}: unknown phase") from e

    def text(key: str) -> str:
        v = doc.get(key)
        return v if isinstance(v, str) else ""

    def finite_field(key: str) -> float:
        """A finite number, else 0.0 (as when missing): an integer too large for a float, NaN
        and Infinity included."""
        v = doc.get(key)
        return float(v) if number(v) and finite(v) else 0.0

    return Status(
        id=text("id"),
        phase=phase,
        container=text("container"),
        image=text("image"),
        reason=text("reason"),
        old_image=text("oldImage"),
        old_container_id=text("oldContainerId"),
        new_container_id=text("newContainerId"),
        started_at=finite_field("startedAt"),
        finished_at=finite_field("finishedAt"),
    )


def parse_wish(value: str) -> tuple[str, str]:
    """``<container>=<image>`` -> (container, image)."""
    container, sep, image = value.strip().partition("=")
    container, image = container.strip(), image.strip()
    if not sep or not container or not image or any(c.isspace() for c in image):
        raise InvalidInput(
            f"{contract.ANN_HOT_RESTART_IMAGE}: want <container>=<image>, got {value!r}"
        )
    return container, image


def normalized(image: str) -> str:
    """An image reference as runtimes report it: docker.io/library/ prefixes and :latest added,
    so that "app:v2", "docker.io/library/app:v2" compare equal (and "app@sha256:..." and
    "docker.io/library/app@sha256:...": a digest gets the prefixes but no :latest)."""
    name, at, digest = image.strip().partition("@")
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and not at:
        name += ":latest"
    return f"{name}{at}{digest}"


def same_image(a: str, b: str) -> bool:
    return normalized(a) == normalized(b)


@dataclass(frozen=True, slots=True)
class Observed:
    """A container as the pod's status reports it."""

    container_id: str
    image: str
    running: bool
    waiting_reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    resource_version: str
    opted_in: bool
    wish: str | None  # raw hot-restart-image value
    request: Request | None
    status: Status | None
    images: dict[str, str] = field(default_factory=dict)  # spec: container -> image
    observed: dict[str, Observed] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # unreadable request or status annotations

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_view(raw: dict[str, Any]) -> PodView:
    meta = raw.get("metadata") or {}
    ann = meta.get("annotations") or {}
    spec = raw.get("spec") or {}
    st = raw.get("status") or {}
    problems = []
    request = status = None
    if contract.ANN_HOT_RESTART_REQUEST in ann:
        try:
            request = parse_request(str(ann[contract.ANN_HOT_RESTART_REQUEST]))
        except InvalidInput as e:
            problems.append(str(e))
    if contract.ANN_HOT_RESTART_STATUS in ann:
        try:
            status = parse_status(str(ann[contract.ANN_HOT_RESTART_STATUS]))
        except InvalidInput as e:
            problems.append(str(e))
    observed = {}
    for cs in st.get("containerStatuses") or []:
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        observed[str(cs.get("name"))] = Observed(
            container_id=str(cs.get("containerID") or ""),
            image=str(cs.get("image") or ""),
            running="running" in state,
            waiting_reason=str(waiting.get("reason") or ""),
            message=str(waiting.get("message") or "")[:300],
        )
    wish = ann.get(contract.ANN_HOT_RESTART_IMAGE)
    return PodView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str(spec.get("nodeName") or ""),
        phase=str(st.get("phase") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        opted_in=str(ann.get(contract.ANN_HOT_RESTART, "")).lower() == "true",
        wish=str(wish) if wish is not None else None,
        request=request,
        status=status,
        images={
            str(c.get("name")): str(c.get("image") or "") for c in spec.get("containers") or []
        },
        observed=observed,
        problems=tuple(problems),
    )
