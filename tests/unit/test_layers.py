"""Policy imports no I/O: placement, scoring, preemption and filtering are pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.imports import imported

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "common/model.py",
    "common/contract.py",
    "common/podrequest.py",
    "common/objects.py",
    "extender/placement.py",
    "extender/scoring.py",
    "extender/preemption.py",
    "extender/filtering.py",
    "extender/clusterstate.py",
]
FORBIDDEN = {
    "aiohttp",
    "asyncio",
    "kubernetes_asyncio",
    "kubernetes",
    "pynvml",
    "grpc",
    "socket",
    "subprocess",
    "requests",
    "extender.store",
    "extender.server",
    "extender.kubestore",
    "extender.binding",
}


@pytest.mark.parametrize("module", PURE)
def test_policy_modules_do_no_io(module: str) -> None:
    bad = {
        name
        for name in imported(ROOT / module)
        if name in FORBIDDEN or name.split(".")[0] in FORBIDDEN
    }
    assert not bad, f"{module} imports {sorted(bad)}"
