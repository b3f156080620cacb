"""Waiting for an event, with a timeout or against background tasks, without losing a
cancellation.

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


async def first_of(event: asyncio.Event, tasks: tuple[asyncio.Task[None], ...]) -> None:
    """Wait for the event; raise if a background task ends first (it never should)."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter, *tasks), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    for task in tasks:
        if task.done():
            task.result()  # re-raises its exception
            raise RuntimeError(f"{task.get_name()} ended unexpectedly")
