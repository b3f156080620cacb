"""The cache server on loopback: what it serves to a peer with the token, and 1,000 hostile
requests (traversal in every encoding, bad ranges, bad credentials, bad ids, other methods)
refused with a 4xx and nothing served."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.testing import PeerNode, random_file, start_peer, write_token

CKPT = EntryId("job-a.step-7")
SECRET = b"TOP-SECRET-OUTSIDE-THE-CACHE-0123456789"


@dataclass
class Served:
    node: PeerNode
    token: str
    data: bytes
    port: int

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    token = write_token(tmp_path / "token")
    (tmp_path / "secret.txt").write_bytes(SECRET * 10)
    store = CacheStore(tmp_path / "cache", max_bytes=1 << 30, piece_size=64 << 10)
    source = random_file(tmp_path / "src.bin", 300_000)
    store.add_file(Kind.CHECKPOINT, CKPT, source)
    store.add_file(
        Kind.IMAGE, EntryId("sha256-" + "a" * 64), source, ref="reg/app@sha256:" + "a" * 64
    )
    # A symlink planted as an entry, pointing out of the cache, with a manifest of its own.
    data_dir = store.data_dir(Kind.CHECKPOINT)
    store.add_file(Kind.CHECKPOINT, EntryId("planted"), tmp_path / "secret.txt")
    (data_dir / "planted").unlink()
    (data_dir / "planted").symlink_to(tmp_path / "secret.txt")
    (data_dir / ".partial-x").write_bytes(SECRET)
    node = await start_peer(store, tmp_path / "token")
    try:
        yield Served(node, token, source.read_bytes(), node.server_port)
    finally:
        await node.stop()


async def raw(port: int, request: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (no client-side normalisation of the path); (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    return int(status_line.split()[1]), body


def request(path: str, headers: dict[str, str], method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: peer", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


# --- what a peer gets ---


async def test_serves_ranges_manifest_and_inventory(served: Served) -> None:
    base = f"http://127.0.0.1:{served.port}"
    async with aiohttp.ClientSession(headers=served.auth) as s:
        async with s.get(
            f"{base}/v1/checkpoints/{CKPT}/data", headers={"Range": "bytes=10-99"}
        ) as r:
            assert r.status == 206
            assert r.headers["Content-Range"] == f"bytes 10-99/{len(served.data)}"
            assert await r.read() == served.data[10:100]
        async with s.get(f"{base}/v1/checkpoints/{CKPT}/data", headers={"Range": "bytes=-5"}) as r:
            assert (r.status, await r.read()) == (206, served.data[-5:])
        async with s.get(f"{base}/v1/checkpoints/{CKPT}/data") as r:
            assert (r.status, await r.read()) == (200, served.data)
        async with s.get(f"{base}/v1/checkpoints/{CKPT}/manifest") as r:
            manifest = await r.json()
        assert manifest["size"] == len(served.data)
        assert manifest["pieces"][0] == hashlib.sha256(served.data[: 64 << 10]).hexdigest()
        async with s.get(f"{base}/v1/inventory") as r:
            inventory = await r.json()
        assert inventory == {
            "checkpoints": [CKPT, "planted"],
            "images": ["reg/app@sha256:" + "a" * 64],
        }
        async with s.head(f"{base}/v1/checkpoints/{CKPT}/data") as r:
            assert r.status == 200
    async with aiohttp.ClientSession() as s, s.get(f"{base}/healthz") as r:
        assert r.status == 200


async def test_an_entry_is_served_as_stored_whatever_the_client_accepts(
    served: Served, tmp_path: Path
) -> None:
    """aiohttp's FileResponse would answer a gzip-accepting client with ``<file>.gz``, and a
    cache may hold an entry ``x`` and another ``x.gz``: the server sends ``x`` itself."""
    sibling = random_file(tmp_path / "other.bin", 1000)
    served.node.store.add_file(Kind.CHECKPOINT, EntryId(f"{CKPT}.gz"), sibling)
    base = f"http://127.0.0.1:{served.port}/v1/checkpoints/{CKPT}/data"
    for accept in ("gzip", "br, gzip, deflate", "identity"):
        async with (
            aiohttp.ClientSession(headers=served.auth, auto_decompress=False) as s,
            s.get(base, headers={"Accept-Encoding": accept}) as r,
        ):
            assert "Content-Encoding" not in r.headers, accept
            assert (r.status, await r.read()) == (200, served.data), accept
        async with (
            aiohttp.ClientSession(headers=served.auth, auto_decompress=False) as s,
            s.get(base, headers={"Accept-Encoding": accept, "Range": "bytes=0-9"}) as r,
        ):
            assert r.headers["Content-Range"] == f"bytes 0-9/{len(served.data)}", accept
            assert await r.read() == served.data[:10], accept


async def test_symlink_out_of_the_cache_is_not_served(served: Served) -> None:
    status, body = await raw(served.port, request("/v1/checkpoints/planted/data", served.auth))
    assert status == 404
    assert SECRET not in body


@pytest.mark.parametrize(
    "header",
    ["bytes=\u0660-9", "bytes=0-\uff19", "bytes=-\u0669", "bytes=\u07c0-"],
    ids=["arabic-indic-first", "fullwidth-last", "suffix", "nko-open-ended"],
)
async def test_a_range_with_non_ascii_digits_is_refused(served: Served, header: str) -> None:
    """int() reads any script's digits but the file server reads ASCII ones only: a range the
    check let through would be answered on the file server's own terms (416, no reason)."""
    path = f"/v1/checkpoints/{CKPT}/data"
    status, body = await raw(served.port, request(path, {**served.auth, "Range": header}))
    assert status == 400
    assert json.loads(body) == {
        "error": "want one range: bytes=first-last, bytes=first- or bytes=-n"
    }


