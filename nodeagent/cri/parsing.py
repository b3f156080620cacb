"""CRI replies into tidelease's facts: pure functions over the generated messages.

containerd's verbose replies carry a JSON document under the key ``info``: for a sandbox its
pause ``pid``, its ``config`` and the OCI ``runtimeSpec`` (whose network namespace path is the
sandbox's); for a container its ``sandboxID``, ``pid`` and ``config``. The configurations are the
CRI messages as Go's encoding/json writes them (proto field names), so they parse back into the
messages; keys this subset of CRI does not know are reported, not silently dropped.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from nodeagent.cri import api_pb2 as pb
from nodeagent.cri.runtime import (
    ContainerState,
    ContainerStatus,
    ContainerSummary,
    ImageInfo,
    SandboxStatus,
)

_STATES: dict[int, ContainerState] = {
    pb.CONTAINER_CREATED: ContainerState.CREATED,
    pb.CONTAINER_RUNNING: ContainerState.RUNNING,
    pb.CONTAINER_EXITED: ContainerState.EXITED,
    pb.CONTAINER_UNKNOWN: ContainerState.UNKNOWN,
}


def container_state(value: int) -> ContainerState:
    return _STATES.get(value, ContainerState.UNKNOWN)


def verbose_info(info: Any) -> dict[str, Any]:
    """The ``info`` JSON document of a verbose reply ({} when absent or unreadable)."""
    raw = info.get("info") if info is not None else None
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def unknown_keys(message: Message, doc: dict[str, Any]) -> tuple[str, ...]:
    """Top-level keys of ``doc`` that are no field of ``message`` (by proto or JSON name)."""
    known: set[str] = set()
    for f in message.DESCRIPTOR.fields:
        known.update((f.name, f.json_name))
    return tuple(sorted(k for k in doc if k not in known))


def config_from(doc: Any, message: Message) -> tuple[Message | None, tuple[str, ...]]:
    """``doc`` parsed into ``message`` (filled in place) and the keys it did not know; (None, ())
    when ``doc`` is no object or does not parse."""
    if not isinstance(doc, dict):
        return None, ()
    try:
        json_format.ParseDict(doc, message, ignore_unknown_fields=True)
    except json_format.ParseError:
        return None, ()
    return message, unknown_keys(message, doc)


def _pid(doc: dict[str, Any]) -> int | None:
    pid = doc.get("pid")
    return pid if isinstance(pid, int) and pid > 0 else None


def netns_path(doc: dict[str, Any]) -> str:
    """The network namespace path in a verbose sandbox info's OCI runtime spec ("" if none)."""
    spec = doc.get("runtimeSpec") or {}
    linux = spec.get("linux") if isinstance(spec, dict) else None
    for ns in (linux or {}).get("namespaces") or []:
        if isinstance(ns, dict) and ns.get("type") == "network":
            return str(ns.get("path") or "")
    return ""


def sandbox_status(reply: pb.PodSandboxStatusResponse) -> SandboxStatus:
    s = reply.status
    doc = verbose_info(reply.info)
    config, _ = config_from(doc.get("config"), pb.PodSandboxConfig())
    return SandboxStatus(
        id=s.id,
        ready=s.state == pb.SANDBOX_READY,
        ip=s.network.ip,
        name=s.metadata.name,
        namespace=s.metadata.namespace,
        uid=s.metadata.uid,
        pid=_pid(doc),
        netns=netns_path(doc),
        config=config if isinstance(config, pb.PodSandboxConfig) else None,
    )


def container_status(reply: pb.ContainerStatusResponse) -> ContainerStatus:
    s = reply.status
    doc = verbose_info(reply.info)
    config, unknown = config_from(doc.get("config"), pb.ContainerConfig())
    return ContainerStatus(
        id=s.id,
        name=s.metadata.name,
        attempt=s.metadata.attempt,
        state=container_state(s.state),
        image=s.image.image,
        image_ref=s.image_ref,
        exit_code=s.exit_code,
        reason=s.reason,
        sandbox_id=str(doc.get("sandboxID") or ""),
        pid=_pid(doc),
        config=config if isinstance(config, pb.ContainerConfig) else None,
        unknown_config_keys=unknown,
    )


def container_summary(c: pb.Container) -> ContainerSummary:
    return ContainerSummary(
        id=c.id,
        sandbox_id=c.pod_sandbox_id,
        name=c.metadata.name,
        attempt=c.metadata.attempt,
        state=container_state(c.state),
        image=c.image.image,
    )


def image_info(image: pb.Image) -> ImageInfo:
    return ImageInfo(id=image.id, tags=tuple(image.repo_tags), size=image.size)
