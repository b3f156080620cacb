"""Command-line wiring of the peer cache: the agent's ``--cache-*`` flags and ``tidelease cache``.

tidelease agent ... --cache-dir /var/cache/tidelease [--cache-token-file FILE]
tidelease cache pull <id> --cache-dir DIR --token-file FILE (--sha256 HEX | --origin URL)
    [--peer URL]...    (FILE: an agent's projected token; peers serve agents only)
tidelease cache add <id> <file> --cache-dir DIR [--image-ref REF]
tidelease cache ls --cache-dir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import InvalidInput
from nodeagent.cache.eviction import DEFAULT_PARTIAL_TTL_S, DEFAULT_RESERVE_BYTES

# The flags are registered on every start of the command; what serves and pulls loads only
# when used.
if TYPE_CHECKING:
    from common.delegatedauth import Reviewer
    from nodeagent.cache.cachestore import CacheStore
    from nodeagent.cache.peerserver import ServeSettings

DEFAULT_CACHE_PORT = 8477
DEFAULT_MAX_BYTES = 200 << 30
# Where the DaemonSet mounts the agent's projected token for the cache's audience.
DEFAULT_TOKEN_FILE = Path("/var/run/secrets/tidelease/peer-cache/token")
DEFAULT_PEER_ACCOUNT = "tidelease-agent"
MAX_PUBLISHED = 512  # the GpuNode schema's maxItems per list


def _size(text: str) -> int:
    """Bytes from ``123``, ``500Mi``, ``200Gi``, ``1Ti`` (binary suffixes)."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            number = float(text[: -len(suffix)])
            if not math.isfinite(number):  # argparse reports a ValueError as a bad value
                raise ValueError(f"{text!r} is not a finite size")
            return int(number * factor)
    return int(text)


def add_agent_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("peer cache (off unless --cache-dir is given; docs/peer-cache.md)")
    g.add_argument("--cache-dir", type=Path, help="the node's checkpoint and image cache")
    g.add_argument("--cache-port", type=int, default=DEFAULT_CACHE_PORT, help="serving port")
    g.add_argument(
        "--cache-token-file",
        type=Path,
        default=DEFAULT_TOKEN_FILE,
        help="this agent's projected ServiceAccount token for --cache-audience, presented to "
        "peers (re-read as the kubelet rotates it)",
    )
    g.add_argument(
        "--cache-audience",
        default="tidelease-peer-cache",
        help="the audience peers' tokens must be issued for (checked with a TokenReview)",
    )
    g.add_argument(
        "--cache-peer-account",
        default=DEFAULT_PEER_ACCOUNT,
        help="the ServiceAccount (in --namespace) whose pod-bound tokens are peers",
    )
    g.add_argument(
        "--cache-max-bytes", type=_size, default=DEFAULT_MAX_BYTES, help="size bound, e.g. 200Gi"
    )
    g.add_argument(
        "--cache-max-entry-bytes",
        type=_size,
        help="the largest entry taken (default: --cache-max-bytes); a manifest claiming more "
        "is refused before anything is evicted",
    )
    g.add_argument(
        "--cache-partial-ttl",
        type=float,
        default=DEFAULT_PARTIAL_TTL_S,
        metavar="SECONDS",
        help="at start, drop partial pulls with no progress for this long (default: a day)",
    )
    g.add_argument(
        "--cache-reserve-bytes",
        type=_size,
        default=DEFAULT_RESERVE_BYTES,
        help="left free on the cache's filesystem whatever the size bound says (default 1Gi)",
    )
    g.add_argument(
        "--cache-advertise",
        help="URL peers reach this cache at (default: http://$POD_IP:<cache-port>)",
    )