# --- hostile requests ---

TRAVERSALS = [
    "..",
    "../..",
    "%2e%2e",
    "%2E%2E%2F%2E%2E",
    "..%2f..%2fsecret.txt",
    "%252e%252e%252f",
    "..%5c..%5c",
    "..\\..\\secret.txt",
    "%c0%ae%c0%ae",
    "%00",
    "job-a.step-7%00",
    ".partial-x",
    "job-a.step-7/../../../secret.txt",
    "/etc/passwd",
    "%2fetc%2fpasswd",
    "..;",
    "~root",
    "job-a.step-7%2f..%2f..%2fplanted",
    "JOB-A.STEP-7",
    "job-a..step-7",
    "-job",
    "job-",
    "a" * 254,
    ".",
    "%2e",
    "planted",
    "job-a.step-7.json",
    "%u002e%u002e",
]
KINDS = ["checkpoints", "images", "..", "%2e%2e", "manifests", "data", "checkpoints/..", ""]
TAILS = ["data", "manifest", "data/", "data/..", "../../secret.txt", "%2e%2e/secret.txt", ""]
BAD_RANGES = [
    "bytes=0-1,2-3",
    "bytes=0-10,5-20",
    "bytes=100-10",
    "bytes=-0",
    "bytes=999999999-",
    "bytes=300000-",
    "bytes=--1",
    "bytes=-",
    "bytes=a-b",
    "items=0-1",
    "bytes=1-2-3",
    "bytes=0x0-0x10",
    "bytes=99999999999999999999-",
    "bytes=+1-2",
    "bytes=0-1;",
    "bytes = 0-1",
    "bytes=0-1,",
    "bytes=,0-1",
    "",
]


def satisfiable(header: str, size: int) -> bool:
    """Whether a Range header names one satisfiable byte range (this test's own reading)."""
    m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header)
    if m is None or m.group(1) == m.group(2) == "":
        return False
    if m.group(1) == "":
        return int(m.group(2)) > 0
    return int(m.group(1)) < size and (m.group(2) == "" or int(m.group(2)) >= int(m.group(1)))


