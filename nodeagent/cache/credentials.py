"""The token an agent presents to its peers' caches: its pod's projected ServiceAccount token
for the cache's audience (``tidelease-peer-cache``), which the kubelet writes into a projected
volume and rotates before it expires (docs/peer-cache.md, Identity).

The file is re-read whenever it changes (another inode, modification time or size: the kubelet
swaps a projected volume's files atomically), so each request carries the current token. An
empty, short or unreadable file gives an empty token, which no peer accepts. Serving checks
tokens elsewhere (``peerauth``): nothing here is a shared secret.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

MIN_TOKEN_LENGTH = 16


class TokenFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._token: bytes = b""

    def token(self) -> bytes:
        try:
            st = os.stat(self.path)
        except OSError as e:
            log.error("cache token %s unreadable: %s; peers will refuse this agent", self.path, e)
            return b""
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if seen != self._seen:
                try:
                    token = self.path.read_bytes().strip()
                except OSError:
                    token = b""
                if len(token) < MIN_TOKEN_LENGTH:
                    log.error(
                        "cache token %s is shorter than %d bytes; peers will refuse this agent",
                        self.path,
                        MIN_TOKEN_LENGTH,
                    )
                    token = b""
                self._token, self._seen = token, seen
            return self._token

    def header(self) -> dict[str, str]:
        """The Authorization header a client sends."""
        return {"Authorization": "Bearer " + self.token().decode()}
