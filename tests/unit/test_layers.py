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


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize(
    ("package", "forbidden", "allowed"),
    [
        ("nodeagent", "extender", set()),
        ("extender", "nodeagent", set()),
        # The command line wires both sides together; nothing else in common knows them.
        ("common", "extender", {"common/cli.py"}),
        ("common", "nodeagent", {"common/cli.py"}),
    ],
)
def test_the_agent_and_the_control_plane_meet_only_in_common(
    package: str, forbidden: str, allowed: set[str]
) -> None:
    crossing = {
        str(path.relative_to(ROOT)): sorted(
            n for n in imported(path) if n.split(".")[0] == forbidden
        )
        for path in _sources(package)
        if str(path.relative_to(ROOT)) not in allowed
    }
    assert _sources(package)
    assert not {k: v for k, v in crossing.items() if v}
