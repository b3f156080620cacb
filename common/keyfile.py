"""A secret key read from a file (a Secret mounted into tidelease's pods): the queues' release
key (common/queuerelease.py). The Secret is made in the cluster, by :func:`make_key_secret`,
not at render time: `helm template` stays the same from render to render.

The file is read again when it changes (the kubelet swaps a mounted Secret's files in place), so
a rotated key takes effect without a restart. A read that fails, or finds a key shorter than
:data:`MIN_KEY_LENGTH`, keeps the key read last; with none read yet the key is empty, which
:func:`common.queuerelease.release_problem` takes as "refuse": a key that is configured but
unreadable never lets a pod past the queues.
"""

from __future__ import annotations

import base64
import functools
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Final

from common.errors import Conflict
from common.kubeclient import KubeClient

log = logging.getLogger(__name__)

MIN_KEY_LENGTH: Final = 32


class KeyFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._key = b""
        self._problem = ""  # the last one logged (each is logged once, not on every read)

    def key(self) -> bytes:
        """The key, its surrounding white space stripped; b"" while none could be read."""
        try:
            st = os.stat(self.path)  # follows the symlink: the file now behind it
        except OSError as e:
            self._unreadable(str(e))
            return self._key
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if seen != self._seen:
                self._seen = seen
                try:
                    key = self.path.read_bytes().strip()
                except OSError as e:
                    self._unreadable(str(e))
                    return self._key
                if len(key) < MIN_KEY_LENGTH:
                    self._unreadable(f"shorter than {MIN_KEY_LENGTH} bytes")
                else:
                    self._key, self._problem = key, ""
            return self._key

    def _unreadable(self, why: str) -> None:
        if why == self._problem:
            return
        self._problem = why
        kept = "keeping the key read before" if self._key else "no key: every pod waits"
        log.error("key file %s unreadable (%s); %s", self.path, why, kept)


@functools.cache
def key_file(path: Path) -> KeyFile:
    """The one reader of ``path`` in this process (its last good key is shared)."""
    return KeyFile(path)


async def make_key_secret(kube: KubeClient, namespace: str, name: str) -> bool:
    """Make the Secret ``namespace/name`` holding a new random key (``key``), unless it exists;
    whether this call made it. Only ever created, never read or replaced: the RBAC it needs
    is ``create secrets`` in its namespace, and a key in use is never changed under its
    readers."""
    key = base64.b64encode(secrets.token_bytes(48)).decode()
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "tidelease"},
        },
        "type": "Opaque",
        "data": {"key": base64.b64encode(key.encode()).decode()},
    }
    try:
        await kube.json("POST", f"/api/v1/namespaces/{namespace}/secrets", body=body)
    except Conflict:
        return False
    log.info("made the Secret %s/%s (a new key)", namespace, name)
    return True
