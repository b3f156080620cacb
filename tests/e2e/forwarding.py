"""A TCP forwarder from an address pods can reach (their bridge's gateway) to the API server on
loopback: the local cluster has no kube-proxy, so the `kubernetes` Service leads nowhere, and
the API server listens on 127.0.0.1 only. Bytes pass through untouched (TLS end to end)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def forwarding(listen_host: str, target: tuple[str, int]) -> Iterator[int]:
    """Forward connections to ``listen_host`` (a free port, yielded) to ``target`` until the
    block exits; then stop listening and close what is open."""
    open_sockets: set[socket.socket] = set()
    lock = threading.Lock()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            client: socket.socket = self.request
            try:
                upstream = socket.create_connection(target, timeout=10)
            except OSError:
                return
            upstream.settimeout(None)
            with lock:
                open_sockets.update((client, upstream))
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join()
            with lock:
                open_sockets.difference_update((client, upstream))
            upstream.close()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    with Server((listen_host, 0), Handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()
            with lock:
                for s in open_sockets:
                    with contextlib.suppress(OSError):
                        s.close()
            thread.join(timeout=5)
