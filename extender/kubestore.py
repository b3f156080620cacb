"""The :class:`~extender.store.Store` backed by the Kubernetes API server.

Uses the ``kubernetes_asyncio`` client for configuration, authentication and TLS, and asks it for
raw responses: objects stay JSON dicts with their API field names, as everywhere else in
tidelease, and watches are read line by line without model conversion. Status codes map onto
tidelease's errors: 404 -> NotFound, 409 -> Conflict, 429/5xx/network -> Unavailable, other
4xx -> InvalidInput.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from common import contract
from common.errors import Conflict, InvalidInput, NotFound, Unavailable
from common.model import Allocation, NodeName
from common.objects import gpu_allocation_object, parse_gpu_allocation, resource_version
from extender.store import EventType, Kind, WatchEvent

log = logging.getLogger(__name__)

_CRD_BASE = f"/apis/{contract.GROUP}/{contract.VERSION}"
_LIST_PATHS: dict[Kind, str] = {
    "Pod": "/api/v1/pods",
    "GpuNode": f"{_CRD_BASE}/{contract.PLURAL_GPU_NODE}",
    "GpuAllocation": f"{_CRD_BASE}/{contract.PLURAL_GPU_ALLOCATION}",
}
_WATCH_TIMEOUT_S = 290


def _error(status: int, what: str, body: bytes) -> Exception:
    try:
        message = json.loads(body).get("message", "")
    except (ValueError, AttributeError):
        message = body[:200].decode(errors="replace")
    text = f"{what}: HTTP {status}: {message}"
    if status == 404:
        return NotFound(text)
    if status == 409:
        return Conflict(text)
    if status == 429 or status >= 500:
        return Unavailable(text)
    return InvalidInput(text)


class KubeStore:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    @classmethod
    async def connect(cls, kubeconfig: Path | None = None) -> KubeStore:
        """From a kubeconfig file, or in-cluster when none is given and one is available."""
        if kubeconfig is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                return cls(client.ApiClient())
            except config.ConfigException:
                pass
        await config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None)
        return cls(client.ApiClient())

    async def close(self) -> None:
        await self._api.close()

    async def _raw(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = 30,
    ) -> aiohttp.ClientResponse:
        try:
            resp: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=request_timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unavailable(f"{method} {path}: {e}") from e
        return resp

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = await self._raw(method, path, **kwargs)
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise Unavailable(f"{method} {path}: {e}") from e
        finally:
            resp.release()
        if not 200 <= resp.status < 300:
            raise _error(resp.status, f"{method} {path}", data)
        value = json.loads(data)
        if not isinstance(value, dict):
            raise Unavailable(f"{method} {path}: reply is not an object")
        return value

    # --- Store protocol ---
    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._json("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except NotFound:
            return None

    async def read_ledger(self, node: NodeName) -> tuple[tuple[Allocation, ...], str]:
        try:
            obj = await self._json("GET", f"{_LIST_PATHS['GpuAllocation']}/{node}")
        except NotFound:
            return (), ""
        return parse_gpu_allocation(obj)[1], resource_version(obj)

    async def write_ledger(
        self, node: NodeName, allocations: Iterable[Allocation], version: str
    ) -> str:
        obj = gpu_allocation_object(node, allocations, version)
        path = _LIST_PATHS["GpuAllocation"]
        if version:
            written = await self._json("PUT", f"{path}/{node}", body=obj)
        else:  # create; a concurrent creator makes this 409 AlreadyExists, i.e. Conflict
            written = await self._json("POST", path, body=obj)
        return resource_version(written)

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: dict[str, str]
    ) -> None:
        # The UID in the patch is a precondition: a re-created pod of that name fails the patch.
        patch = {"metadata": {"uid": uid, "annotations": annotations}}
        await self._json(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._json(
            "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=binding
        )

    async def watch(self) -> AsyncIterator[WatchEvent]:
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue(maxsize=10_000)
        tasks = [
            asyncio.create_task(self._list_watch(kind, queue), name=f"watch-{kind}")
            for kind in _LIST_PATHS
        ]
        try:
            while True:
                yield await queue.get()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _list_watch(self, kind: Kind, queue: asyncio.Queue[WatchEvent]) -> None:
        """List, then watch from the list's version; relist on expiry, back off on errors."""
        path = _LIST_PATHS[kind]
        known: dict[tuple[str, str], dict[str, Any]] = {}
        backoff = 0.5
        while True:
            try:
                listed = await self._json("GET", path)
                version = resource_version(listed)
                fresh = {}
                for item in listed.get("items") or []:
                    meta = item.get("metadata") or {}
                    fresh[(meta.get("namespace", ""), meta.get("name", ""))] = item
                for key, old in known.items():
                    if key not in fresh:
                        await queue.put((kind, "DELETED", old))
                for item in fresh.values():
                    await queue.put((kind, "ADDED", item))
                known = fresh
                await queue.put((kind, "SYNCED", {}))
                backoff = 0.5
                while True:
                    version = await self._watch_once(kind, path, version, known, queue)
            except (Unavailable, InvalidInput, NotFound, Conflict) as e:
                log.warning("watch of %s failed, relisting in %.1f s: %s", kind, backoff, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _watch_once(
        self,
        kind: Kind,
        path: str,
        version: str,
        known: dict[tuple[str, str], dict[str, Any]],
        queue: asyncio.Queue[WatchEvent],
    ) -> str:
        """Follow one watch request to its end; the version to resume from."""
        query = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": _WATCH_TIMEOUT_S,
        }
        resp = await self._raw("GET", path, query=query, request_timeout=_WATCH_TIMEOUT_S + 30)
        try:
            if resp.status != 200:
                raise _error(resp.status, f"watch {path}", await resp.read())
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    # 410 Gone: our version is too old; relist.
                    raise Unavailable(f"watch {path}: {obj.get('message', obj)}")
                version = resource_version(obj) or version
                if etype == "BOOKMARK":
                    continue
                meta = obj.get("metadata") or {}
                key = (meta.get("namespace", ""), meta.get("name", ""))
                if etype == "DELETED":
                    known.pop(key, None)
                else:
                    known[key] = obj
                ev: EventType = etype
                await queue.put((kind, ev, obj))
        except (aiohttp.ClientError, TimeoutError) as e:
            raise Unavailable(f"watch {path}: {e}") from e
        finally:
            resp.release()
        return version
