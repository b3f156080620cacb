"""A watched view for tests: :class:`FixedView`, there and synced whether wanted or not, and
watched by nobody, over a cluster state the test fills itself. Production code does not import
this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from extender.cluster.state import ClusterState
from extender.cluster.watching import ClaimCache, PodCache


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


@dataclass
class FixedView:
    """A view that is there and synced whether wanted or not, and watched by nobody: for
    whoever fills the cluster state itself (tests)."""

    cluster: ClusterState
    pods: PodCache = field(default_factory=PodCache)
    claims: ClaimCache = field(default_factory=ClaimCache)
    on_pod: Callable[[dict[str, Any]], None] | None = None
    synced: asyncio.Event = field(default_factory=_set_event)
    active: bool = True

    def want(self, wanted: bool, why: str) -> None:
        """Nothing to start or stop."""
