"""The bearer token peers present, read from a file (a Secret mounted into the agent's pod).

The file is re-read when its modification time changes, so a rotated Secret takes effect
without a restart (the kubelet updates mounted Secrets in place). An empty or unreadable file
admits nobody: the cache is never served without a credential.
"""

from __future__ import annotations

import hmac
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
        self._mtime: float | None = None
        self._token: bytes = b""

    def token(self) -> bytes:
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError as e:
            log.error("cache token %s unreadable: %s; refusing all requests", self.path, e)
            return b""
        with self._lock:
            if mtime != self._mtime:
                try:
                    token = self.path.read_bytes().strip()
                except OSError:
                    token = b""
                if len(token) < MIN_TOKEN_LENGTH:
                    log.error(
                        "cache token %s is shorter than %d bytes; refusing all requests",
                        self.path,
                        MIN_TOKEN_LENGTH,
                    )
                    token = b""
                self._token, self._mtime = token, mtime
            return self._token

    def header(self) -> dict[str, str]:
        """The Authorization header a client sends."""
        return {"Authorization": "Bearer " + self.token().decode()}


def authorized(header: str | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header carries ``token``; constant time in the token."""
    if not token or header is None:
        return False
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token)
