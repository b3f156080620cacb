"""Cache parts without a server: ids, ranges, manifests, LRU choice, credentials, link
estimates, peers from GpuNodes, the store's eviction and atomic partial pulls, abandoned and
expired partial pulls; policy imports."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from pathlib import Path

import pytest

from common.errors import InvalidInput
from nodeagent.cache.cachestore import CacheStore
from nodeagent.cache.credentials import TokenFile
from nodeagent.cache.eviction import (
    EntryUse,
    PartialUse,
    choose_evictions,
    choose_room,
    expired_partials,
)
from nodeagent.cache.manifest import Manifest, parse_manifest
from nodeagent.cache.naming import EntryId, Kind, image_id, valid_id
from nodeagent.cache.ranges import ByteRange, RangeRefused, parse_range
from nodeagent.pulling.estimation import LinkEstimate, from_probe
from nodeagent.pulling.peers import Peer, holders_from_gpu_nodes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("job-a.step-1200", True),
        ("a", True),
        ("sha256-" + "0" * 64, True),
        ("", False),
        (".", False),
        ("..", False),
        ("a..b", False),
        (".hidden", False),
        ("a/b", False),
        ("a\\b", False),
        ("Upper", False),
        ("trailing-", False),
        ("a" * 253, True),
        ("a" * 254, False),
        ("caf\u00e9", False),
        ("a\x00b", False),
        ("a%2fb", False),
    ],
)
def test_ids(value: str, ok: bool) -> None:
    assert valid_id(value) is ok


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("reg.io/app@sha256:" + "ab" * 32, "sha256-" + "ab" * 32),
        ("reg.io/team/app:1.2", "reg.io-team-app-1.2-"),
        ("///", "image-"),
    ],
)
def test_image_ids_are_valid(ref: str, expected: str) -> None:
    got = image_id(ref)
    if expected.endswith("-"):  # unpinned: the slug, then a hash of the whole reference
        assert got.startswith(expected)
        assert re.fullmatch(r"[0-9a-f]{10}", got.removeprefix(expected))
    else:
        assert got == expected
    assert valid_id(got)


def test_unpinned_image_ids_do_not_collide() -> None:
    refs = [
        "reg/app:1",
        "reg-app:1",
        "reg/app:V1",
        "reg/app:v1",
        "x" * 300 + ":1",
        "x" * 300 + ":2",
    ]
    ids = [image_id(r) for r in refs]
    assert len(set(ids)) == len(refs)
    assert all(valid_id(i) for i in ids)
    assert image_id("reg/app:1") == image_id("reg/app:1")  # stable


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-99", ByteRange(0, 100)),
        ("bytes=10-", ByteRange(10, 1000)),
        ("bytes=-10", ByteRange(990, 1000)),
        ("bytes=-5000", ByteRange(0, 1000)),
        ("bytes=990-5000", ByteRange(990, 1000)),
        ("bytes=5-4", RangeRefused(416, "inverted range")),
        ("bytes=1000-", RangeRefused(416, "range starts at or past the end (1000 bytes)")),
        ("bytes=-0", RangeRefused(416, "empty suffix range")),
        ("bytes=-", RangeRefused(400, "empty range")),
    ],
)
def test_ranges(header: str | None, expected: object) -> None:
    assert parse_range(header, 1000) == expected


@pytest.mark.parametrize(
    "header",
    [
        "bytes=0-1,2-3",
        "bytes=0-5,3-9",
        "bits=0-1",
        "bytes=0x1-2",
        "bytes=+1-2",
        "bytes=1-2-3",
        "bytes=" + "9" * 20 + "-",
    ],
)
def test_refused_range_forms(header: str) -> None:
    refused = parse_range(header, 1000)
    assert isinstance(refused, RangeRefused)
    assert refused.status == 400


def test_manifest_round_trip_and_problems() -> None:
    m = Manifest(Kind.CHECKPOINT, EntryId("ck"), 5000, 4096, ("a" * 64, "b" * 64))
    assert parse_manifest(m.to_json()) == m
    assert m.piece_span(1) == (4096, 904)
    with pytest.raises(InvalidInput) as e:
        parse_manifest({"kind": "x", "id": "../x", "size": -1, "pieceSize": 3, "pieces": ["z"]})
    assert len(e.value.problems) == 5
    with pytest.raises(InvalidInput, match="want 2"):
        parse_manifest({**m.to_json(), "pieces": ["a" * 64]})


def use(name: str, size: int, t: float) -> EntryUse:
    return EntryUse(Kind.CHECKPOINT, EntryId(name), size, t)


@pytest.mark.parametrize(
    ("incoming", "keep", "evicted"),
    [
        pytest.param(0, frozenset(), [], id="fits"),
        pytest.param(30, frozenset(), ["old"], id="oldest-first"),
        pytest.param(60, frozenset(), ["old", "mid"], id="as-many-as-needed"),
        pytest.param(30, frozenset({(Kind.CHECKPOINT, "old")}), ["mid"], id="kept-skipped"),
        pytest.param(500, frozenset(), ["old", "mid", "new"], id="never-enough"),
    ],
)
def test_lru_choice(
    incoming: int, keep: frozenset[tuple[Kind, EntryId]], evicted: list[str]
) -> None:
    entries = [use("new", 30, 3.0), use("old", 30, 1.0), use("mid", 30, 2.0)]
    chosen = choose_evictions(entries, max_bytes=100, incoming=incoming, keep=keep)
    assert [c.id for c in chosen] == evicted


def part(name: str, size: int, t: float) -> PartialUse:
    return PartialUse(Kind.CHECKPOINT, EntryId(name), size, t)


@pytest.mark.parametrize(
    ("incoming", "dropped", "evicted"),
    [
        pytest.param(0, [], [], id="fits"),
        pytest.param(15, ["p-old"], [], id="oldest-partial-first"),
        pytest.param(25, ["p-old", "p-new"], [], id="partials-before-older-entries"),
        pytest.param(50, ["p-old", "p-new"], ["e-old"], id="then-entries-lru"),
    ],
)
def test_room_drops_abandoned_partials_before_entries(
    incoming: int, dropped: list[str], evicted: list[str]
) -> None:
    # Entries 60 bytes, partials 30: the entries were used before the partials last progressed,
    # yet the partials go first.
    entries = [use("e-new", 30, 1.0), use("e-old", 30, 0.5)]
    partials = [part("p-new", 20, 9.0), part("p-old", 10, 5.0)]
    room = choose_room(entries, partials, max_bytes=100, incoming=incoming)
    assert [p.id for p in room.partials] == dropped
    assert [e.id for e in room.entries] == evicted


def test_expired_partials_oldest_first() -> None:
    partials = [part("young", 1, 100.0), part("old", 1, 10.0), part("older", 1, 5.0)]
    partials.append(part("exactly-ttl", 1, 50.0))
    expired = expired_partials(partials, now=150.0, ttl_s=100.0)
    assert [p.id for p in expired] == ["older", "old"]


def test_a_short_or_missing_token_file_gives_no_token(tmp_path: Path) -> None:
    short = tmp_path / "t"
    short.write_text("short\n")
    assert TokenFile(short).token() == b""
    assert TokenFile(tmp_path / "missing").token() == b""


def test_the_token_file_is_re_read_as_the_kubelet_rotates_it(tmp_path: Path) -> None:
    """The kubelet swaps a projected volume's files (a new inode through the ..data link)."""
    data = tmp_path / "..2026_01_01"
    data.mkdir()
    (data / "token").write_text("first-token-0123456789\n")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "token").symlink_to("..data/token")
    token = TokenFile(tmp_path / "token")
    assert token.header() == {"Authorization": "Bearer first-token-0123456789"}
    fresh = tmp_path / "..2026_01_02"
    fresh.mkdir()
    (fresh / "token").write_text("second-token-0123456789\n")
    (tmp_path / "..data_tmp").symlink_to(fresh.name)
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert token.token() == b"second-token-0123456789"


