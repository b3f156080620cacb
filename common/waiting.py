"""Waiting for an event with a timeout, without losing a cancellation.

Python 3.11's ``asyncio.wait_for`` can swallow the cancellation of the task that awaits it when
the inner wait completes at the same moment; a loop built on it may then never stop, and
whoever cancels it waits forever. ``asyncio.wait`` has no such race.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, within_s: float) -> bool:
    """Wait until ``event`` is set or ``within_s`` seconds pass; whether it was set."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=within_s)
    finally:
        waiter.cancel()
    return event.is_set()
