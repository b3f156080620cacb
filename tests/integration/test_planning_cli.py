"""``tidelease plan-simulate`` end to end: tables, JSON and figures in the output folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.cli import main


def test_plan_simulate_writes_tables_and_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan-simulate", "--out", str(tmp_path), "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "| forecast planner |" in out
    assert "| cornucopia |" in out
    data = json.loads((tmp_path / "planner.json").read_text())
    assert [r["policy"] for r in data["queues"]] == ["cornucopia", "fifo", "strict priority"]
    for png in ("planner-online.png", "planner-queues.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