def test_estimates_from_probe_and_transfers() -> None:
    est = from_probe(
        tiny_s=0.01, small_bytes=1_000_000, small_first_byte_s=0.01, small_total_s=0.11
    )
    assert est.latency_s == pytest.approx(0.01)
    assert est.rate == pytest.approx(10_000_000)
    # A transfer twice as fast moves the rate halfway.
    est = est.observe(2_000_000, 0.01, 0.11)
    assert est.rate == pytest.approx(15_000_000)
    assert est.samples == 2
    # A stalled sample cannot zero or negate a link.
    assert LinkEstimate(0.0, 1e6).observe(0, 5.0, 1.0).rate > 0


def test_holders_from_gpu_nodes() -> None:
    def node(name: str, cache: object) -> dict[str, object]:
        return {"metadata": {"name": name}, "status": {"cache": cache}}

    objects = [
        node("b", {"endpoint": "http://10.0.0.2:8477/", "checkpoints": ["ck"]}),
        node("a", {"endpoint": "http://10.0.0.1:8477", "checkpoints": ["ck", "other"]}),
        node("self", {"endpoint": "http://10.0.0.9:8477", "checkpoints": ["ck"]}),
        node("no-endpoint", {"checkpoints": ["ck"]}),
        node("bad-endpoint", {"endpoint": "file:///etc", "checkpoints": ["ck"]}),
        node("other", {"endpoint": "http://10.0.0.3:8477", "checkpoints": ["other"]}),
        node("garbage", "not an object"),
        {"metadata": {}},
    ]
    got = holders_from_gpu_nodes(objects, Kind.CHECKPOINT, EntryId("ck"), exclude="self")
    assert got == [Peer("a", "http://10.0.0.1:8477"), Peer("b", "http://10.0.0.2:8477")]
    img = [node("i", {"endpoint": "http://10.0.0.4:1", "images": ["reg/app:1"]})]
    found = holders_from_gpu_nodes(img, Kind.IMAGE, image_id("reg/app:1"), ref="reg/app:1")
    assert found == [Peer("i", "http://10.0.0.4:1")]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1
        return self.t


