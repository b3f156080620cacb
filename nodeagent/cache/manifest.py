"""An entry's manifest: its size, the sha256 of every piece and of the whole content. Pure.

A piece is the unit of verification: the file cut into ``piece_size`` bytes (the last piece may
be shorter). A puller's shard (the unit of transfer and assignment) is a run of whole pieces, so
it can verify each piece as it arrives and keep every verified piece across an interruption.

``sha256`` is the whole content's digest (what ``sha256sum`` prints): the name a caller who
knows the content pins a pull to. A peer's manifest is only a claim; the puller checks the claim
against the digest it was given and the assembled file against the claim (docs/peer-cache.md).
Entries stored before the field existed have none (``None``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from common.coercion import whole
from common.errors import InvalidInput
from nodeagent.cache.naming import KINDS, EntryId, Kind, parse_id

DEFAULT_PIECE_SIZE: Final = 4 << 20  # 4 MiB
MIN_PIECE_SIZE: Final = 4 << 10
MAX_PIECE_SIZE: Final = 1 << 30
_SHA256 = re.compile(r"[0-9a-f]{64}")


def piece_count(size: int, piece_size: int) -> int:
    return -(-size // piece_size)


@dataclass(frozen=True, slots=True)
class Manifest:
    kind: Kind
    id: EntryId
    size: int
    piece_size: int
    pieces: tuple[str, ...]  # sha256 hex per piece
    ref: str | None = None  # an image's reference
    sha256: str | None = None  # the whole content's sha256 hex; None in older manifests

    def piece_span(self, index: int) -> tuple[int, int]:
        """(offset, length) of piece ``index``."""
        start = index * self.piece_size
        return start, min(self.piece_size, self.size - start)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind.value,
            "id": self.id,
            "size": self.size,
            "pieceSize": self.piece_size,
            "pieces": list(self.pieces),
        }
        if self.ref is not None:
            out["ref"] = self.ref
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out


def valid_digest(value: str) -> bool:
    """Whether ``value`` is a sha256 as manifests write it: 64 lowercase hex digits."""
    return _SHA256.fullmatch(value) is not None


def parse_manifest(raw: Any) -> Manifest:
    """A manifest from its JSON form; :class:`InvalidInput` listing every problem."""
    if not isinstance(raw, Mapping):
        raise InvalidInput("manifest must be an object")
    problems: list[str] = []
    raw_kind = raw.get("kind")
    kind = KINDS.get(raw_kind) if isinstance(raw_kind, str) else None
    if kind is None:
        problems.append(f"kind must be one of {', '.join(KINDS)}")
    entry = parse_id(raw["id"]) if isinstance(raw.get("id"), str) else None
    if entry is None:
        problems.append("id is missing or not a valid id")
    size, piece_size = raw.get("size"), raw.get("pieceSize")
    if not whole(size) or size < 0:
        problems.append("size must be a non-negative integer")
        size = None
    if not whole(piece_size) or not MIN_PIECE_SIZE <= piece_size <= MAX_PIECE_SIZE:
        problems.append(f"pieceSize must be an integer in [{MIN_PIECE_SIZE}, {MAX_PIECE_SIZE}]")
        piece_size = None
    pieces = raw.get("pieces")
    if not isinstance(pieces, list) or not all(
        isinstance(p, str) and _SHA256.fullmatch(p) for p in pieces
    ):
        problems.append("pieces must be a list of lowercase sha256 hex digests")
        pieces = None
    elif (
        size is not None and piece_size is not None and len(pieces) != piece_count(size, piece_size)
    ):
        problems.append(
            f"{len(pieces)} pieces for {size} bytes in pieces of {piece_size}; "
            f"want {piece_count(size, piece_size)}"
        )
    ref = raw.get("ref")
    if ref is not None and (not isinstance(ref, str) or not 0 < len(ref) <= 512):
        problems.append("ref must be a string of 1-512 characters")
    digest = raw.get("sha256")
    if digest is not None and (not isinstance(digest, str) or not valid_digest(digest)):
        problems.append("sha256 must be a lowercase sha256 hex digest")
    if problems:
        raise InvalidInput(problems)
    if kind is None or entry is None or size is None or piece_size is None or pieces is None:
        raise InvalidInput("manifest is incomplete")  # unreachable: each None added a problem
    return Manifest(kind, entry, size, piece_size, tuple(pieces), ref, digest)
