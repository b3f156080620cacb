"""The planner's policy modules are pure: no I/O, no asyncio, no Kubernetes client."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.imports import imported

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "forecasting",
    "throughput",
    "stabilizing",
    "autoscaling",
    "directives",
    "mlfq",
    "profiling",
    "allocation",
    "preempting",
    "jobviews",
]
FORBIDDEN = {"aiohttp", "asyncio", "kubernetes_asyncio", "kubernetes", "pynvml", "grpc", "socket"}
FORBIDDEN |= {"subprocess", "matplotlib", "extender.store", "extender.kubestore", "extender.server"}


@pytest.mark.parametrize("module", PURE)
def test_planning_policy_does_no_io(module: str) -> None:
    names = imported(ROOT / "extender" / "planning" / f"{module}.py")
    bad = {n for n in names if n in FORBIDDEN or n.split(".")[0] in FORBIDDEN}
    assert not bad, f"{module} imports {sorted(bad)}"


def test_job_classes_do_no_io() -> None:
    names = imported(ROOT / "common" / "jobclasses.py")
    bad = {n for n in names if n in FORBIDDEN or n.split(".")[0] in FORBIDDEN}
    assert not bad, f"common/jobclasses.py imports {sorted(bad)}"
