"""The JSON log lines a block of code writes, as ``--log-format json`` writes them."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from common.logsetup import ContextFilter, JsonFormatter


class JsonLines:
    def __init__(self) -> None:
        self.out = io.StringIO()

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines()]


@contextmanager
def json_log_lines() -> Iterator[JsonLines]:
    """Every INFO-and-above line logged inside, formatted as the processes format them."""
    lines = JsonLines()
    handler = logging.StreamHandler(lines.out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
