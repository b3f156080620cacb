"""Pure reading of settings values, strictly: from YAML, an environment variable or a flag, each
value becomes its setting's type or a problem is noted. Booleans are booleans (or their usual
words in text), integers are whole numbers (2.9 is not 2, true is not 1), numbers are finite (no
NaN, no infinity), ports are in 0..65535. Each function appends what is wrong to ``problems``
and returns None, so a caller reads every value and reports every problem at once.

The extender's settings file (extender/scheduler/settings.py), the agent's flags
(nodeagent/main.py) and the orchestrator's (extender/orchestration/command.py) all read through
here. The checks beneath (:func:`whole`, :func:`number`, :func:`finite`, :func:`real`) also
serve parsers that word their problems themselves (the orchestrator's dependency file and
records, the GpuLease, the pod request).

Fields of API objects that may be absent are read leniently instead: :func:`mapping`,
:func:`items` and :func:`text` give an empty value for a field that is missing or of another
type, where nothing is to be reported (the DRA claims the leasing controller reads, a GpuLease's
conditions, a pod's owner references).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard

_INTEGER = re.compile(r"[+-]?[0-9]+")


def whole(value: object) -> TypeGuard[int]:
    """An integer, not a bool passed for one (YAML and JSON read ``true`` as a bool, and Python
    counts bools as integers)."""
    return isinstance(value, int) and not isinstance(value, bool)


def number(value: object) -> TypeGuard[int | float]:
    """A real number, integer or float (not a bool passed for one); it may be NaN or infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def real(value: int | float) -> float:
    """``value`` as a float; an integer past the largest float is infinite (float() would raise
    OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def finite(value: object) -> bool:
    """A real number, not NaN or infinite (nor a bool passed for one)."""
    return number(value) and math.isfinite(real(value))


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def items(value: object) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def text(value: object) -> str:
    """``value`` if it is a string, else the empty one."""
    return value if isinstance(value, str) else ""


def as_bool(name: str, value: Any, problems: list[str]) -> bool | None:
    if isinstance(value, bool):
        return value
    text = value.lower() if isinstance(value, str) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    problems.append(f"{name}: want true or false, got {value!r}")
    return None


def as_int(name: str, value: Any, problems: list[str]) -> int | None:
    if whole(value):
        return value
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value)
    problems.append(f"{name}: want a whole number, got {value!r}")
    return None


def as_float(name: str, value: Any, problems: list[str]) -> float | None:
    parsed: float | None = None
    if number(value):
        parsed = real(value)
    elif isinstance(value, str):
        try:
            parsed = float(value)
        except ValueError:
            parsed = None
    if parsed is None or not math.isfinite(parsed):
        problems.append(f"{name}: want a finite number, got {value!r}")
        return None
    return parsed


def as_names(name: str, value: Any, problems: list[str]) -> tuple[str, ...] | None:
    """A list of names: a YAML list, or comma-separated text."""
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, list | tuple) and all(isinstance(i, str) and i.strip() for i in items):
        return tuple(i.strip() for i in items)
    problems.append(f"{name}: want a list of names, got {value!r}")
    return None


def as_positive(name: str, value: Any, problems: list[str]) -> float | None:
    """A finite number above zero (a timeout, an interval, a TTL)."""
    parsed = as_float(name, value, problems)
    if parsed is not None and parsed <= 0:
        problems.append(f"{name}: want a positive number of seconds, got {value!r}")
        return None
    return parsed


def as_count(name: str, value: Any, problems: list[str], *, minimum: int = 0) -> int | None:
    """A whole number of at least ``minimum``."""
    parsed = as_int(name, value, problems)
    if parsed is not None and parsed < minimum:
        problems.append(f"{name}: want a whole number of at least {minimum}, got {value!r}")
        return None
    return parsed


def as_port(name: str, value: Any, problems: list[str]) -> int | None:
    """A TCP port, 0..65535 (0: any free port, or off where the setting says so)."""
    parsed = as_int(name, value, problems)
    if parsed is not None and not 0 <= parsed <= 65535:
        problems.append(f"{name}: want a port in 0..65535, got {value!r}")
        return None
    return parsed


def coerce(name: str, kind: type, value: Any, problems: list[str]) -> Any:
    """``value`` as ``kind`` (bool, int, float, tuple of names, or a text type such as str or
    Path), strictly; None, with the problem noted, when it is not one."""
    if kind is bool:
        return as_bool(name, value, problems)
    if kind is int:
        return as_int(name, value, problems)
    if kind is float:
        return as_float(name, value, problems)
    if kind is tuple:
        return as_names(name, value, problems)
    if isinstance(value, str | Path):
        return kind(value)
    problems.append(f"{name}: want text, got {value!r}")
    return None
