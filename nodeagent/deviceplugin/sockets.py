"""gRPC servers on the kubelet's unix sockets, shared by the device plugin and the DRA plugin.

A socket file is known by its (st_dev, st_ino): the kubelet deletes the sockets in its plugin
dirs when it starts, and a plugin must tell its own socket from a new one at the same path, and
remove only its own on the way out.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

FileId = tuple[int, int]  # (st_dev, st_ino): which socket file is ours


def file_id(path: Path) -> FileId | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def is_ours(path: Path, ours: FileId) -> bool:
    return file_id(path) == ours


def remove_if_ours(path: Path, ours: FileId | None) -> None:
    if ours is not None and file_id(path) == ours:
        try:
            path.unlink()
        except OSError as e:
            log.warning("could not remove socket %s: %s", path, e)


def _clear_stale(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a socket left by an earlier run


async def start_unix_server(
    path: Path,
    add: Callable[[grpc.aio.Server], None],
    *,
    options: Sequence[tuple[str, int]] = (),
    maximum_concurrent_rpcs: int | None = None,
    mode: int | None = None,
) -> tuple[grpc.aio.Server, FileId]:
    """A started gRPC server on ``path`` with the services ``add`` puts on it; a stale socket
    there (an earlier run's) is removed first, and the new one gets ``mode`` if given. Raises
    OSError or RuntimeError when it cannot bind."""
    await asyncio.to_thread(_clear_stale, path)
    server = grpc.aio.server(options=list(options), maximum_concurrent_rpcs=maximum_concurrent_rpcs)
    add(server)
    try:
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        if mode is not None:
            os.chmod(path, mode)
        ours = file_id(path)
        if ours is None:
            raise RuntimeError(f"the server is up but {path} does not exist")
    except BaseException:
        await server.stop(None)
        raise
    log.info("serving on %s", path)
    return server, ours
