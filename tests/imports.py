"""What a module imports, read from its source: for the tests that keep policy free of I/O."""

from __future__ import annotations

import ast
from pathlib import Path


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports (``import x.y`` and ``from x.y import z`` give ``x.y``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names