@dataclass
class AgentCache:
    """The agent's cache: what it publishes on the GpuNode, and the server task."""

    store: CacheStore
    serve: ServeSettings
    endpoint: str | None

    def inventory(self) -> dict[str, Any]:
        """``status.cache`` of the GpuNode: ids and refs held (the most recently used of each
        kind when there are more than the schema allows; sorted, so that a use alone does not
        change the list), and the endpoint when there is one."""
        from nodeagent.cache.naming import Kind

        by_use = sorted(self.store.entries(), key=lambda e: (-e.last_used, e.kind.value, e.id))
        ckpts = [e.id for e in by_use if e.kind is Kind.CHECKPOINT][:MAX_PUBLISHED]
        images: list[str] = []
        for e in (e for e in by_use if e.kind is Kind.IMAGE):
            if len(images) == MAX_PUBLISHED:
                break
            manifest = self.store.manifest(Kind.IMAGE, e.id)
            if manifest is not None:  # else evicted meanwhile
                images.append(manifest.ref or e.id)
        out: dict[str, Any] = {"checkpoints": sorted(ckpts), "images": sorted(images)}
        if self.endpoint:
            out["endpoint"] = self.endpoint
        return out

    def run(self, api: Reviewer) -> Coroutine[Any, Any, None]:
        """Serve the cache to the peers ``api`` (the API server) vouches for."""
        from nodeagent.cache.peerauth import TokenReviewVerifier
        from nodeagent.cache.peerserver import run_cache_server

        verifier = TokenReviewVerifier(api, audience=self.serve.audience, user=self.serve.peer_user)
        return run_cache_server(store=self.store, settings=self.serve, verifier=verifier)


def open_agent_cache(args: argparse.Namespace) -> AgentCache | None:
    """The cache the agent's flags ask for, or None when ``--cache-dir`` is not given."""
    if args.cache_dir is None:
        return None
    from nodeagent.cache.cachestore import CacheStore

    serve = serve_settings(args)
    problems = serve.validate()
    if args.cache_max_bytes <= 0:
        problems.append("--cache-max-bytes must be positive")
    if args.cache_max_entry_bytes is not None and args.cache_max_entry_bytes <= 0:
        problems.append("--cache-max-entry-bytes must be positive")
    if not args.cache_partial_ttl >= 0:
        problems.append("--cache-partial-ttl must be a non-negative number of seconds")
    if args.cache_reserve_bytes < 0:
        problems.append("--cache-reserve-bytes must not be negative")
    if problems:
        raise InvalidInput(problems)
    endpoint = args.cache_advertise
    if endpoint is None and os.environ.get("POD_IP"):
        endpoint = f"http://{os.environ['POD_IP']}:{args.cache_port}"
    store = CacheStore(
        args.cache_dir,
        max_bytes=args.cache_max_bytes,
        partial_ttl_s=args.cache_partial_ttl,
        reserve_bytes=args.cache_reserve_bytes,
        max_entry_bytes=args.cache_max_entry_bytes,
    )
    return AgentCache(store, serve, endpoint)


def serve_settings(args: argparse.Namespace, port: int | None = None) -> ServeSettings:
    """The cache server's settings from the agent's flags: peers are the pod-bound tokens of
    ``--cache-peer-account`` in ``--namespace`` for ``--cache-audience``."""
    from nodeagent.cache.identity import service_account_user
    from nodeagent.cache.peerserver import ServeSettings

    return ServeSettings(
        port=args.cache_port if port is None else port,
        audience=args.cache_audience,
        # --namespace is the agent's own flag (the heartbeat's namespace, the release's).
        peer_user=service_account_user(
            getattr(args, "namespace", None) or "tidelease-system", args.cache_peer_account
        ),
    )


def agent_inventory(cache: AgentCache | None) -> Callable[[], dict[str, Any]] | None:
    return cache.inventory if cache is not None else None


# --- tidelease cache ---


