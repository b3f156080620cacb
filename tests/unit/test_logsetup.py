"""JSON logs say what each line is about: the verb or controller, and the object."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from common.cli import parser
from common.logsetup import add_log_context, log_context, object_fields
from common.reconcile import ReconcileLoop, ReconcileSettings
from tests.logcapture import JsonLines, json_log_lines

log = logging.getLogger("tests.logsetup")


@pytest.fixture
def lines() -> Iterator[JsonLines]:
    with json_log_lines() as captured:
        yield captured


def test_lines_carry_their_context_and_only_inside_it(lines: JsonLines) -> None:
    log.info("before")
    with log_context(verb="bind"):
        add_log_context(namespace="ml", name="p-0")
        log.info("inside")
        with log_context(name="p-1"):
            log.info("nested")
        log.info("back")
    log.info("after")
    got = [(e["msg"], e.get("verb"), e.get("namespace"), e.get("name")) for e in lines.entries()]
    assert got == [
        ("before", None, None, None),
        ("inside", "bind", "ml", "p-0"),
        ("nested", "bind", "ml", "p-1"),
        ("back", "bind", "ml", "p-0"),
        ("after", None, None, None),
    ]


def test_object_fields_of_namespaced_and_cluster_scoped_keys() -> None:
    assert object_fields("ml/recsys") == {"namespace": "ml", "name": "recsys"}
    assert object_fields("node-a") == {"name": "node-a"}


async def test_a_controllers_lines_name_it_and_the_object_it_reconciles(
    lines: JsonLines,
) -> None:
    done = asyncio.Event()

    async def reconcile(key: str) -> None:
        log.info("reconciling")
        done.set()

    loop = ReconcileLoop("leasing", reconcile, keys=lambda: [], settings=ReconcileSettings())
    loop.add("ml/recsys")
    runner = asyncio.create_task(loop.run())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    (entry,) = [e for e in lines.entries() if e["msg"] == "reconciling"]
    assert (entry["controller"], entry["namespace"], entry["name"]) == ("leasing", "ml", "recsys")


def test_the_flag_takes_text_or_json() -> None:
    p = parser()
    assert p.parse_args(["--log-format", "json", "agent"]).log_format == "json"
    assert p.parse_args(["agent"]).log_format == "text"
    with pytest.raises(SystemExit):
        p.parse_args(["--log-format", "xml", "agent"])
