"""Run several simulations, in worker processes when more than one core is asked for.

Every run is deterministic in its scenario and settings, so the results are the same however
many workers run them; only the wall time differs. Workers are started with ``spawn`` (no state
inherited from the parent).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor

from extender.simulation.scenario import Scenario
from extender.simulation.simulating import RunResult, SimSettings, simulate


class Runner:
    """Runs simulations of one scenario; ``jobs`` > 1 uses that many worker processes."""

    def __init__(self, scenario: Scenario, jobs: int = 1) -> None:
        self.scenario = scenario
        self.jobs = max(1, jobs)
        self._pool: Executor | None = None

    def __enter__(self) -> Runner:
        if self.jobs > 1:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=ctx)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def run(self, settings: Sequence[SimSettings]) -> list[RunResult]:
        """The runs for ``settings``, in the same order."""
        if self._pool is None or len(settings) <= 1:
            return [simulate(self.scenario, s) for s in settings]
        futures = [self._pool.submit(simulate, self.scenario, s) for s in settings]
        return [f.result() for f in futures]
