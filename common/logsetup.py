"""Logging for every tidelease process: one line per event, plain text or JSON.

With ``--log-format json`` every line is one JSON object: time, level, logger, msg, and what it
is about, from the context the line was logged in (:func:`log_context`): the verb
(``verb``: filter, prioritize, bind, preempt) or the controller (``controller``), and the
object's ``namespace`` and ``name``. The context follows asyncio tasks (a ``ContextVar``): a
verb's lines carry its pod, a reconcile's lines its object, whatever module logs them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

FORMATS = ("text", "json")
# The fields a line may carry about what it concerns, in the order they are written.
CONTEXT_FIELDS = ("verb", "controller", "namespace", "name")

_context: ContextVar[dict[str, str] | None] = ContextVar("tidelease_log_context", default=None)


def _current() -> dict[str, str]:
    return _context.get() or {}


@contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Lines logged inside (in this task, and tasks it starts) carry these fields."""
    token = _context.set({**_current(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def add_log_context(**fields: str) -> None:
    """Add fields to the current context, until the enclosing :func:`log_context` ends."""
    _context.set({**_current(), **fields})


def object_fields(key: str) -> dict[str, str]:
    """``namespace/name`` (or ``name`` of a cluster-scoped object) as log fields."""
    namespace, _, name = key.rpartition("/")
    return {"namespace": namespace, "name": name} if namespace else {"name": name}


class ContextFilter(logging.Filter):
    """Stamps each record with the context it was logged in (a handler may format it later,
    elsewhere)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.tidelease_context = _current()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        context = getattr(record, "tidelease_context", None) or _current()
        for key in CONTEXT_FIELDS:
            if context.get(key):
                entry[key] = context[key]
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str = "INFO", *, json_format: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
