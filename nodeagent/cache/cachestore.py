"""The cache on disk: entries, their manifests, LRU eviction and atomic publication.

Layout under the cache root, one directory per kind (``checkpoints``, ``images``)::

    <kind>/data/<id>                 the entry's bytes
    <kind>/manifests/<id>.json       its manifest (written last: an entry exists once this does)
    <kind>/data/.tmp-<id>-<random>   an entry being written (never a valid id: leading dot)
    <kind>/data/.partial-<id>        a pull in progress: verified pieces written in place
    <kind>/data/.partial-<id>.log    one line per verified, fsynced piece (resume from here)
    <kind>/data/.partial-<id>.json   the manifest the pull is working to
    .lock                            held by the one process that has the store open

A partial pull is resumed by the next pull of the same entry (after an agent restart too). Its
files count against the size bound: abandoned ones (no pull in this process is working on them)
are dropped to make room before any complete entry is evicted, and at start those with no
progress for ``partial_ttl_s`` are dropped, as are stray partial files no pull could resume.

Publication is atomic: the bytes are written under a temporary name in the same directory,
fsynced, and renamed over the final name with ``os.replace``, then the directory is fsynced; the
manifest follows the same way. Nothing incomplete is ever visible under an entry's final name.
A pull publishes only once the whole file's sha256 matches its manifest's (:class:`ContentMismatch`
otherwise, and the partial is dropped: its pieces were verified against a forged manifest).

The disk is never filled: ``reserve_bytes`` stay free on the cache's filesystem. Before a pull
or an import the bytes it will write are checked against ``os.statvfs`` (room is made by the
eviction order when that is enough; :class:`NoSpace` otherwise), its file is preallocated
(``posix_fallocate``) so that a full disk shows at the start, and before each piece is written the
reserve is checked again (another writer may be filling the disk). On ``ENOSPC`` anywhere the
partial pull's files are deleted and :class:`NoSpace` names the entry, the bytes needed and free.

The store is synchronous (files); the server and the puller call it through a thread. A lock
makes it safe to share between those threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from common.errors import InvalidInput, TideleaseError
from nodeagent.cache.eviction import (
    DEFAULT_PARTIAL_TTL_S,
    DEFAULT_RESERVE_BYTES,
    EntryUse,
    PartialUse,
    choose_room,
    disk_bound,
    disk_shortfall,
    expired_partials,
    size_refusal,
)
from nodeagent.cache.manifest import DEFAULT_PIECE_SIZE, Manifest, parse_manifest, piece_count
from nodeagent.cache.naming import EntryId, Kind, valid_id

log = logging.getLogger(__name__)

Clock = Callable[[], float]
_COPY_CHUNK = 1 << 20
_TOUCH_PERSIST_S = 60.0
_PARTIAL = ".partial-"
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
# Besides an entry's bytes: its log, pinned and final manifests and their temporary copies.
_OVERHEAD_BYTES = 64 << 10
_OVERHEAD_PER_PIECE = 256


class NoSpace(TideleaseError):
    """The cache's filesystem cannot take an entry and keep its reserve free; nothing of the
    entry is left on disk."""


class TooLarge(NoSpace):
    """An entry claims more bytes than the cache could ever take (its bound, the largest entry
    allowed, or its filesystem with everything evictable evicted): refused before anything is
    evicted for it."""


class ContentMismatch(TideleaseError):
    """A pulled file's sha256 is not the one its manifest claims (the manifest was forged): the
    partial pull is dropped and nothing is published."""


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def overhead_bytes(manifest: Manifest) -> int:
    """What an entry takes on disk besides its bytes, generously (small files take blocks)."""
    return _OVERHEAD_BYTES + _OVERHEAD_PER_PIECE * len(manifest.pieces)


def _no_space(what: str, need: int, free: int, reserve: int, root: Path, detail: str) -> NoSpace:
    return NoSpace(
        f"no space for {what}: needs {need} bytes, {free} free on {root}'s filesystem, "
        f"{reserve} kept in reserve ({detail})"
    )


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``: temporary name in the same directory, fsync, replace."""
    tmp = path.parent / f".tmp-{path.name}-{secrets.token_hex(6)}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)


