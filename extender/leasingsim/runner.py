"""Run several simulations, in worker processes when more than one core is asked for.

Every run is deterministic in its scenario and settings, so the results are the same however
many workers run them; only the wall time differs. Workers are started with ``spawn`` (no state
inherited from the parent). Over several seeds each seed has its scenario: a run's settings
name its seed, and the runner gives it that seed's scenario.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor

from extender.leasingsim.scenario import Scenario
from extender.leasingsim.simulating import RunResult, SimSettings, simulate


class Runner:
    """Runs simulations of one scenario, or of one per seed (``{seed: scenario}``, each run on
    its settings' seed's); ``jobs`` > 1 uses that many worker processes."""

    def __init__(self, scenario: Scenario | Mapping[int, Scenario], jobs: int = 1) -> None:
        self.scenarios: Mapping[int, Scenario] | None = None
        self.scenario: Scenario | None = None
        if isinstance(scenario, Scenario):
            self.scenario = scenario
        else:
            self.scenarios = dict(scenario)
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
            return [simulate(self.scenario_of(s), s) for s in settings]
        futures = [self._pool.submit(simulate, self.scenario_of(s), s) for s in settings]
        return [f.result() for f in futures]

    def scenario_of(self, settings: SimSettings) -> Scenario:
        if self.scenario is not None:
            return self.scenario
        assert self.scenarios is not None
        return self.scenarios[settings.seed]
