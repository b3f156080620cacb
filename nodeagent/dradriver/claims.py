"""Reading the ResourceClaims the kubelet asks the plugin to prepare.

:class:`ClaimReader` is what the plugin needs of the API server: one claim, as the API returns it
(a JSON object; :func:`nodeagent.dradriver.preparing.parse_claim` reads it).
:class:`KubeClaimReader` GETs it (resource.k8s.io/v1) through :class:`common.kubeclient.KubeClient`,
each call bounded by ``timeout_s``; :class:`NullClaimReader` has no API server, so every claim is
refused.

Errors follow :mod:`common.errors`: 404 NotFound, 429/5xx/network/timeouts Unavailable, other 4xx
and a reply that is not a JSON object InvalidInput.
"""

from __future__ import annotations

from typing import Any, Protocol

from common.errors import InvalidInput, Unavailable

RESOURCE_API = "/apis/resource.k8s.io/v1"


def claim_path(namespace: str, name: str) -> str:
    return f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"


class ClaimReader(Protocol):
    async def get(self, namespace: str, name: str) -> object:
        """The ResourceClaim ``namespace/name`` as the API server returns it."""
        ...


class JsonApi(Protocol):
    """What :class:`KubeClaimReader` uses of :class:`common.kubeclient.KubeClient`."""

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]: ...


class KubeClaimReader:
    """:class:`ClaimReader` over the API server. The client is the caller's, who closes it."""

    def __init__(self, api: JsonApi, *, timeout_s: float = 10.0) -> None:
        self._api = api
        self._timeout_s = timeout_s

    async def get(self, namespace: str, name: str) -> object:
        path = claim_path(namespace, name)
        try:
            return await self._api.json("GET", path, request_timeout=self._timeout_s)
        except ValueError as e:  # the body is not JSON (KubeClient.json parses it)
            raise InvalidInput(f"GET {path}: the reply is not JSON: {e}") from e


class NullClaimReader:
    """No API server: no claim can be read, so none is prepared."""

    async def get(self, namespace: str, name: str) -> object:
        raise Unavailable(f"no API server to read ResourceClaim {namespace}/{name}")