def fixed(token: str) -> list[bytes]:
    """Every listed traversal, range, credential, method and unknown path, once each."""
    good = {"Authorization": f"Bearer {token}"}
    data, manifest = f"/v1/checkpoints/{CKPT}/data", f"/v1/checkpoints/{CKPT}/manifest"
    out = [request(f"/v1/{k}/{i}/{t}", good) for i in TRAVERSALS for k in KINDS[:2] for t in TAILS]
    out += [request(data, {**good, "Range": r}) for r in BAD_RANGES]
    out += [request(p, h) for p in (data, manifest, "/v1/inventory") for h in CREDENTIALS(token)]
    out += [request(data, good, method=m) for m in METHODS]
    out += [request(p, good) for p in UNKNOWN]
    return out


def CREDENTIALS(token: str) -> list[dict[str, str]]:
    return [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Basic {token}"},
        {"Authorization": f"Bearer {token[:-1]}"},
        {"Authorization": f"Bearer {token}x"},
        {"Authorization": f"Bearer {token.upper()}"},
        {"Authorization": token},
        {"Authorization": "Bearer " + "A" * len(token)},
        {"X-Token": token},
    ]


METHODS = ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"]
UNKNOWN = ["/", "/v1", "/v1/", "/v2/inventory", "/v1/inventory/..", "/metrics"]


def fuzzed(token: str) -> st.SearchStrategy[bytes]:
    """Generated paths, ranges and credentials, one category after another."""
    good = {"Authorization": f"Bearer {token}"}
    data = f"/v1/checkpoints/{CKPT}/data"
    fuzz_id = st.text(
        alphabet=st.sampled_from([*"./\\%2eEfF5c0a-_~;:?@ ", "\u2215", "\u00e9"]),
        min_size=1,
        max_size=40,
    ).filter(lambda s: s not in {CKPT, "healthz"})
    by_path = st.builds(
        lambda k, i, t: request(f"/v1/{k}/{i}/{t}".replace(" ", "%20").replace("#", "%23"), good),
        st.sampled_from(KINDS),
        st.one_of(st.sampled_from(TRAVERSALS), fuzz_id),
        st.sampled_from(TAILS),
    ).filter(lambda r: not r.startswith(f"GET {data} ".encode()))
    by_range = st.builds(
        lambda r: request(data, {**good, "Range": r}),
        st.text(alphabet=st.sampled_from(list("bytes=-,0123456789 x")), max_size=30).filter(
            lambda r: not satisfiable(r, 300_000) and r.strip() == r
        ),
    )
    by_credential = st.builds(
        lambda h: request(data, h),
        st.one_of(
            st.sampled_from(CREDENTIALS(token)),
            st.text(
                min_size=1, max_size=60, alphabet=st.characters(min_codepoint=33, max_codepoint=126)
            )
            .filter(lambda t: t != token)
            .map(lambda t: {"Authorization": f"Bearer {t}"}),
        ),
    )
    return st.integers(0, 2).flatmap(lambda i: (by_path, by_range, by_credential)[i])


async def test_thousand_hostile_requests_refused(served: Served) -> None:
    requests = fixed(served.token)

    @settings(
        max_examples=1000 - len(requests),
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(fuzzed(served.token))
    def collect(req: bytes) -> None:
        requests.append(req)

    collect()
    assert len(requests) >= 1000
    probe = served.data[1000:1032]
    for req in requests:
        status, body = await raw(served.port, req)
        assert 400 <= status < 500, (req, status, body[:200])
        assert probe not in body, req
        assert SECRET not in body, req
        assert len(body) < 1024, (req, len(body))
        # Our refusals are JSON; aiohttp's parser refuses malformed request lines in text.
        if body.startswith(b"{"):
            assert "error" in json.loads(body), body
        else:
            assert status == 400, (req, status, body)