def add_cache_command(sub: Any) -> None:
    """Register ``tidelease cache`` on the top-level subparsers."""
    from nodeagent.cache.naming import Kind

    p = sub.add_parser("cache", help="the peer checkpoint/image cache: pull, add, ls")
    verbs = p.add_subparsers(dest="cache_verb", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--cache-dir", type=Path, required=True)
        q.add_argument("--cache-max-bytes", type=_size, default=DEFAULT_MAX_BYTES)
        q.add_argument("--cache-reserve-bytes", type=_size, default=DEFAULT_RESERVE_BYTES)

    pl = verbs.add_parser("pull", help="pull an entry from the peers holding it")
    pl.add_argument("id", help="checkpoint id (or image id with --kind images)")
    pl.add_argument("--kind", choices=[k.value for k in Kind], default=Kind.CHECKPOINT.value)
    common(pl)
    pl.add_argument(
        "--token-file",
        type=Path,
        required=True,
        help="an agent's projected token for the cache's audience (peers serve agents only)",
    )
    pl.add_argument(
        "--peer",
        action="append",
        default=[],
        help="peer URL (repeat); default: the GpuNodes that publish the entry",
    )
    pl.add_argument(
        "--sha256",
        help="the content's sha256 (printed by `cache add`): what peers' bytes are checked against",
    )
    pl.add_argument(
        "--origin",
        help="URL of a server with the same API, used when no peer can; without --sha256 its "
        "manifest is the trusted one",
    )
    pl.add_argument("--kubeconfig", type=Path, help="for finding peers (default: in-cluster)")
    pl.add_argument("--node", default=os.environ.get("NODE_NAME"), help="this node (excluded)")
    pl.add_argument("--shard-bytes", type=_size, help="fixed shard size (default: the rule)")
    pl.set_defaults(run=_pull)

    add = verbs.add_parser("add", help="put a local file into the cache")
    add.add_argument("id", help="checkpoint id (ignored for --image-ref: derived from it)")
    add.add_argument("file", type=Path)
    add.add_argument("--image-ref", help="the file is an image archive of this reference")
    common(add)
    add.set_defaults(run=_add)

    ls = verbs.add_parser("ls", help="list the cache's entries")
    common(ls)
    ls.set_defaults(run=_ls)


def _open(args: argparse.Namespace) -> CacheStore:
    from nodeagent.cache.cachestore import CacheStore

    if args.cache_reserve_bytes < 0:
        raise InvalidInput("--cache-reserve-bytes must not be negative")
    return CacheStore(
        args.cache_dir, max_bytes=args.cache_max_bytes, reserve_bytes=args.cache_reserve_bytes
    )


def _pull(args: argparse.Namespace) -> int:
    from nodeagent.cache.cachestore import NoSpace
    from nodeagent.cache.credentials import TokenFile
    from nodeagent.cache.naming import Kind, parse_id
    from nodeagent.pulling.peers import GpuNodePeers, Peer, PeerSource, StaticPeers
    from nodeagent.pulling.puller import PullFailed, PullSettings, describe, pull

    kind = Kind(args.kind)
    entry = parse_id(args.id)
    if entry is None:
        raise InvalidInput(f"{args.id!r} is not a valid id")
    if args.sha256 is None and args.origin is None:
        raise InvalidInput(
            "peers are not trusted for content: give --sha256 (the content's digest) or "
            "--origin (whose manifest is trusted)"
        )
    store = _open(args)
    token = TokenFile(args.token_file)
    if not token.token():
        raise InvalidInput(f"{args.token_file}: no usable token")

    async def main() -> dict[str, Any]:
        kube = None
        peers: PeerSource
        if args.peer:
            peers = StaticPeers(Peer(f"peer{i}", u) for i, u in enumerate(args.peer))
        else:
            from common.kubeclient import KubeClient

            kube = await KubeClient.connect(args.kubeconfig)
            peers = GpuNodePeers(kube, self_node=args.node)
        try:
            result = await pull(
                store=store,
                kind=kind,
                entry=entry,
                peers=peers,
                headers=token.header(),
                origin=args.origin,
                settings=PullSettings(shard_bytes=args.shard_bytes),
                digest=args.sha256,
            )
        finally:
            if kube is not None:
                await kube.close()
        return describe(result)

    try:
        summary = asyncio.run(main())
    except (PullFailed, NoSpace) as e:
        print(f"tidelease cache pull: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def _add(args: argparse.Namespace) -> int:
    from nodeagent.cache.cachestore import NoSpace
    from nodeagent.cache.naming import EntryId, Kind, image_id, parse_id

    store = _open(args)
    try:
        if args.image_ref:
            manifest = store.add_file(
                Kind.IMAGE, image_id(args.image_ref), args.file, ref=args.image_ref
            )
        else:
            entry = parse_id(args.id)
            if entry is None:
                raise InvalidInput(f"{args.id!r} is not a valid id")
            manifest = store.add_file(Kind.CHECKPOINT, EntryId(entry), args.file)
    except NoSpace as e:
        print(f"tidelease cache add: {e}", file=sys.stderr)
        return 1
    out = {"kind": manifest.kind.value, "id": manifest.id, "bytes": manifest.size}
    print(json.dumps({**out, "sha256": manifest.sha256}))
    return 0


def _ls(args: argparse.Namespace) -> int:
    store = _open(args)
    for e in sorted(store.entries(), key=lambda e: -e.last_used):
        sys.stdout.write(f"{e.kind.value}\t{e.id}\t{e.size}\n")
    return 0
