"""A checkpoint as pod authors name it in ``tidelease.io/checkpoint``: ``ID``, or
``ID@sha256:HEX`` to pin its content. The id names the entry in the nodes' caches (what cache
locality compares); the digest is what a node pulling it from its peers checks the bytes
against: peers are not trusted for content (docs/peer-cache.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIGEST = re.compile(r"[0-9a-f]{64}")
_PIN = "sha256:"


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    id: str
    sha256: str | None = None  # hex, lower case

    def __str__(self) -> str:
        return self.id if self.sha256 is None else f"{self.id}@{_PIN}{self.sha256}"


def parse_checkpoint_ref(text: str) -> CheckpointRef | None:
    """The reference, or None when a pin is there but is not ``sha256:`` and 64 hex digits.
    (Whether the id may name a cache entry is the cache's to say.)"""
    ident, at, pin = text.partition("@")
    if not ident:
        return None
    if not at:
        return CheckpointRef(ident)
    digest = pin.removeprefix(_PIN).lower()
    if not pin.startswith(_PIN) or not _DIGEST.fullmatch(digest):
        return None
    return CheckpointRef(ident, digest)
