"""The cache server on loopback with the real TokenReview verifier (over the faithful fake of the
API server's endpoint): a peer presenting another node's identity, or none, gets nothing; an
agent's own pod-bound token gets what it asks for, logged with its node; a pull presents the
token the kubelet last rotated in. And a manifest that claims a huge size is refused before
anything is evicted."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from nodeagent.cache.cachestore import CacheStore, TooLarge
from nodeagent.cache.credentials import TokenFile
from nodeagent.cache.manifest import Manifest
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.peerauth import TokenReviewVerifier
from nodeagent.cache.testing import (
    AGENT_USER,
    FakeTokenReviews,
    PeerNode,
    random_file,
    start_peer,
)
from nodeagent.pulling.peers import Peer, StaticPeers
from nodeagent.pulling.puller import PullFailed, pull

AUD = "tidelease-peer-cache"
CKPT = EntryId("job-a.step-7")
PATHS = (
    "/v1/inventory",
    f"/v1/checkpoints/{CKPT}/manifest",
    f"/v1/checkpoints/{CKPT}/data",
    "/v1/checkpoints/missing/manifest",
)


@dataclass
class Rig:
    api: FakeTokenReviews
    node: PeerNode
    data: bytes
    tmp: Path


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    store = CacheStore(tmp_path / "serving", max_bytes=1 << 30, piece_size=64 << 10)
    source = random_file(tmp_path / "src.bin", 300_000)
    store.add_file(Kind.CHECKPOINT, CKPT, source)
    api = FakeTokenReviews()
    node = await start_peer(store, TokenReviewVerifier(api, audience=AUD, user=AGENT_USER))
    try:
        yield Rig(api, node, source.read_bytes(), tmp_path)
    finally:
        await node.stop()


async def get(url: str, token: str | None) -> tuple[int, bytes]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_a_peer_without_an_agents_node_identity_gets_nothing(rig: Rig) -> None:
    api = rig.api
    presented = {
        "none": None,
        "garbage": "s3cret-token-0123456789",
        "forged": "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ0aWRlbGVhc2UtYWdlbnQifQ.",
        "api-audience": api.agent("gpu-b", audience=api.API_AUDIENCE),
        "other-audience": api.agent("gpu-b", audience="vault"),
        "workload-on-a-node": api.workload("gpu-b"),
        "agent-not-bound-to-a-node": api.unbound_agent(),
    }
    revoked = api.agent("gpu-c")
    api.revoke(revoked)  # its pod is gone
    presented["revoked"] = revoked
    probe = rig.data[1000:1032]
    for name, token in presented.items():
        for path in PATHS:
            status, body = await get(rig.node.url + path, token)
            assert status in (401, 403), (name, path, status)
            assert CKPT.encode() not in body, (name, path)
            assert probe not in body, (name, path)
            assert b"missing" not in body, (name, path)  # not even whether it exists
    assert (await get(rig.node.url + "/healthz", None))[0] == 200


async def test_an_agents_own_token_is_served_and_logged_with_its_node(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    token = rig.api.agent("gpu-a")
    with caplog.at_level(logging.INFO, logger="nodeagent.cache.peerserver"):
        status, body = await get(rig.node.url + "/v1/inventory", token)
        assert status == 200
        assert CKPT.encode() in body
        status, body = await get(rig.node.url + f"/v1/checkpoints/{CKPT}/data", token)
        assert status == 200
        assert body == rig.data
        assert (await get(rig.node.url + "/v1/checkpoints/missing/manifest", token))[0] == 404
    served = [r.getMessage() for r in caplog.records if "to node gpu-a" in r.getMessage()]
    assert len(served) == 2, caplog.text
    assert rig.api.reviews == 1  # cached for the next requests


async def test_a_pull_presents_the_rotated_token(rig: Rig) -> None:
    token_file = rig.tmp / "token"
    token_file.write_text(rig.api.agent("gpu-a") + "\n")
    credential = TokenFile(token_file)
    store = CacheStore(rig.tmp / "pulling", max_bytes=1 << 30)
    digest = hashlib.sha256(rig.data).hexdigest()
    peers = StaticPeers([Peer("gpu-b", rig.node.url)])
    result = await pull(
        store=store,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=peers,
        headers=credential.header,
        digest=digest,
    )
    assert result.manifest.sha256 == digest
    # The kubelet rotates the token; the old one's pod is gone.
    old = token_file.read_text().strip()
    rig.api.revoke(old)
    token_file.write_text(rig.api.agent("gpu-a") + "\n")
    assert (await get(rig.node.url + "/v1/inventory", credential.token().decode()))[0] == 200
    # A workload's token is refused: the pull finds no source.
    store.remove(Kind.CHECKPOINT, CKPT)
    token_file.write_text(rig.api.workload("gpu-a") + "\n")
    with pytest.raises(PullFailed):
        await pull(
            store=store,
            kind=Kind.CHECKPOINT,
            entry=CKPT,
            peers=peers,
            headers=credential.header,
            digest=digest,
        )
    assert not store.has(Kind.CHECKPOINT, CKPT)


def huge(claimed: int, digest: str) -> Manifest:
    piece = 1 << 30
    return Manifest(
        Kind.CHECKPOINT,
        EntryId("huge"),
        claimed,
        piece,
        tuple("0" * 64 for _ in range(-(-claimed // piece))),
        None,
        digest,
    )


@pytest.mark.parametrize(
    ("claimed", "max_entry"),
    [(1 << 44, None), (20 << 20, None), (5 << 20, 4 << 20)],
    ids=["16-tib", "over-the-bound", "over-the-largest-entry"],
)
def test_a_manifest_claiming_too_much_is_refused_before_anything_is_evicted(
    tmp_path: Path, claimed: int, max_entry: int | None
) -> None:
    store = CacheStore(
        tmp_path / "c",
        max_bytes=12 << 20,
        piece_size=64 << 10,
        reserve_bytes=0,
        max_entry_bytes=max_entry,
    )
    for i in range(3):
        store.add_file(Kind.CHECKPOINT, EntryId(f"held-{i}"), random_file(tmp_path / "s", 3 << 20))
    before = sorted(e.id for e in store.entries())
    with pytest.raises(TooLarge, match="nothing evicted"):
        store.begin_pull(huge(claimed, "f" * 64))
    assert sorted(e.id for e in store.entries()) == before
    for i in range(3):
        assert store.data_path(Kind.CHECKPOINT, EntryId(f"held-{i}")) is not None
    # A claim that fits makes room by eviction as before.
    fits = store.begin_pull(huge(4 << 20, "f" * 64))
    fits.drop()
    assert len(store.entries()) < 3


async def test_a_pull_offered_a_huge_manifest_keeps_the_cache(tmp_path: Path) -> None:
    """A peer that claims the digest with a 16 TiB manifest empties nothing."""
    from aiohttp import web

    digest = "e" * 64

    async def manifest(request: web.Request) -> web.Response:
        return web.json_response(huge(1 << 44, digest).to_json())

    app = web.Application()
    app.router.add_get("/v1/checkpoints/huge/manifest", manifest)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    store = CacheStore(tmp_path / "c", max_bytes=16 << 20, reserve_bytes=0)
    store.add_file(Kind.CHECKPOINT, EntryId("held"), random_file(tmp_path / "s", 5 << 20))
    try:
        with pytest.raises(TooLarge):
            await pull(
                store=store,
                kind=Kind.CHECKPOINT,
                entry=EntryId("huge"),
                peers=StaticPeers([Peer("forger", url)]),
                headers={},
                digest=digest,
            )
    finally:
        await runner.cleanup()
    assert store.has(Kind.CHECKPOINT, EntryId("held"))
