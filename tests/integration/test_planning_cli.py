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
    assert "| forecast planner (kale) |" in out
    assert "| HPA (GPU utilisation, target 80 %) |" in out
    assert "target (violations <= 1/5 at <= 1.10x GPU hours) met" in out
    assert "| cornucopia |" in out
    data = json.loads((tmp_path / "planner.json").read_text())
    assert [r["policy"] for r in data["queues"]] == ["cornucopia", "fifo", "strict priority"]
    kale = {r["policy"]: r for r in data["kale"]["results"]}
    planner, hpa = kale["forecast planner (kale)"], kale["HPA (GPU utilisation, target 80 %)"]
    assert planner["slo_violation"] < hpa["slo_violation"] / 5
    assert planner["gpu_hours"] <= 1.10 * hpa["gpu_hours"]
    for png in ("planner-kale.png", "planner-online.png", "planner-queues.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_simulate_kale_settings_are_validated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan-simulate", "--out", str(tmp_path), "--hpa-target", "1.5"]) == 2
    assert "target must be in (0, 1]" in capsys.readouterr().err
