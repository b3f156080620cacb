"""The peer cache on a nearly full disk: pulls into a real, small tmpfs (mounted by the test; this
machine runs the tests as root, and a mount that fails fails the test), from real cache servers
on loopback. A pull that cannot fit is refused before it writes, room is made by eviction when
that is enough, and ENOSPC or a reserve breached mid-pull drops the partial with one clear error;
the filesystem is never left without its reserve by the cache."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from nodeagent.cache import cachestore as store_module
from nodeagent.cache.cachestore import CacheStore, NoSpace, free_bytes
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.cache.testing import random_file, start_peer
from nodeagent.pulling.puller import PullSettings, pull
from tests.integration.test_peer_pull import CKPT, MIB, PIECE, Rig

FS_BYTES = 64 * MIB
RESERVE = 8 * MIB
OLDER = EntryId("job-a.step-1000")
NEWER = EntryId("job-a.step-1100")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs of the test's own, unmounted afterwards."""
    mount = tmp_path / "fs"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount)],
        check=True,
        capture_output=True,
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True, capture_output=True)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path)  # the source and the peers' stores on the ordinary disk
    try:
        yield r
    finally:
        for p in r.peers:
            await p.stop()


def fill(path: Path, size: int) -> Path:
    """Another writer's file of ``size`` bytes, allocated."""
    with open(path, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)
    return path


def fill_to(mount: Path, name: str, free: int) -> Path:
    """Fill ``mount`` until ``free`` bytes are left."""
    return fill(mount / name, free_bytes(mount) - free)


def dest_store(mount: Path) -> CacheStore:
    return CacheStore(mount / "cache", max_bytes=1 << 40, piece_size=PIECE, reserve_bytes=RESERVE)


def data_files(store: CacheStore) -> list[str]:
    return sorted(p.name for p in store.data_dir(Kind.CHECKPOINT).iterdir())


async def pull_into(rig: Rig, store: CacheStore, rate: float = 200 * MIB) -> None:
    peer = await rig.peer("p0", rate=rate)
    await pull(
        store=store,
        kind=Kind.CHECKPOINT,
        entry=CKPT,
        peers=rig.sources([peer]),
        headers=rig.headers,
        digest=rig.digest,
        settings=PullSettings(shard_bytes=MIB),
    )


