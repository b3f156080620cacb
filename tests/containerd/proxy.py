"""A unix-socket proxy in front of containerd's CRI socket that a test can pull away mid-way:
:meth:`SocketProxy.cut` closes the listening socket, removes its file and drops every open
connection, as a runtime that went away would."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path


class SocketProxy:
    def __init__(self, upstream: str, path: Path) -> None:
        self.upstream, self.path = upstream, path
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        self._writers.update((writer, up_writer))
        pipes = {
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        }
        self._pipes.update(pipes)
        await asyncio.gather(*pipes, return_exceptions=True)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.path.unlink(missing_ok=True)
        for writer in self._writers:
            with contextlib.suppress(OSError):
                writer.close()
        for task in self._pipes:
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        self._pipes.clear()
        self._writers.clear()
