"""Who holds an entry: the peers a puller may ask.

In a cluster the answer is in the ``GpuNode`` objects: each agent that serves its cache publishes
``status.cache.endpoint`` (its URL) next to the checkpoint ids and image references it holds.
Tests and the command line can pass a static list instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from common import contract
from common.errors import TideleaseError
from common.kubeclient import KubeClient
from nodeagent.cache.naming import EntryId, Kind

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Peer:
    name: str  # the node's name (or any label, for static peers)
    url: str  # base URL of its cache server, e.g. http://10.0.0.7:8477


class PeerSource(Protocol):
    async def holders(self, kind: Kind, entry: EntryId, *, ref: str | None = None) -> list[Peer]:
        """Peers that say they hold the entry (an image may be listed by reference)."""
        ...


class StaticPeers:
    """A fixed list of peers, all assumed to hold everything (a missing entry is a 404)."""

    def __init__(self, peers: Iterable[Peer]) -> None:
        self.peers = list(peers)

    async def holders(self, kind: Kind, entry: EntryId, *, ref: str | None = None) -> list[Peer]:
        return list(self.peers)


def holders_from_gpu_nodes(
    objects: Iterable[Mapping[str, Any]],
    kind: Kind,
    entry: EntryId,
    *,
    ref: str | None = None,
    exclude: str | None = None,
) -> list[Peer]:
    """The peers that publish the entry in their GpuNode status. Pure."""
    wanted = {entry} if ref is None else {entry, ref}
    peers = []
    for obj in objects:
        name = (obj.get("metadata") or {}).get("name")
        status = obj.get("status") or {}
        cache = status.get("cache") if isinstance(status, Mapping) else None
        if not isinstance(name, str) or name == exclude or not isinstance(cache, Mapping):
            continue
        endpoint = cache.get("endpoint")
        held = cache.get(kind.value)
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            continue
        if isinstance(held, list) and wanted.intersection(h for h in held if isinstance(h, str)):
            peers.append(Peer(name=name, url=endpoint.rstrip("/")))
    return sorted(peers, key=lambda p: p.name)


class GpuNodePeers:
    """Reads the published inventories from the API server (one list per pull)."""

    def __init__(self, kube: KubeClient, *, self_node: str | None = None) -> None:
        self._kube = kube
        self._self = self_node

    async def holders(self, kind: Kind, entry: EntryId, *, ref: str | None = None) -> list[Peer]:
        path = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}"
        try:
            listed = await self._kube.json("GET", path)
        except TideleaseError as e:
            log.warning("cannot list GpuNodes to find peers (falling back to origin): %s", e)
            return []
        items = listed.get("items") or []
        return holders_from_gpu_nodes(items, kind, entry, ref=ref, exclude=self._self)
