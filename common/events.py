"""Kubernetes Events about our objects (core/v1 Event): one builder for every component."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from common.kubeclient import KubeClient
from common.timefmt import rfc3339

MAX_MESSAGE = 1024  # the API server refuses longer Event messages


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an Event is about."""

    kind: str
    namespace: str
    name: str
    uid: str
    api_version: str = "v1"


def event_object(
    involved: Involved,
    reason: str,
    message: str,
    *,
    warning: bool,
    component: str,
    now: float,
) -> dict[str, Any]:
    stamp = rfc3339(now)
    return {
        "metadata": {"generateName": f"{involved.name}.", "namespace": involved.namespace},
        "involvedObject": {
            "kind": involved.kind,
            "apiVersion": involved.api_version,
            "namespace": involved.namespace,
            "name": involved.name,
            "uid": involved.uid,
        },
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def post_event(
    kube: KubeClient,
    involved: Involved,
    reason: str,
    message: str,
    *,
    warning: bool,
    component: str,
) -> None:
    body = event_object(
        involved, reason, message, warning=warning, component=component, now=time.time()
    )
    await kube.json("POST", f"/api/v1/namespaces/{involved.namespace}/events", body=body)
