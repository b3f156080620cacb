"""``tidelease simulate`` end to end on a small cluster: the table, the sizing, the files."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from common.errors import InvalidInput
from extender.leasingsim import cli

CLUSTER = """
groups:
  - {name: h20-online, count: 8, gpu_type: H20, tiers: {HA: 0.75, MA: 0.25}, role: online}
  - {name: h20, count: 10, gpu_type: H20, tiers: {HA: 0.6, MA: 0.3, LA: 0.1}}
  - {name: a100, count: 4, gpu_type: A100, tiers: {HA: 0.5, MA: 0.5}}
failure_model:
  rates_per_day: {HA: 0.02, MA: 0.05, LA: 0.2}
"""


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tidelease simulate")
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_small_cluster_two_days_with_plots(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    out = tmp_path / "out"
    args = parse(
        "--cluster",
        str(cluster),
        "--days",
        "2",
        "--out",
        str(out),
        "--jobs",
        "1",
        "--seeds",
        "1",
        "--sweep-sizes",
        "0,8,16,32",
        "--save-inputs",
    )
    stdout = io.StringIO()
    assert cli.run(args, stdout) == 0
    text = stdout.getvalue()
    assert "cluster: 22 nodes, 176 GPUs (H20 144, A100 32); trace: 2 days" in text
    for policy in ("right-of-return", "no-return", "no-scaling"):
        assert f"\n{policy} " in text
    assert "Standby pool sizing" in text
    findings = text[text.index("Findings:") :]
    assert "fig. 14, HA share of the online jobs' GPUs: pre-lease" in findings
    assert "fig. 10, borrowers' fulfilment:" in findings
    assert "standby for >= 99.9% full reclaims:" in findings
    for name in ("ha_share.png", "fulfilment.png", "online_demand.png", "standby_sizing.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size > 10_000, name
        assert f"wrote {png}" in text
    summary = json.loads((out / "summary.json").read_text())
    assert [p["policy"] for p in summary["policies"]] == [
        "right-of-return",
        "no-return",
        "no-scaling",
    ]
    on = summary["policies"][0]
    assert on["reclaims"] > 0
    assert 0 < on["ha_start"] <= 1
    assert summary["standby_sizing"]["points"][0]["size"] == 0

    # the inputs written back replay to the same results
    again = tmp_path / "again"
    replay = parse(
        "--cluster",
        str(out / "cluster.yaml"),
        "--trace",
        str(out / "trace.csv"),
        "--days",
        "2",
        "--out",
        str(again),
        "--jobs",
        "1",
        "--seeds",
        "1",
        "--no-standby-sweep",
        "--standby",
        str(on["standby_gpus"]),
        "--no-plots",
    )
    assert cli.run(replay, io.StringIO()) == 0
    replayed = json.loads((again / "summary.json").read_text())
    strip = {"elapsed_s", "cpu_s"}
    assert [{k: v for k, v in p.items() if k not in strip} for p in replayed["policies"]] == [
        {k: v for k, v in p.items() if k not in strip} for p in summary["policies"]
    ]
    assert not list(again.glob("*.png"))


def test_bad_input_names_the_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("groups: [{name: g, count: 2, gpu_type: H20, gpus_per_node: x}]\n")
    with pytest.raises(InvalidInput, match=r"groups\[0\]\.gpus_per_node: want a positive"):
        cli.run(parse("--cluster", str(cluster), "--out", str(tmp_path / "o")))
    trace = tmp_path / "trace.csv"
    trace.write_text("kind,minute,name,gpus,duration_minutes\nborrower,0,x,2,ten\n")
    code = cli.main(["--scale", "0.01", "--trace", str(trace), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"tidelease: {trace}: line 2 (borrower): duration_minutes: want a positive" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policies", "sometimes"], "--policies: unknown 'sometimes'"),
        (["--sweep-sizes", "8,x"], "--sweep-sizes: want comma-separated integers"),
        (["--days", "0"], "--days: want a positive number"),
        (["--jobs", "0"], "--jobs: want at least 1"),
        (["--failure-scale", "-1"], "--failure-scale: want a non-negative number"),
    ],
)
def test_bad_options(argv: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=message):
        cli.run(parse(*argv, "--scale", "0.01", "--out", str(tmp_path)))


@pytest.mark.parametrize(
    ("gpus", "standby"), [(10_000, 1200), (1_000, 120), (176, 24), (0, 0)], ids=str
)
def test_default_standby_is_a_share_of_the_cluster_in_whole_nodes(gpus: int, standby: int) -> None:
    assert cli.default_standby(gpus) == standby


def test_failure_scale_multiplies_the_drawn_failures(tmp_path: Path) -> None:
    base = cli.scenario_from(parse("--scale", "0.02", "--days", "3", "--out", str(tmp_path)))
    more = cli.scenario_from(
        parse("--scale", "0.02", "--days", "3", "--failure-scale", "4", "--out", str(tmp_path))
    )
    assert len(more.failures) > 2 * len(base.failures) > 0
