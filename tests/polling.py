"""Waiting for something to become true, with a deadline: no fixed sleeps in tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, within_s: float, every_s: float = 0.1
) -> T:
    """The first truthy result of ``probe()``; fails the test after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    last: T | None = None
    for _ in range(1_000_000):
        last = await probe()
        if last:
            return last
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(every_s)
    raise AssertionError(f"not true within {within_s} s (last: {last!r})")
