"""The hot-restart annotations and Events written on pods through the API server: by the
operator (requests, rejections) and by the node agent (status, the image patch)."""

from __future__ import annotations

from typing import Any, Protocol

from common import contract
from common.events import Involved, post_event
from common.hotrestartwire import PodView, Status
from common.kubeclient import KubeClient


class Pods(Protocol):
    """The writes the agent makes on a pod."""

    async def write(self, pod: PodView, status: Status, image: tuple[str, str] | None) -> None:
        """Set the status annotation and, if given, (container, image) in one patch."""

    async def event(self, pod: PodView, reason: str, message: str, warning: bool) -> None: ...


class KubePods:
    def __init__(self, kube: KubeClient, component: str = "tidelease-agent") -> None:
        self._kube, self._component = kube, component

    async def write(self, pod: PodView, status: Status, image: tuple[str, str] | None) -> None:
        body: dict[str, Any] = {
            "metadata": {
                "uid": pod.uid,
                "annotations": {contract.ANN_HOT_RESTART_STATUS: status.to_annotation()},
            }
        }
        if image is not None:
            body["spec"] = {"containers": [{"name": image[0], "image": image[1]}]}
        await self._kube.json(
            "PATCH",
            f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            body=body,
            content_type="application/strategic-merge-patch+json",
        )

    async def event(self, pod: PodView, reason: str, message: str, warning: bool) -> None:
        await post_event(
            self._kube,
            Involved("Pod", pod.namespace, pod.name, pod.uid),
            reason,
            message,
            warning=warning,
            component=self._component,
        )