async def test_a_pull_into_a_nearly_full_filesystem_fails_cleanly_leaving_the_reserve(
    rig: Rig, tmpfs: Path
) -> None:
    dest = dest_store(tmpfs)
    # The entry fits in what is free, but not with the reserve left over.
    fill_to(tmpfs, "other-writer", rig.manifest.size + RESERVE // 2)
    before = free_bytes(tmpfs)
    with pytest.raises(NoSpace) as failed:
        await pull_into(rig, dest)
    message = str(failed.value)
    assert message.startswith(f"no space for checkpoints/{CKPT}: needs ")
    assert f"{before} free" in message
    assert f"{RESERVE} kept in reserve" in message
    assert int(message.split("needs ")[1].split(" bytes")[0]) > rig.manifest.size
    assert "\n" not in message
    assert data_files(dest) == []
    assert dest.data_path(Kind.CHECKPOINT, CKPT) is None
    assert free_bytes(tmpfs) == before >= RESERVE


async def test_room_is_made_by_evicting_least_recently_used_entries(rig: Rig, tmpfs: Path) -> None:
    dest = dest_store(tmpfs)
    old = random_file(rig.tmp / "old.bin", 12 * MIB)
    dest.add_file(Kind.CHECKPOINT, OLDER, old)
    dest.add_file(Kind.CHECKPOINT, NEWER, old)
    dest.touch(Kind.CHECKPOINT, NEWER)
    # Without evicting, 24 MiB do not fit with the reserve; evicting the older entry is enough.
    fill_to(tmpfs, "other-writer", rig.manifest.size + RESERVE - 2 * MIB)
    await pull_into(rig, dest)
    assert rig.pulled_digest(dest) == rig.digest
    assert dest.inventory()["checkpoints"] == [NEWER, CKPT]
    assert free_bytes(tmpfs) >= RESERVE


async def test_nothing_is_evicted_when_evicting_everything_would_not_be_enough(
    rig: Rig, tmpfs: Path
) -> None:
    dest = dest_store(tmpfs)
    small = random_file(rig.tmp / "small.bin", 2 * MIB)
    dest.add_file(Kind.CHECKPOINT, OLDER, small)
    fill_to(tmpfs, "other-writer", rig.manifest.size)
    with pytest.raises(NoSpace, match="evicting what the cache may evict would not make room"):
        await pull_into(rig, dest)
    assert dest.inventory()["checkpoints"] == [OLDER]
    assert data_files(dest) == [OLDER]


async def test_enospc_while_allocating_drops_the_partial(
    rig: Rig, tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """statvfs says it fits (it lies here, as it may on a thin-provisioned or shared disk), the
    preallocation meets the real ENOSPC: the pull fails before any byte is fetched."""
    dest = dest_store(tmpfs)
    fill_to(tmpfs, "other-writer", rig.manifest.size // 2)
    before = free_bytes(tmpfs)
    monkeypatch.setattr(store_module, "free_bytes", lambda path: free_bytes(path) + (1 << 40))
    with pytest.raises(NoSpace, match=r"No space left on device allocating the file; partial"):
        await pull_into(rig, dest)
    assert data_files(dest) == []
    assert free_bytes(tmpfs) == before


async def test_enospc_while_writing_a_piece_drops_the_partial(
    rig: Rig, tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that cannot preallocate (``posix_fallocate`` does nothing here) and a
    statvfs that says it fits: the real ENOSPC comes from a piece's write, mid-pull."""
    dest = dest_store(tmpfs)
    fill_to(tmpfs, "other-writer", rig.manifest.size // 2)
    before = free_bytes(tmpfs)
    monkeypatch.setattr(store_module, "free_bytes", lambda path: free_bytes(path) + (1 << 40))
    monkeypatch.setattr(store_module.os, "posix_fallocate", lambda fd, offset, length: None)
    with pytest.raises(NoSpace, match=r"No space left on device writing piece \d+; partial"):
        await pull_into(rig, dest)
    assert data_files(dest) == []
    assert free_bytes(tmpfs) == before


async def test_another_writer_filling_the_disk_mid_pull_drops_the_partial(
    rig: Rig, tmpfs: Path
) -> None:
    """The pull fits when it starts; another writer then eats into the reserve. The next piece
    finds the reserve breached: the pull fails and its (allocated) file is freed."""
    dest = dest_store(tmpfs)
    task = asyncio.create_task(pull_into(rig, dest, rate=8 * MIB))  # about 3 s
    log = dest.data_dir(Kind.CHECKPOINT) / f".partial-{CKPT}.log"
    deadline = asyncio.get_running_loop().time() + 20
    while not (log.exists() and log.read_text().split()):
        assert not task.done(), "the pull ended before any piece was logged"
        assert asyncio.get_running_loop().time() < deadline, "no piece verified in 20 s"
        await asyncio.sleep(0.01)
    fill_to(tmpfs, "other-writer", RESERVE // 2)
    with pytest.raises(NoSpace, match="the reserve was breached during the pull; partial"):
        await asyncio.wait_for(task, 30)
    assert data_files(dest) == []
    assert dest.data_path(Kind.CHECKPOINT, CKPT) is None
    assert free_bytes(tmpfs) >= RESERVE  # the pull's own allocation is given back


async def test_the_command_exits_with_one_line_and_no_traceback(rig: Rig, tmpfs: Path) -> None:
    peer = await start_peer(rig.seed, rig.token_file)
    rig.peers.append(peer)
    fill_to(tmpfs, "other-writer", rig.manifest.size + RESERVE // 2)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "common.cli",
        "cache",
        "pull",
        CKPT,
        "--cache-dir",
        str(tmpfs / "cache"),
        "--cache-reserve-bytes",
        str(RESERVE),
        "--token-file",
        str(rig.token_file),
        "--peer",
        peer.url,
        "--sha256",
        rig.digest,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, (out, err)
    lines = [ln for ln in err.decode().splitlines() if ln.startswith("tidelease cache pull: ")]
    assert len(lines) == 1, err.decode()
    assert lines[0].startswith(f"tidelease cache pull: no space for checkpoints/{CKPT}: needs ")
    assert "Traceback" not in err.decode()
    assert sorted(p.name for p in (tmpfs / "cache" / "checkpoints" / "data").iterdir()) == []
    assert free_bytes(tmpfs) >= RESERVE
