"""A TCP forwarder: from an address pods can reach (their bridge's gateway) to the API server on
loopback (the local cluster has no kube-proxy, so the `kubernetes` Service leads nowhere, and
the API server listens on 127.0.0.1 only), or between two processes a test wants to part
(``Forwarder.cut``) or to trouble (the soak's network faults: ``Forwarder.delay_s`` holds every
chunk back, ``Forwarder.drop_replies`` lets requests through and drops what comes back, closing
the connection on the first reply). Bytes pass through untouched (TLS end to end)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


def _pipe(src: socket.socket, dst: socket.socket, faults: Forwarder, reply: bool) -> None:
    """Copy ``src`` to ``dst`` until EOF (``reply``: this is the upstream's side)."""
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            if faults.delay_s > 0:
                time.sleep(faults.delay_s)
            if reply and faults.drop_replies:
                faults.dropped += 1
                for s in (src, dst):  # the request was served; its reply is lost
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                return
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


@dataclass
class Forwarder:
    port: int = 0  # where it listens
    accepted: int = 0  # connections forwarded so far
    delay_s: float = 0.0  # each chunk held back this long, both ways
    drop_replies: bool = False  # replies dropped (and their connections closed)
    dropped: int = 0  # replies dropped so far
    _open: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def cut(self) -> int:
        """Close every connection open now (the client must open new ones); how many."""
        with self._lock:
            sockets = list(self._open)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        return len(sockets) // 2


@contextlib.contextmanager
def forwarding(
    listen_host: str, target: tuple[str, int] | Callable[[], tuple[str, int] | None]
) -> Iterator[Forwarder]:
    """Forward connections to ``listen_host`` (on a free port: ``Forwarder.port``) to ``target``
    until the block exits; then stop listening and close what is open. ``target`` may be a
    function asked at each connection (as kube-proxy picks one of a Service's endpoints); a
    connection it answers None for is closed."""
    forwarder = Forwarder()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            client: socket.socket = self.request
            to = target() if callable(target) else target
            if to is None:
                return
            try:
                upstream = socket.create_connection(to, timeout=10)
            except OSError:
                return
            upstream.settimeout(None)
            with forwarder._lock:
                forwarder._open.update((client, upstream))
                forwarder.accepted += 1
            back = threading.Thread(
                target=_pipe, args=(upstream, client, forwarder, True), daemon=True
            )
            back.start()
            _pipe(client, upstream, forwarder, False)
            back.join()
            with forwarder._lock:
                forwarder._open.difference_update((client, upstream))
            upstream.close()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    with Server((listen_host, 0), Handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        forwarder.port = server.server_address[1]
        try:
            yield forwarder
        finally:
            server.shutdown()
            forwarder.cut()
            thread.join(timeout=5)
