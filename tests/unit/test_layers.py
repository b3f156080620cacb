"""The code's layers, from one table: which packages each package may import, no cycles between
packages, and no I/O in any module that calls itself pure.

A *package* here is a sub-package of a side (``extender.leasing``, ``nodeagent.cache``), a
side's top-level modules (``extender``: the process wiring and the demo), or ``common``. A module
*calls itself pure* when the first paragraph of its docstring says "Pure" (or "pure"); such a
module imports no I/O: no network, processes, files, clocks, randomness, event loop or metrics
(``IO`` below), and no first-party module that does.
"""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("common", "extender", "nodeagent")

# package -> the other first-party packages it may import. The one table of layer rules.
LAYERS: dict[str, frozenset[str]] = {
    name: frozenset(allowed)
    for name, allowed in {
        "common": (),
        # the control plane, bottom up
        # right of return: the GpuLease object and the rules of lending and taking back
        "extender.rightofreturn": ("common",),
        "extender.cluster": ("common", "extender.rightofreturn"),
        # the shared queues: pure policy, and the live admission controller over a watched view
        "extender.queues": ("common", "extender.cluster"),
        # the agents as the control plane sees them (AgentReady)
        "extender.agents": ("common",),
        "extender.hotrestart": ("common",),
        # a borrower gang evicted whole once a member is disrupted
        "extender.gangs": ("common",),
        # the TLS certificates of the extender and its scheduler, made and renewed in the cluster
        "extender.certrotation": ("common",),
        "extender.orchestration": ("common",),
        "extender.leasing": (
            "common",
            "extender.rightofreturn",
            "extender.cluster",
            "extender.queues",
        ),
        "extender.scheduler": (
            "common",
            "extender.rightofreturn",
            "extender.cluster",
            "extender.queues",
            "extender.leasing",
        ),
        "extender.prewarm": (
            "common",
            "extender.rightofreturn",
            "extender.leasing",
            "extender.scheduler",
        ),
        "extender.planner": ("common", "extender.rightofreturn", "extender.leasing"),
        # Kueue's admission check: lent capacity judged by the scheduler's own per-node rule,
        # read from the leasing controller's watched view of the cluster
        "extender.kueue": ("common", "extender.scheduler", "extender.cluster"),
        # what lending with right of return yields on a cluster (tidelease simulate)
        "extender.leasingsim": (
            "common",
            "extender.rightofreturn",
            "extender.cluster",
            "extender.leasing",
            "extender.scheduler",
        ),
        # the planner and the shared queues against baselines (tidelease plan-simulate)
        "extender.plannersim": ("common", "extender.queues", "extender.planner"),
        # what an admin sees (kubectl tidelease): the cluster view and the scheduler's own rules
        "extender.ctl": (
            "common",
            "extender.rightofreturn",
            "extender.cluster",
            "extender.leasing",
            "extender.scheduler",
        ),
        # extender/main.py wires the processes; extender/demo.py drives a real server
        "extender": (
            "common",
            "extender.agents",
            "extender.certrotation",
            "extender.cluster",
            "extender.ctl",
            "extender.gangs",
            "extender.hotrestart",
            "extender.kueue",
            "extender.leasing",
            "extender.leasingsim",
            "extender.orchestration",
            "extender.planner",
            "extender.plannersim",
            "extender.prewarm",
            "extender.queues",
            "extender.rightofreturn",
            "extender.scheduler",
        ),
        # the node agent
        "nodeagent.cache": ("common",),
        "nodeagent.cri": ("common",),
        "nodeagent.deviceplugin": ("common",),
        "nodeagent.dradriver": ("common", "nodeagent.deviceplugin"),
        "nodeagent.hotrestart": ("common", "nodeagent.cri"),
        "nodeagent.pulling": ("common", "nodeagent.cache"),
        "nodeagent": (
            "common",
            "nodeagent.cache",
            "nodeagent.cri",
            "nodeagent.deviceplugin",
            "nodeagent.dradriver",
            "nodeagent.hotrestart",
            "nodeagent.pulling",
        ),
    }.items()
}

