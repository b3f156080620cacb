"""The simulator's logic imports no I/O: files, plots and processes stay in their adapters."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.imports import imported

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "extender" / "simulation"
ADAPTERS = {"cli.py", "loading.py", "plotting.py", "executing.py"}
PURE = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ADAPTERS)
FORBIDDEN = {
    "aiohttp",
    "asyncio",
    "concurrent",
    "csv",
    "json",
    "kubernetes_asyncio",
    "matplotlib",
    "multiprocessing",
    "os",
    "pathlib",
    "socket",
    "subprocess",
    "yaml",
    "extender.store",
    "extender.server",
    "extender.kubestore",
    "extender.binding",
    "extender.simulation.cli",
    "extender.simulation.loading",
    "extender.simulation.plotting",
    "extender.simulation.executing",
}


def test_every_module_is_classified() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} >= ADAPTERS
    assert "simulating.py" in PURE


@pytest.mark.parametrize("module", PURE)
def test_simulation_logic_does_no_io(module: str) -> None:
    bad = {
        name
        for name in imported(PACKAGE / module)
        if name in FORBIDDEN or name.split(".")[0] in FORBIDDEN
    }
    assert not bad, f"{module} imports {sorted(bad)}"