def test_store_evicts_least_recently_used(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x" * 4000)
    store = CacheStore(tmp_path / "c", max_bytes=10_000, piece_size=4096, clock=Clock())
    for name in ("a", "b"):
        store.add_file(Kind.CHECKPOINT, EntryId(name), src)
    store.touch(Kind.CHECKPOINT, EntryId("a"))  # b is now the least recently used
    store.add_file(Kind.CHECKPOINT, EntryId("c"), src)
    assert store.inventory()["checkpoints"] == ["a", "c"]
    assert not (store.data_dir(Kind.CHECKPOINT) / "b").exists()
    # Reopened, the store finds its entries again.
    again = CacheStore(tmp_path / "c", max_bytes=10_000, piece_size=4096)
    assert again.inventory()["checkpoints"] == ["a", "c"]


def test_eviction_does_not_hold_the_lock_while_it_deletes_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting a large file can take seconds, and the server reads manifests on its event loop
    under the store's lock: eviction (in a pull's or an import's thread) must not hold the lock
    while it unlinks."""
    src = tmp_path / "src"
    src.write_bytes(b"x" * 4000)
    store = CacheStore(tmp_path / "c", max_bytes=10_000, piece_size=4096, clock=Clock())
    for name in ("a", "b"):
        store.add_file(Kind.CHECKPOINT, EntryId(name), src)
    answered: list[bool] = []
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name == "a":  # the evicted entry's data
            reader = threading.Thread(target=store.manifest, args=(Kind.CHECKPOINT, "b"))
            reader.start()
            reader.join(timeout=2)
            answered.append(not reader.is_alive())
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    store.add_file(Kind.CHECKPOINT, EntryId("c"), src)  # evicts "a"
    assert answered == [True]
    assert store.inventory()["checkpoints"] == ["b", "c"]


def test_store_drops_entries_whose_data_is_gone(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"y" * 5000)
    store = CacheStore(tmp_path / "c", max_bytes=1 << 20, piece_size=4096)
    store.add_file(Kind.IMAGE, image_id("reg/app:1"), src, ref="reg/app:1")
    assert store.inventory() == {"checkpoints": [], "images": ["reg/app:1"]}
    (store.data_dir(Kind.IMAGE) / image_id("reg/app:1")).unlink()
    assert CacheStore(tmp_path / "c", max_bytes=1 << 20).inventory()["images"] == []


def test_partial_pull_keeps_verified_pieces_and_publishes_atomically(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40  # 10240 bytes: pieces of 4096, 4096, 2048
    pieces = tuple(hashlib.sha256(data[i : i + 4096]).hexdigest() for i in range(0, 10240, 4096))
    manifest = Manifest(Kind.CHECKPOINT, EntryId("ck"), len(data), 4096, pieces)
    store = CacheStore(tmp_path / "c", max_bytes=1 << 20, piece_size=4096)
    partial = store.begin_pull(manifest)
    with pytest.raises(InvalidInput, match="already being pulled"):
        store.begin_pull(manifest)
    assert partial.write_piece(0, data[:4096])
    assert not partial.write_piece(1, b"\0" * 4096)  # tampered: refused, nothing written
    partial.record([0])
    partial.close()
    final = store.data_dir(Kind.CHECKPOINT) / "ck"
    assert not final.exists()
    resumed = CacheStore(tmp_path / "c", max_bytes=1 << 20).begin_pull(manifest)
    assert resumed.missing == [1, 2]
    assert resumed.write_piece(1, data[4096:8192])
    assert resumed.write_piece(2, data[8192:])
    resumed.record([1, 2])
    resumed.commit()
    assert final.read_bytes() == data
    assert sorted(p.name for p in final.parent.iterdir()) == ["ck"]


# Hashing an image reference (a short string) into its id is pure; hashing data is not.


PIECE = 4096
CK = Kind.CHECKPOINT


def pieces_of(name: str, count: int) -> tuple[Manifest, bytes]:
    data = hashlib.sha256(name.encode()).digest() * (PIECE * count // 32)
    digests = tuple(
        hashlib.sha256(data[i : i + PIECE]).hexdigest() for i in range(0, len(data), PIECE)
    )
    return Manifest(CK, EntryId(name), len(data), PIECE, digests), data


def leave_partial(store: CacheStore, name: str, count: int, verified: int) -> Manifest:
    """An interrupted pull of ``name`` (``count`` pieces) that verified its first ``verified``."""
    manifest, data = pieces_of(name, count)
    partial = store.begin_pull(manifest)
    for i in range(verified):
        assert partial.write_piece(i, data[i * PIECE : (i + 1) * PIECE])
    partial.record(range(verified))
    partial.close()
    return manifest


def set_mtime(store: CacheStore, name: str, t: float) -> None:
    for suffix in ("", ".log", ".json"):
        os.utime(store.data_dir(CK) / f".partial-{name}{suffix}", (t, t))


def files_of(*names: str) -> list[str]:
    return sorted(f".partial-{n}{s}" for n in names for s in ("", ".log", ".json"))


def dot_files(store: CacheStore) -> list[str]:
    return sorted(p.name for p in store.data_dir(CK).iterdir() if p.name.startswith("."))


def test_abandoned_partial_is_dropped_to_make_room_before_any_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CacheStore(tmp_path / "c", max_bytes=12 * PIECE, piece_size=PIECE, clock=Clock())
    src = tmp_path / "src"
    src.write_bytes(b"x" * 2 * PIECE)
    store.add_file(CK, EntryId("entry"), src)  # used at t ~ 1000
    leave_partial(store, "older", 4, 4)
    set_mtime(store, "older", 5000.0)
    leave_partial(store, "newer", 4, 4)
    set_mtime(store, "newer", 6000.0)
    # Held: 2 pieces + 2 x 4 pieces of partials (+ logs); 3 more do not fit in 12 unless the
    # older partial goes (counting only entries, 5 would fit and nothing would be dropped).
    fresh, _ = pieces_of("fresh", 3)
    with caplog.at_level(logging.INFO, logger="nodeagent.cache.cachestore"):
        store.begin_pull(fresh).close()
    assert store.inventory()["checkpoints"] == ["entry"]
    assert dot_files(store) == files_of("fresh", "newer")  # no .tmp- left behind either
    assert "dropping abandoned partial pull checkpoints/older" in caplog.text
    assert "newer" not in caplog.text


def test_partial_being_pulled_is_neither_counted_nor_dropped(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c", max_bytes=8 * PIECE, piece_size=PIECE, clock=Clock())
    src = tmp_path / "src"
    src.write_bytes(b"x" * 4 * PIECE)
    store.add_file(CK, EntryId("entry"), src)
    manifest, data = pieces_of("busy", 4)
    busy = store.begin_pull(manifest)
    for i in range(4):
        assert busy.write_piece(i, data[i * PIECE : (i + 1) * PIECE])
    busy.record(range(4))
    # 4 + 4 fits in 8 when the busy partial's 4 are not counted; counted, "entry" would go.
    store.add_file(CK, EntryId("other"), src)
    assert store.inventory()["checkpoints"] == ["entry", "other"]
    assert dot_files(store) == files_of("busy")
    busy.commit()
    assert (store.data_dir(CK) / "busy").read_bytes() == data
    assert dot_files(store) == []


def test_a_finished_pull_is_not_dropped_while_it_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An eviction in another thread between the last piece and the rename (another pull
    starting, say) must not take the finished partial for an abandoned one."""
    store = CacheStore(tmp_path / "c", max_bytes=4 * PIECE, piece_size=PIECE, clock=Clock())
    manifest, data = pieces_of("done", 4)
    pull = store.begin_pull(manifest)
    for i in range(4):
        assert pull.write_piece(i, data[i * PIECE : (i + 1) * PIECE])
    pull.record(range(4))
    publish = store._publish

    def evict_then_publish(m: Manifest, path: Path) -> None:
        store.evict(incoming=4 * PIECE)
        publish(m, path)

    monkeypatch.setattr(store, "_publish", evict_then_publish)
    with caplog.at_level(logging.INFO, logger="nodeagent.cache.cachestore"):
        pull.commit()
    assert (store.data_dir(CK) / "done").read_bytes() == data
    assert store.inventory()["checkpoints"] == ["done"]
    # Nor its log and pinned manifest, left alone for a moment once the data is renamed.
    assert "abandoned" not in caplog.text
    assert dot_files(store) == []


def test_a_resumed_partial_is_not_dropped_by_its_own_pull(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c", max_bytes=8 * PIECE, piece_size=PIECE, clock=Clock())
    src = tmp_path / "src"
    src.write_bytes(b"x" * 4 * PIECE)
    store.add_file(CK, EntryId("entry"), src)
    manifest = leave_partial(store, "mine", 4, 2)
    # Entry 4 + incoming 4 fit; the partial's own 2 pieces are part of the incoming 4.
    resumed = store.begin_pull(manifest)
    assert resumed.missing == [2, 3]
    assert store.inventory()["checkpoints"] == ["entry"]
    resumed.close()


def test_partials_older_than_the_ttl_are_dropped_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = 2_000_000_000.0
    store = CacheStore(tmp_path / "c", max_bytes=1 << 20, piece_size=PIECE)
    leave_partial(store, "stale", 4, 2)
    set_mtime(store, "stale", now - 25 * 3600)
    young = leave_partial(store, "young", 4, 3)
    set_mtime(store, "young", now - 3600)
    with caplog.at_level(logging.INFO, logger="nodeagent.cache.cachestore"):
        again = CacheStore(tmp_path / "c", max_bytes=1 << 20, piece_size=PIECE, clock=lambda: now)
    assert dot_files(again) == files_of("young")
    assert "dropping partial pull checkpoints/stale" in caplog.text
    # Allocated at full size (four pieces) when the pull began, and the log "0\n1\n".
    assert f"{4 * PIECE + 4} bytes freed" in caplog.text
    resumed = again.begin_pull(young)
    assert resumed.missing == [3]
    resumed.close()
    # A shorter TTL drops the younger one too.
    set_mtime(again, "young", now - 3600)
    CacheStore(tmp_path / "c", max_bytes=1 << 20, clock=lambda: now, partial_ttl_s=1800)
    assert dot_files(again) == []


def test_stray_partial_files_are_removed_at_start(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "c", max_bytes=1 << 20, piece_size=PIECE)
    kept = leave_partial(store, "kept", 2, 1)
    base = store.data_dir(CK)
    (base / ".partial-lost.log").write_text("0\n")  # log without data
    (base / ".partial-gone.json").write_text("{}")  # pinned manifest without data
    (base / ".partial-unpinned").write_bytes(b"\0" * PIECE)  # data nothing says how to resume
    again = CacheStore(tmp_path / "c", max_bytes=1 << 20, piece_size=PIECE)
    assert dot_files(again) == files_of("kept")
    resumed = again.begin_pull(kept)
    assert resumed.missing == [1]
    resumed.close()