# Roots of the modules a pure module may not import. Not here: random (the simulator's pure
# modules draw from generators seeded by the scenario), hashlib (a short name's digest),
# pathlib (paths as values), json and yaml (parsing text).
IO = frozenset(
    {
        "aiohttp",
        "asyncio",
        "concurrent",
        "fcntl",
        "grpc",
        "http",
        "kubernetes",
        "kubernetes_asyncio",
        "matplotlib",
        "multiprocessing",
        "os",
        "prometheus_client",
        "pynvml",
        "requests",
        "select",
        "shutil",
        "signal",
        "socket",
        "ssl",
        "subprocess",
        "tempfile",
        "threading",
        "time",
        "urllib",
    }
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "common":
        return "common"
    if len(parts) > 1 and (ROOT / parts[0] / parts[1]).is_dir():
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def _names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [node.module]
    return []


def _collect(tree: ast.AST, runtime: set[str], type_only: set[str]) -> None:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for inner in node.body:
                for sub in ast.walk(inner):
                    type_only.update(_names(sub))
            for inner in node.orelse:
                _collect(inner, runtime, type_only)
            continue
        runtime.update(_names(node))
        _collect(node, runtime, type_only)


class Module:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = _module_name(path)
        self.package = _package(self.name)
        tree = ast.parse(path.read_text())
        self.imports: set[str] = set()  # what runs on import
        self.type_only: set[str] = set()  # under ``if TYPE_CHECKING:``, for the type checker
        _collect(tree, self.imports, self.type_only)
        first = (ast.get_docstring(tree) or "").split("\n\n")[0]
        self.pure = bool(re.search(r"\b[Pp]ure\b", first))

    @property
    def first_party(self) -> set[str]:
        """First-party modules it imports, at run time or for the type checker."""
        return {n for n in self.imports | self.type_only if n.split(".")[0] in SIDES}

    @property
    def runs(self) -> set[str]:
        """First-party modules it imports at run time."""
        return {n for n in self.imports if n.split(".")[0] in SIDES}

    @property
    def io(self) -> set[str]:
        return {n for n in self.imports if n.split(".")[0] in IO}


MODULES = [Module(p) for side in SIDES for p in sorted((ROOT / side).rglob("*.py"))]
BY_NAME = {m.name: m for m in MODULES}
PURE = [m for m in MODULES if m.pure]


def test_every_package_is_in_the_table() -> None:
    assert {m.package for m in MODULES} == set(LAYERS)


def test_the_table_has_no_cycles() -> None:
    try:
        order = list(TopologicalSorter(LAYERS).static_order())
    except CycleError as e:
        pytest.fail(f"the layer table has a cycle: {e.args[1]}")
    assert order[0] == "common"


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_follow_the_table(package: str) -> None:
    allowed = LAYERS[package] | {package}
    crossing = {
        m.name: sorted(n for n in m.first_party if _package(n) not in allowed)
        for m in MODULES
        if m.package == package
    }
    assert not {k: v for k, v in crossing.items() if v}, f"{package} may import {sorted(allowed)}"


def _modules_of(name: str) -> list[Module]:
    """The first-party module an import names (``from a.b import c`` names ``a.b``; a package's
    import runs its ``__init__``)."""
    module = BY_NAME.get(name)
    return [module] if module is not None else []


@pytest.mark.parametrize("module", PURE, ids=[m.name for m in PURE])
def test_pure_modules_do_no_io(module: Module) -> None:
    assert not module.io, f"{module.name} calls itself pure and imports {sorted(module.io)}"
    impure = sorted(n for n in module.runs for m in _modules_of(n) if m.io and not m.pure)
    assert not impure, f"{module.name} calls itself pure and imports I/O modules {impure}"


def test_the_rule_sees_what_it_checks() -> None:
    """The checks above see imports and purity claims at all (a parse that found nothing would
    pass them vacuously)."""
    assert len(PURE) >= 40
    leasing = BY_NAME["extender.leasing.controller"]
    assert "asyncio" in leasing.io
    assert BY_NAME["extender.leasing.decisions"].pure
    assert "extender.rightofreturn.rules" in BY_NAME["extender.leasing.decisions"].runs
    health = BY_NAME["nodeagent.health"]
    assert "nodeagent.nvml" in health.type_only - health.imports
