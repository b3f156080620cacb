"""A free TCP port on loopback, for a server a test starts (the kernel's pick, released at once:
another process could take it first, which the tests accept)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
