"""What may name a cache entry. Pure.

An id is the only part of a request that becomes a file name, so it is held to a strict pattern:
lowercase letters, digits, ``.``, ``_`` and ``-``, starting and ending with a letter or digit, at
most 253 characters (the GpuNode schema's limit for checkpoint ids), and no ``..``. Nothing that
passes can be a path separator, a dot file (temporary and partial files start with a dot) or a
parent reference; the store still resolves and checks containment on top of this.
"""

from __future__ import annotations

import enum
import hashlib
import re
from typing import Final, NewType

EntryId = NewType("EntryId", str)

MAX_ID_LENGTH: Final = 253
_REF_HASH: Final = 10  # hex digits of sha256(reference) in an unpinned image id
_ID = re.compile(r"[a-z0-9](?:[a-z0-9._-]{0,251}[a-z0-9])?")


class Kind(enum.Enum):
    """What a cache entry is; the value is its directory and its URL segment."""

    CHECKPOINT = "checkpoints"
    IMAGE = "images"


KINDS: Final = {k.value: k for k in Kind}


def valid_id(value: str) -> bool:
    return (
        len(value) <= MAX_ID_LENGTH
        and _ID.fullmatch(value) is not None
        and ".." not in value
        and value.isascii()
    )


def parse_id(value: str) -> EntryId | None:
    """The id, or None when ``value`` may not name an entry."""
    return EntryId(value) if valid_id(value) else None


def image_id(ref: str) -> EntryId:
    """A file-safe id for an image reference: its digest when pinned, else a readable slug
    with a short hash of the whole reference (the slug alone is lossy: ``reg/app:1`` and
    ``reg-app:1``, or tags differing in case, would share an entry).

    ``registry/app@sha256:ab..`` -> ``sha256-ab..``;
    ``registry/app:1.2`` -> ``registry-app-1.2-<10 hex digits>``.
    """
    if "@sha256:" in ref:
        digest = ref.rsplit("@sha256:", 1)[1].lower()
        candidate = f"sha256-{digest}"
        if valid_id(candidate):
            return EntryId(candidate)
    tag = hashlib.sha256(ref.encode()).hexdigest()[:_REF_HASH]
    slug = re.sub(r"[^a-z0-9._-]+", "-", ref.lower()).strip("-._")
    slug = re.sub(r"\.{2,}", ".", slug)[: MAX_ID_LENGTH - _REF_HASH - 1].rstrip("-._")
    return EntryId(f"{slug}-{tag}" if slug else f"image-{tag}")
