"""One exception hierarchy for tidelease.

``InvalidInput`` is the caller's fault and becomes a protocol error or a 4xx; ``Conflict`` and
``Unavailable`` are worth retrying; everything else reaching a handler is a bug.
"""

from __future__ import annotations


class TideleaseError(Exception):
    """Base class of every error tidelease raises on purpose."""


class InvalidInput(TideleaseError):
    """Input that can never succeed as sent: a malformed request or an invalid annotation.

    ``problems`` lists every problem found, so one reply tells the caller all of them.
    """

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class NotPermitted(InvalidInput):
    """A request tidelease refuses whoever retries it, until an admin or a controller changes
    something: a privilege the pod's namespace was not granted, a pod the queues have not
    released yet."""


class NotFound(TideleaseError):
    """An object the request names does not exist (unknown pod, node without inventory)."""


class Conflict(TideleaseError):
    """An optimistic-concurrency write lost a race; re-read and try again."""


class Unavailable(TideleaseError):
    """A dependency (the API server) failed in a way that may pass; retry later."""


class TooManyRequests(Unavailable):
    """HTTP 429: the API server asks to wait (its rate limits, API Priority and Fairness), or
    refuses an eviction that a PodDisruptionBudget does not allow now. Only the second names the
    budget among the Status's causes (``details.causes[].reason: DisruptionBudget``):
    ``disruption_budget`` tells them apart. ``retry_after_s``: what the API server suggested
    (``details.retryAfterSeconds``), if anything."""

    def __init__(
        self, message: str, *, retry_after_s: float | None = None, disruption_budget: bool = False
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.disruption_budget = disruption_budget