LOCK_FILE = ".lock"


def claim_directory(root: Path) -> int:
    """Hold ``root`` for this process: one directory serves one store. A second process opening
    it (``tidelease cache add`` beside a running agent) would clear the first one's temporary
    and partial files, and neither would see the other's entries. A POSIX record lock: held
    until the returned descriptor is closed or the process ends, however it ends; stores opened
    again in the same process (tests, a restart in place) share it."""
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise InvalidInput(
            f"cache directory {root} is in use by another process (pid {holder}): one "
            "directory serves one store; use a directory of your own (docs/peer-cache.md)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@dataclass(slots=True)
class _Entry:
    manifest: Manifest
    last_used: float
    persisted: float


@dataclass(slots=True)
class _PartialFiles:
    """The files of one partial pull found on disk; any of them may be missing."""

    kind: Kind
    id: EntryId
    data: os.stat_result | None = None
    log: os.stat_result | None = None
    pin: os.stat_result | None = None

    def names(self) -> list[str]:
        """The names of the files present, in ``kind``'s data directory."""
        base = f"{_PARTIAL}{self.id}"
        named = ((base, self.data), (f"{base}.log", self.log), (f"{base}.json", self.pin))
        return [name for name, st in named if st is not None]

    def use(self) -> PartialUse:
        # Count what is allocated, not the length: the data file is allocated at full size
        # (one left by an older version is sparse, filled piece by piece).
        size = (self.data.st_blocks * 512 if self.data else 0) + (
            self.log.st_size if self.log else 0
        )
        newest = self.log or self.data or self.pin
        return PartialUse(self.kind, self.id, size, newest.st_mtime if newest else 0.0)


class CacheStore:
    """A size-bounded, LRU-evicted store of checkpoints and images under ``root``.

    ``partial_ttl_s``: at start, partial pulls with no progress for longer than this are dropped
    rather than kept for a resume. ``reserve_bytes``: left free on the filesystem, whatever
    ``max_bytes`` allows. ``max_entry_bytes``: the largest entry taken (default: ``max_bytes``);
    a larger claim is refused (:class:`TooLarge`) before anything is evicted."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        piece_size: int = DEFAULT_PIECE_SIZE,
        clock: Clock = time.time,
        partial_ttl_s: float = DEFAULT_PARTIAL_TTL_S,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
        max_entry_bytes: int | None = None,
    ) -> None:
        self.root = root.resolve()
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes if max_entry_bytes is None else max_entry_bytes
        self.piece_size = piece_size
        self.partial_ttl_s = partial_ttl_s
        self.reserve_bytes = reserve_bytes
        self._clock = clock
        self._lock = threading.RLock()
        # Held from a writer's space check until its file is allocated, so that two writers do
        # not both count the same free bytes; not the lock readers wait on.
        self._space_lock = threading.Lock()
        self._entries: dict[tuple[Kind, EntryId], _Entry] = {}
        self._pulling: set[tuple[Kind, EntryId]] = set()
        self.root.mkdir(parents=True, exist_ok=True)
        # Released by close(), or when the store is collected (or the process ends).
        self._release = weakref.finalize(self, os.close, claim_directory(self.root))
        for kind in Kind:
            self.data_dir(kind).mkdir(parents=True, exist_ok=True)
            self._manifest_dir(kind).mkdir(parents=True, exist_ok=True)
        self._load()

    def close(self) -> None:
        """Let another process open the directory (process exit does the same)."""
        self._release()

    # --- layout ---

    def data_dir(self, kind: Kind) -> Path:
        return self.root / kind.value / "data"

    def _manifest_dir(self, kind: Kind) -> Path:
        return self.root / kind.value / "manifests"

    def _manifest_path(self, kind: Kind, entry: EntryId) -> Path:
        return self._manifest_dir(kind) / f"{entry}.json"

    def _scan_partials(self, kind: Kind) -> list[_PartialFiles]:
        """The partial pulls in ``kind``'s data directory, their files grouped by id.

        Names are ambiguous when an id ends in ``.log`` or ``.json`` (``.partial-a.log`` is the
        log of ``a`` or the data of ``a.log``): such a name is taken as a log or pinned manifest
        when the data file it would belong to exists, else as data."""
        stats: dict[str, os.stat_result] = {}
        with contextlib.suppress(FileNotFoundError), os.scandir(self.data_dir(kind)) as it:
            for d in it:
                if not d.name.startswith(_PARTIAL):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = d.stat(follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode):
                        stats[d.name.removeprefix(_PARTIAL)] = st
        found: dict[str, _PartialFiles] = {}

        def group(name: str) -> _PartialFiles:
            return found.setdefault(name, _PartialFiles(kind, EntryId(name)))

        for rest, st in stats.items():
            if rest.endswith(".log") and rest.removesuffix(".log") in stats:
                group(rest.removesuffix(".log")).log = st
            elif rest.endswith(".json") and rest.removesuffix(".json") in stats:
                group(rest.removesuffix(".json")).pin = st
            else:
                group(rest).data = st
        return list(found.values())

    def _in_pull(self, partial: _PartialFiles) -> bool:
        """Whether a pull in this process is working on these files: its own partial, or its log
        or pinned manifest seen alone (as data of ``<id>.log``) while it publishes its data."""
        ids = {partial.id, partial.id.removesuffix(".log"), partial.id.removesuffix(".json")}
        return any((partial.kind, EntryId(i)) in self._pulling for i in ids)

    def _unlink_partial(self, partial: _PartialFiles) -> None:
        for name in partial.names():
            with contextlib.suppress(OSError):
                (self.data_dir(partial.kind) / name).unlink(missing_ok=True)

    def _clean_partials(self, kind: Kind, now: float) -> list[PartialUse]:
        """At start, when no pull is running: drop stray partial files (a log or pinned manifest
        without its data file, or data without its pinned manifest: nothing a pull could
        resume) and partial pulls with no progress for longer than ``partial_ttl_s``. Returns
        the partial pulls kept for a resume."""
        resumable: dict[tuple[Kind, EntryId], _PartialFiles] = {}
        for p in self._scan_partials(kind):
            if p.data is None or p.pin is None:
                log.warning(
                    "cache: removing stray partial-pull file(s) %s in %s: not a resumable pull",
                    ", ".join(p.names()),
                    kind.value,
                )
                self._unlink_partial(p)
            else:
                resumable[(p.kind, p.id)] = p
        uses = [p.use() for p in resumable.values()]
        expired = expired_partials(uses, now=now, ttl_s=self.partial_ttl_s)
        for u in expired:
            log.info(
                "cache: dropping partial pull %s/%s: no progress for %.0f s (ttl %.0f s), "
                "%d bytes freed",
                kind.value,
                u.id,
                now - u.last_progress,
                self.partial_ttl_s,
                u.size,
            )
            self._unlink_partial(resumable[(u.kind, u.id)])
        return [u for u in uses if u not in expired]

    def _load(self) -> None:
        now = self._clock()
        kept: list[PartialUse] = []
        for kind in Kind:
            for tmp in self.data_dir(kind).glob(".tmp-*"):
                tmp.unlink(missing_ok=True)
            for tmp in self._manifest_dir(kind).glob(".tmp-*"):
                tmp.unlink(missing_ok=True)
            kept += self._clean_partials(kind, now)
            for path in self._manifest_dir(kind).glob("*.json"):
                name = path.name.removesuffix(".json")
                try:
                    manifest = parse_manifest(json.loads(path.read_bytes()))
                    if manifest.kind is not kind or manifest.id != name:
                        raise InvalidInput("manifest names another entry")
                    data = self.data_dir(kind) / name
                    st = data.lstat()
                    if not stat.S_ISREG(st.st_mode) or st.st_size != manifest.size:
                        raise InvalidInput("data missing, not a regular file, or wrong size")
                except (OSError, ValueError, InvalidInput) as e:
                    log.warning("cache: dropping unreadable entry %s/%s: %s", kind.value, name, e)
                    path.unlink(missing_ok=True)
                    continue
                used = path.stat().st_mtime
                self._entries[(kind, manifest.id)] = _Entry(manifest, used, used)
        log.info(
            "cache %s: %d entries, %d bytes; %d partial pull(s) kept for a resume, %d bytes",
            self.root,
            len(self._entries),
            self.total(),
            len(kept),
            sum(p.size for p in kept),
        )

    # --- reading ---

    def total(self) -> int:
        with self._lock:
            return sum(e.manifest.size for e in self._entries.values())

    def entries(self) -> list[EntryUse]:
        with self._lock:
            return [
                EntryUse(k, i, e.manifest.size, e.last_used) for (k, i), e in self._entries.items()
            ]

    def inventory(self) -> dict[str, list[str]]:
        """What the node publishes: checkpoint ids and image references it holds."""
        with self._lock:
            ckpts: list[str] = sorted(i for (k, i) in self._entries if k is Kind.CHECKPOINT)
            images = sorted(
                e.manifest.ref or i for (k, i), e in self._entries.items() if k is Kind.IMAGE
            )
        return {"checkpoints": ckpts, "images": images}

    def manifest(self, kind: Kind, entry: EntryId) -> Manifest | None:
        with self._lock:
            e = self._entries.get((kind, entry))
            return e.manifest if e is not None else None

    def has(self, kind: Kind, entry: EntryId) -> bool:
        return self.manifest(kind, entry) is not None

    def data_path(self, kind: Kind, entry: EntryId) -> Path | None:
        """The entry's file, only if it is a regular file (not a symlink) inside the cache."""
        if not valid_id(entry) or self.manifest(kind, entry) is None:
            return None
        base = self.data_dir(kind)
        path = base / entry
        try:
            st = path.lstat()
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        resolved = path.resolve()
        if resolved.parent != base or not resolved.is_relative_to(self.root):
            return None
        return resolved

    def touch(self, kind: Kind, entry: EntryId) -> None:
        """Record a use (LRU); the time is persisted on the manifest's mtime now and then."""
        now = self._clock()
        with self._lock:
            e = self._entries.get((kind, entry))
            if e is None:
                return
            e.last_used = now
            if now - e.persisted < _TOUCH_PERSIST_S:
                return
            e.persisted = now
        with contextlib.suppress(OSError):
            os.utime(self._manifest_path(kind, entry), (now, now))

    # --- writing ---

    def add_file(
        self, kind: Kind, entry: EntryId, source: Path, *, ref: str | None = None
    ) -> Manifest:
        """Copy ``source`` into the cache as ``entry`` and publish it atomically."""
        if not valid_id(entry):
            raise InvalidInput(f"{entry!r} is not a valid id")
        expected = source.stat().st_size
        what = f"{kind.value}/{entry}"
        need = expected + _OVERHEAD_BYTES + _OVERHEAD_PER_PIECE * -(-expected // self.piece_size)
        self.check_size(what, expected, need)
        self.evict(incoming=expected, keep=frozenset())
        tmp = self.data_dir(kind) / f".tmp-{entry}-{secrets.token_hex(6)}"
        digests: list[str] = []
        whole = hashlib.sha256()
        size = 0
        try:
            with open(source, "rb") as src, open(tmp, "wb") as dst:
                with self._space_lock:
                    self.ensure_space(what, need)
                    if expected:
                        os.posix_fallocate(dst.fileno(), 0, expected)
                while True:
                    block = src.read(self.piece_size)
                    if not block:
                        break
                    digests.append(hashlib.sha256(block).hexdigest())
                    whole.update(block)
                    dst.write(block)
                    size += len(block)
                dst.truncate(size)  # the source may have shrunk meanwhile
                dst.flush()
                os.fsync(dst.fileno())
            manifest = Manifest(
                kind, entry, size, self.piece_size, tuple(digests), ref, whole.hexdigest()
            )
            self._publish(manifest, tmp)
        except OSError as e:
            if e.errno not in _NO_SPACE:
                raise
            free = free_bytes(self.root)
            raise _no_space(
                what, need, free, self.reserve_bytes, self.root, os.strerror(e.errno)
            ) from None
        finally:
            tmp.unlink(missing_ok=True)
        return manifest

    def _publish(self, manifest: Manifest, data: Path) -> None:
        """Rename fsynced ``data`` to the entry's final name, then write its manifest."""
        final = self.data_dir(manifest.kind) / manifest.id
        os.replace(data, final)
        try:
            fsync_dir(final.parent)
            write_atomically(
                self._manifest_path(manifest.kind, manifest.id),
                json.dumps(manifest.to_json()).encode(),
            )
        except OSError:
            final.unlink(missing_ok=True)  # data without a manifest: no entry, and never freed
            raise
        now = self._clock()
        with self._lock:
            self._entries[(manifest.kind, manifest.id)] = _Entry(manifest, now, now)
        self.evict(keep=frozenset({(manifest.kind, manifest.id)}))

    def adopt(self, manifest: Manifest, path: Path) -> None:
        """Take ``path`` (a complete, fsynced file in the entry's data directory, under a
        temporary name) as the entry described by ``manifest``, without hashing it again."""
        if not valid_id(manifest.id):
            raise InvalidInput(f"{manifest.id!r} is not a valid id")
        if path.parent != self.data_dir(manifest.kind) or not path.name.startswith(".tmp-"):
            raise InvalidInput("adopt takes a .tmp- file in the entry's data directory")
        if path.stat().st_size != manifest.size:
            raise InvalidInput(f"{path.name}: size differs from the manifest's {manifest.size}")
        self._publish(manifest, path)

    def temp_path(self, kind: Kind, entry: EntryId) -> Path:
        """A fresh temporary name in ``kind``'s data directory (for :meth:`adopt`)."""
        return self.data_dir(kind) / f".tmp-{entry}-{secrets.token_hex(6)}"

    def remove(self, kind: Kind, entry: EntryId) -> None:
        with self._lock:
            self._entries.pop((kind, entry), None)
        self._delete_files(kind, entry)

    def _delete_files(self, kind: Kind, entry: EntryId) -> None:
        """Outside the lock: unlinking a large file can take seconds, and the server reads
        under the lock on its event loop."""
        # Manifest first: an entry is never listed without its data.
        self._manifest_path(kind, entry).unlink(missing_ok=True)
        (self.data_dir(kind) / entry).unlink(missing_ok=True)

    def _detach_partial(self, partial: _PartialFiles) -> list[Path]:
        """Under the lock: move a partial pull's files out of the way (renames are quick), so
        that a pull of the same entry begun next starts afresh rather than resuming into files
        being deleted. The caller unlinks what is returned, outside the lock; a crash before
        that leaves ``.tmp-`` files, which the next start clears."""
        base = self.data_dir(partial.kind)
        moved: list[Path] = []
        for name in partial.names():
            tmp = base / f".tmp-drop-{secrets.token_hex(8)}"
            with contextlib.suppress(OSError):
                os.replace(base / name, tmp)
                moved.append(tmp)
        return moved

    def evict(
        self,
        *,
        incoming: int = 0,
        keep: frozenset[tuple[Kind, EntryId]] = frozenset(),
        free: int = 0,
    ) -> tuple[EntryUse, ...]:
        """Make the cache (plus ``incoming``) fit: drop abandoned partial pulls (those no pull in
        this process is working on), least recent progress first, then evict least recently
        used entries. Partials being pulled are neither counted nor dropped (a starting pull's
        own bytes are ``incoming``). ``free``: also free at least this many bytes (for the
        filesystem's reserve), in the same order. Returns the evicted entries."""
        with self._lock:
            abandoned = {
                (p.kind, p.id): p
                for kind in Kind
                for p in self._scan_partials(kind)
                if not self._in_pull(p)
            }
            uses = [p.use() for p in abandoned.values()]
            entries = self.entries()
            bound = self.max_bytes
            if free > 0:
                held = sum(e.size for e in entries) + sum(p.size for p in uses)
                bound = min(bound, disk_bound(held=held, incoming=incoming, shortfall=free))
            room = choose_room(entries, uses, max_bytes=bound, incoming=incoming, keep=keep)
            victims = room.entries
            for v in victims:
                self._entries.pop((v.kind, v.id), None)
            dropped = [(d, self._detach_partial(abandoned[(d.kind, d.id)])) for d in room.partials]
        for d, paths in dropped:
            log.info(
                "cache: dropping abandoned partial pull %s/%s (%d bytes) to make room",
                d.kind.value,
                d.id,
                d.size,
            )
            for path in paths:
                path.unlink(missing_ok=True)
        for v in victims:
            log.info("cache: evicting %s/%s (%d bytes)", v.kind.value, v.id, v.size)
            self._delete_files(v.kind, v.id)
        return victims

    def evictable(self, keep: frozenset[tuple[Kind, EntryId]] = frozenset()) -> int:
        """Bytes that evicting every entry but ``keep`` and every abandoned partial would free."""
        with self._lock:
            partials = sum(
                p.use().size
                for kind in Kind
                for p in self._scan_partials(kind)
                if not self._in_pull(p)
            )
            return partials + sum(e.size for e in self.entries() if (e.kind, e.id) not in keep)

    def check_size(
        self, what: str, size: int, need: int, keep: frozenset[tuple[Kind, EntryId]] = frozenset()
    ) -> None:
        """Refuse (:class:`TooLarge`) an entry of ``size`` bytes, ``need`` on disk, that the cache
        could not take even by evicting everything it may; checked before anything is evicted
        for it."""
        reason = size_refusal(
            size=size, max_bytes=self.max_bytes, max_entry_bytes=self.max_entry_bytes
        )
        if reason is not None:
            log.warning("cache: refusing %s: %s; nothing evicted", what, reason)
            raise TooLarge(f"{what} {reason}; nothing evicted")
        free = free_bytes(self.root)
        short = disk_shortfall(free=free, need=need, reserve=self.reserve_bytes)
        if short > 0 and self.evictable(keep) < short:
            raise TooLarge(
                str(
                    _no_space(
                        what,
                        need,
                        free,
                        self.reserve_bytes,
                        self.root,
                        "evicting what the cache may evict would not make room; nothing evicted",
                    )
                )
            )

    def ensure_space(
        self, what: str, need: int, keep: frozenset[tuple[Kind, EntryId]] = frozenset()
    ) -> None:
        """Make ``need`` bytes fit on the filesystem with ``reserve_bytes`` left free: evict
        (abandoned partials, then least recently used entries) when that frees enough, else
        evict nothing and raise :class:`NoSpace`. Callers hold ``_space_lock``."""
        free = free_bytes(self.root)
        for _ in range(4):  # files free about their size; a hard-linked or sparse one less
            short = disk_shortfall(free=free, need=need, reserve=self.reserve_bytes)
            if short <= 0:
                return
            if self.evictable(keep) < short:
                break
            self.evict(keep=keep, free=short)
            before, free = free, free_bytes(self.root)
            if free <= before:
                break
        raise _no_space(
            what,
            need,
            free,
            self.reserve_bytes,
            self.root,
            "evicting what the cache may evict would not make room",
        )

    # --- pulls ---

    def begin_pull(self, manifest: Manifest) -> PartialPull:
        """Start or resume pulling ``manifest``'s entry; makes room for it first (the size
        bound, then the filesystem's reserve: :class:`NoSpace` when it cannot). The size the
        manifest claims is checked first (:class:`TooLarge`): nothing is evicted for a claim
        the cache could never take."""
        key = (manifest.kind, manifest.id)
        with self._lock:
            if key in self._pulling:
                raise InvalidInput(f"{manifest.kind.value}/{manifest.id} is already being pulled")
            self._pulling.add(key)
        try:
            what = f"{manifest.kind.value}/{manifest.id}"
            # A partial of this entry is resumed or replaced: its blocks count as free.
            held = 0
            with contextlib.suppress(OSError):
                partial = self.data_dir(manifest.kind) / f"{_PARTIAL}{manifest.id}"
                held = partial.stat().st_blocks * 512
            need = manifest.size + overhead_bytes(manifest)
            self.check_size(what, manifest.size, max(0, need - held))
            self.evict(incoming=manifest.size)
            return PartialPull(self, manifest)
        except BaseException:
            with self._lock:
                self._pulling.discard(key)
            raise

    def _end_pull(self, manifest: Manifest) -> None:
        with self._lock:
            self._pulling.discard((manifest.kind, manifest.id))


class PartialPull:
    """A pull in progress: verified pieces are written in place and logged once durable, so an
    interrupted pull resumes with every piece it had verified.

    Its file is allocated at full size before any piece arrives. When the disk runs out (the
    reserve is found breached before a piece, or a write fails with ``ENOSPC``) its files are
    deleted and every later call raises the same :class:`NoSpace`; the descriptor stays open
    until :meth:`close`, so that writes still in flight in other threads never reach a reused
    descriptor."""

    def __init__(self, store: CacheStore, manifest: Manifest) -> None:
        self.store = store
        self.manifest = manifest
        self.what = f"{manifest.kind.value}/{manifest.id}"
        base = store.data_dir(manifest.kind)
        self.path = base / f".partial-{manifest.id}"
        self.log_path = base / f".partial-{manifest.id}.log"
        self.manifest_path = base / f".partial-{manifest.id}.json"
        self.done: set[int] = set()
        self.failed: NoSpace | None = None
        self._fail_lock = threading.Lock()
        self._closed = False
        self._ended = False
        pinned = json.dumps(manifest.to_json(), sort_keys=True).encode()
        resumable = False
        with contextlib.suppress(OSError):
            resumable = (
                self.manifest_path.read_bytes() == pinned
                and self.path.stat().st_size == manifest.size
            )
        if not resumable:
            for p in (self.path, self.log_path, self.manifest_path):
                p.unlink(missing_ok=True)
        self._fd = -1
        self._log: TextIO | None = None
        need = manifest.size + overhead_bytes(manifest)
        try:
            with store._space_lock:
                allocated = self.path.stat().st_blocks * 512 if resumable else 0
                need = max(0, manifest.size - allocated) + overhead_bytes(manifest)
                store.ensure_space(self.what, need)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                if manifest.size:
                    os.posix_fallocate(self._fd, 0, manifest.size)
            if resumable:
                self.done = self._read_log()
            else:
                write_atomically(self.manifest_path, pinned)
            self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in close()
        except OSError as e:
            if e.errno not in _NO_SPACE:
                self._close_files()
                raise
            failed = self._fail(need, f"{os.strerror(e.errno)} allocating the file")
            self._close_files()
            raise failed from None
        except NoSpace:
            self._close_files()
            raise

    def _read_log(self) -> set[int]:
        done: set[int] = set()
        count = piece_count(self.manifest.size, self.manifest.piece_size)
        with contextlib.suppress(FileNotFoundError), open(self.log_path) as f:
            for line in f:
                if line.endswith("\n") and line[:-1].isdigit() and int(line) < count:
                    done.add(int(line))
        return done

    @property
    def missing(self) -> list[int]:
        count = piece_count(self.manifest.size, self.manifest.piece_size)
        return [i for i in range(count) if i not in self.done]

    def _left(self) -> int:
        """Bytes still to write (what the pull needs)."""
        return sum(self.manifest.piece_span(i)[1] for i in self.missing)

    def _fail(self, need: int, detail: str) -> NoSpace:
        """Delete the partial pull's files (once) and return the error every later call
        raises."""
        with self._fail_lock:
            if self.failed is None:
                for p in (self.path, self.log_path, self.manifest_path):
                    with contextlib.suppress(OSError):
                        p.unlink(missing_ok=True)
                store = self.store
                self.failed = _no_space(
                    self.what,
                    need,
                    free_bytes(store.root),
                    store.reserve_bytes,
                    store.root,
                    f"{detail}; partial pull dropped",
                )
                log.error("cache: %s", self.failed)
            return self.failed

    def _check_reserve(self) -> None:
        if self.failed is not None:
            raise self.failed
        free = free_bytes(self.store.root)
        if free < self.store.reserve_bytes:
            raise self._fail(self._left(), "the reserve was breached during the pull")

    def write_piece(self, index: int, data: bytes | memoryview) -> bool:
        """Verify a piece's sha256 and write it in place; False (nothing written) on mismatch.
        Checks the filesystem's reserve first (:class:`NoSpace`). Blocking: hashing and writing
        are meant to run in a thread."""
        offset, length = self.manifest.piece_span(index)
        if len(data) != length or hashlib.sha256(data).hexdigest() != self.manifest.pieces[index]:
            return False
        self._check_reserve()
        view = memoryview(data)
        try:
            while view:
                written = os.pwrite(self._fd, view, offset)
                view, offset = view[written:], offset + written
        except OSError as e:
            if e.errno not in _NO_SPACE:
                raise
            raise self._fail(
                self._left(), f"{os.strerror(e.errno)} writing piece {index}"
            ) from None
        return True

    def record(self, indices: Iterable[int]) -> None:
        """Make written pieces durable, then log them as done (what a resume keeps)."""
        fresh = [i for i in indices if i not in self.done]
        if not fresh:
            return
        if self.failed is not None:
            raise self.failed
        assert self._log is not None
        try:
            os.fdatasync(self._fd)
            self._log.write("".join(f"{i}\n" for i in fresh))
            self._log.flush()
            os.fsync(self._log.fileno())
        except OSError as e:
            if e.errno not in _NO_SPACE:
                raise
            raise self._fail(self._left(), f"{os.strerror(e.errno)} logging pieces") from None
        self.done.update(fresh)

    def content_digest(self) -> str:
        """The sha256 of the whole file as written. Blocking."""
        whole = hashlib.sha256()
        offset = 0
        while offset < self.manifest.size:
            block = os.pread(self._fd, min(_COPY_CHUNK * 8, self.manifest.size - offset), offset)
            if not block:
                break
            whole.update(block)
            offset += len(block)
        return whole.hexdigest()

    def commit(self) -> Manifest:
        """Check the whole file against the manifest's sha256 (:class:`ContentMismatch`, and
        the partial dropped, when it differs) and publish it atomically under its final name,
        with its manifest (the sha256 filled in when the manifest had none)."""
        if self.failed is not None:
            raise self.failed
        if self.missing:
            raise InvalidInput(f"{len(self.missing)} pieces still missing")
        try:
            os.fsync(self._fd)
        except OSError as e:
            if e.errno not in _NO_SPACE:
                raise
            raise self._fail(0, f"{os.strerror(e.errno)} syncing the file") from None
        digest = self.content_digest()
        claimed = self.manifest.sha256
        if claimed is not None and digest != claimed:
            self.drop()
            raise ContentMismatch(
                f"{self.what}: the pulled file's sha256 is {digest}, not the manifest's "
                f"{claimed}: its pieces were verified against a forged manifest; dropped"
            )
        manifest = (
            self.manifest
            if claimed is not None
            else dataclasses.replace(self.manifest, sha256=digest)
        )
        self._close_files()
        try:
            # Still marked as being pulled until published, so that an eviction meanwhile does
            # not take the finished file for an abandoned partial.
            try:
                self.store._publish(manifest, self.path)
            except OSError as e:
                if e.errno not in _NO_SPACE:
                    raise
                raise self._fail(0, f"{os.strerror(e.errno)} publishing") from None
            for p in (self.log_path, self.manifest_path):
                p.unlink(missing_ok=True)
        finally:
            self._end()
        return manifest

    def drop(self) -> None:
        """Stop and delete the partial pull's files (nothing in them is worth a resume)."""
        for p in (self.path, self.log_path, self.manifest_path):
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        """Stop (keeping what was verified, for a resume, unless the disk ran out)."""
        self._close_files()
        self._end()

    def _close_files(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fd >= 0:
            os.close(self._fd)
        if self._log is not None:
            with contextlib.suppress(OSError):  # its last bytes are fsynced or not wanted
                self._log.close()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self.store._end_pull(self.manifest)

    def status(self) -> dict[str, Any]:
        return {"done": len(self.done), "missing": len(self.missing)}
