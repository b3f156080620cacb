"""A small async client for the Kubernetes API, shared by the extender and the node agent.

Uses ``kubernetes_asyncio`` for configuration, authentication and TLS, and asks it for raw
responses: objects stay JSON dicts with their API field names, and watches are read line by line
without model conversion. Status codes map onto tidelease's errors: 404 -> NotFound,
409 -> Conflict, 429 -> TooManyRequests (an Unavailable), 5xx/network -> Unavailable, other
4xx -> InvalidInput.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.helpers
import yaml
import yarl
from kubernetes_asyncio import client, config

from common.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    NotPermitted,
    TooManyRequests,
    Unavailable,
)
from common.objects import resource_version

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 290
# Between relist attempts of a failing watch. A few seconds: the view must come back soon after
# the API server does (a restart used to cost up to 30 s of a stale view).
WATCH_BACKOFF_MAX_S = 4.0


# The cause the Eviction API names when a PodDisruptionBudget refuses (policy/v1
# DisruptionBudgetCause); API Priority and Fairness' 429 names none.
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"


def api_error(status: int, what: str, body: bytes) -> Exception:
    details: dict[str, Any] = {}
    try:
        reply = json.loads(body)
        message = reply.get("message", "")
        details = reply.get("details") or {}
        if not isinstance(details, dict):
            details = {}
    except (ValueError, AttributeError):
        message = body[:200].decode(errors="replace")
    text = f"{what}: HTTP {status}: {message}"
    if status == 403:
        return NotPermitted(text)  # RBAC or admission: until an admin grants it
    if status == 404:
        return NotFound(text)
    if status == 409:
        return Conflict(text)
    if status == 429:
        causes = details.get("causes")
        budget = isinstance(causes, list) and any(
            isinstance(c, dict) and c.get("reason") == DISRUPTION_BUDGET_CAUSE for c in causes
        )
        after = details.get("retryAfterSeconds")
        return TooManyRequests(
            text,
            retry_after_s=float(after) if isinstance(after, int | float) and after > 0 else None,
            disruption_budget=budget,
        )
    if status >= 500:
        return Unavailable(text)
    return InvalidInput(text)


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _identity(obj: dict[str, Any]) -> dict[str, Any]:
    """What a DELETED event needs of an object: its kind and metadata identity."""
    meta = obj.get("metadata") or {}
    ident = {k: meta[k] for k in ("namespace", "name", "uid") if k in meta}
    return {"kind": obj.get("kind"), "metadata": ident}


# Python before 3.12.8 (and 3.13.0) leaks a TLS connection whose close the server never
# answers (fixed by CPython pull request 118960); aiohttp aborts such connections when asked.
_CLEANUP_CLOSED: bool = getattr(aiohttp.connector, "NEEDS_CLEANUP_CLOSED", True)
# Connections to the API server: the watches hold one each, kube-scheduler binds in parallel.
POOL_SIZE = 100


def _ssl_context(cfg: client.Configuration) -> ssl.SSLContext:
    """TLS to the API server as the kubeconfig (or the pod's service account) says."""
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.disable_strict_ssl_verification:
        ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return ctx


async def _own_session(api: client.ApiClient, cfg: client.Configuration) -> None:
    """Give the client a session of ours instead of kubernetes_asyncio's, which

    * trusts the environment, so aiohttp looks up ~/.netrc in a worker thread for every
      request (a thread hop on each bind, each patch): the proxy the environment names for the
      API server (HTTPS_PROXY, NO_PROXY) is looked up once, here, instead;
    * leaves a connection closed while the API server hangs (a request past its timeout) in a
      TLS close that waits 30 s for the server: such connections are aborted at close() here,
      so that a stopping process lets go of every socket.
    """
    rest = api.rest_client
    theirs: aiohttp.ClientSession = rest.pool_manager
    if rest.proxy is None:
        try:
            proxy, _ = aiohttp.helpers.get_env_proxy_for_url(yarl.URL(cfg.host or ""))
            rest.proxy = str(proxy)
        except LookupError:
            pass
    connector = aiohttp.TCPConnector(
        limit=POOL_SIZE, ssl=_ssl_context(cfg), enable_cleanup_closed=_CLEANUP_CLOSED
    )
    # Watch events of large objects exceed aiohttp's default read buffer (as theirs sets it).
    rest.pool_manager = aiohttp.ClientSession(
        connector=connector, trust_env=False, read_bufsize=2**21
    )
    await theirs.close()  # never used: no connection of its own to wait for


class KubeClient:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    @classmethod
    async def connect(
        cls, kubeconfig: Path | None = None, *, env_lookups: bool = False
    ) -> KubeClient:
        """From a kubeconfig file, or in-cluster when none is given and one is available.
        ``env_lookups``: keep kubernetes_asyncio's session as it makes it (benchmarks compare)."""
        cfg = client.Configuration()

        async def made() -> KubeClient:
            api = client.ApiClient(configuration=cfg)
            if not env_lookups:
                await _own_session(api, cfg)
            return cls(api)

        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                return await made()
            except config.ConfigException:
                pass
        try:
            await config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None, client_configuration=cfg
            )
        except (
            config.ConfigException,
            yaml.YAMLError,
            OSError,
            ValueError,
            TypeError,
            KeyError,
        ) as e:
            # A missing, unreadable or malformed kubeconfig: one line, not a traceback.
            where = kubeconfig or "~/.kube/config (not in a cluster)"
            raise InvalidInput(f"kubeconfig {where}: {e}") from e
        return await made()

    async def close(self) -> None:
        await self._api.close()

    async def raw(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        request_timeout: float | None = 30,
    ) -> aiohttp.ClientResponse:
        """The response, unread: the caller reads and releases it."""
        try:
            resp: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": accept, "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=request_timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unavailable(f"{method} {path}: {e}") from e
        return resp

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """The reply object; raises the mapped error for a non-2xx status."""
        resp = await self.raw(method, path, **kwargs)
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise Unavailable(f"{method} {path}: {e}") from e
        finally:
            resp.release()
        if not 200 <= resp.status < 300:
            raise api_error(resp.status, f"{method} {path}", data)
        value = json.loads(data)
        if not isinstance(value, dict):
            raise Unavailable(f"{method} {path}: reply is not an object")
        return value

    async def list_watch(
        self, path: str, query: dict[str, Any] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Every object as ADDED, then ("SYNCED", {}), then every change, until cancelled.

        Relists when the watch expires (objects gone meanwhile come as DELETED); backs off on
        errors. Bookmarks are followed, not yielded.
        """
        # What is known of each object, to tell relist deletions: its identity only, not a
        # second copy of every object (all the cluster's pods, for the pod watch).
        known: dict[tuple[str, str], dict[str, Any]] = {}
        backoff = 0.5
        while True:
            try:
                listed = await self.json("GET", path, query=query)
                version = resource_version(listed)
                items = listed.get("items") or []
                fresh = {_key(item): _identity(item) for item in items}
                for key, old in known.items():
                    if key not in fresh:
                        yield "DELETED", old
                for item in items:
                    yield "ADDED", item
                known = fresh
                yield "SYNCED", {}
                backoff = 0.5
                while True:
                    async for event, obj in self._watch_once(path, query, version):
                        if event == "BOOKMARK":
                            version = resource_version(obj) or version
                            continue
                        version = resource_version(obj) or version
                        if event == "DELETED":
                            known.pop(_key(obj), None)
                        else:
                            known[_key(obj)] = _identity(obj)
                        yield event, obj
            except (Unavailable, InvalidInput, NotFound, Conflict) as e:
                log.warning("watch of %s failed, relisting in %.1f s: %s", path, backoff, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, WATCH_BACKOFF_MAX_S)
            except Exception:
                # Whoever consumes this watch has no other way to learn of changes: a bug here
                # must not end it in silence.
                log.exception("watch of %s broke, relisting in %.1f s", path, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, WATCH_BACKOFF_MAX_S)

    async def _watch_once(
        self, path: str, query: dict[str, Any] | None, version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """One watch request, followed to its end."""
        params = {
            **(query or {}),
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": WATCH_TIMEOUT_S,
        }
        resp = await self.raw("GET", path, query=params, request_timeout=WATCH_TIMEOUT_S + 30)
        try:
            if resp.status != 200:
                raise api_error(resp.status, f"watch {path}", await resp.read())
            async for line in resp.content:
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError as e:  # cut off mid-event: the watch is over
                    raise Unavailable(f"watch {path}: unreadable event: {e}") from e
                etype, obj = str(event.get("type")), event.get("object") or {}
                if etype == "ERROR":
                    # 410 Gone: our version is too old; relist.
                    raise Unavailable(f"watch {path}: {obj.get('message', obj)}")
                yield etype, obj
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            # ValueError: aiohttp's line reader on a line over its limit.
            raise Unavailable(f"watch {path}: {e}") from e
        finally:
            resp.release()
