"""The simulator's input files: cluster descriptions and traces, and errors that name the place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import InvalidInput
from common.model import Tier
from extender.leasingsim.loading import (
    cluster_document,
    load_cluster,
    parse_cluster,
    parse_trace,
    trace_csv,
)
from extender.leasingsim.scenario import FailureModel, NodeSpec, Role

CLUSTER = """
seed: 3
nodes:
  - {name: gpu-a, gpu_type: H20, tiers: [HA, HA, MA, LA], role: online}
  - {name: gpu-b, gpu_type: A100, gpus: 2, tier: MA}
groups:
  - name: h20
    count: 10
    gpu_type: H20
    gpus_per_node: 4
    tiers: {HA: 0.5, MA: 0.25, LA: 0.25}
failure_model:
  rates_per_day: {HA: 0.001, LA: 0.5}
  repair_hours: [1, 2]
"""


def nodes() -> list[NodeSpec]:
    return list(parse_cluster(CLUSTER, "cluster.yaml").expand(1))


def test_cluster_nodes_groups_and_failure_model() -> None:
    spec = parse_cluster(CLUSTER, "cluster.yaml")
    expanded = spec.expand(99)  # the file's seed wins
    assert expanded == spec.expand(3)
    by_name = {n.name: n for n in expanded}
    assert by_name["gpu-a"].tiers == (Tier.HA, Tier.HA, Tier.MA, Tier.LA)
    assert by_name["gpu-a"].role is Role.ONLINE
    assert by_name["gpu-b"] == NodeSpec("gpu-b", "A100", (Tier.MA, Tier.MA))  # type: ignore[arg-type]
    group = [n for n in expanded if n.name.startswith("h20-")]
    assert [n.name for n in group[:2]] == ["h20-0000", "h20-0001"]
    tiers = [t for n in group for t in n.tiers]
    assert (tiers.count(Tier.HA), tiers.count(Tier.MA), tiers.count(Tier.LA)) == (20, 10, 10)
    assert spec.failure_model.rate(Tier.HA) == 0.001
    assert spec.failure_model.rate(Tier.MA) == FailureModel().rate(Tier.MA)  # default kept
    assert spec.failure_model.rate(Tier.LA) == 0.5
    assert spec.failure_model.repair_hours == (1.0, 2.0)


def test_cluster_as_json() -> None:
    doc = {"nodes": [{"name": "n", "gpu_type": "H20", "tiers": ["HA"]}]}
    spec = parse_cluster(json.dumps(doc), "c.json")
    assert spec.expand(0) == (NodeSpec("n", "H20", (Tier.HA,)),)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "groups: [{name: g, count: many, gpu_type: H20}]",
            "c.yaml: groups[0].count: want a positive integer, got 'many'",
            id="bad-count",
        ),
        pytest.param(
            "nodes: [{name: a, gpu_type: H20, tiers: [HA, XA]}]",
            "c.yaml: nodes[0].tiers[1]: want HA, MA or LA, got 'XA'",
            id="bad-tier",
        ),
        pytest.param(
            "groups: [{name: g, count: 1, gpu_type: H20, tiers: {HA: 0.5, MA: 0.4}}]",
            "c.yaml: groups[0].tiers: shares add up to 0.9, want 1",
            id="shares",
        ),
        pytest.param(
            "nodes: [{name: a, gpu: H20}]",
            "c.yaml: nodes[0]: unknown key 'gpu'",
            id="unknown-key",
        ),
        pytest.param(
            "nodes: [{name: a}]",
            "c.yaml: nodes[0].gpu_type: required",
            id="missing",
        ),
        pytest.param(
            "nodes:\n  - name: a\n   gpu_type: H20\n",
            "c.yaml: not valid YAML (line 3, column",
            id="yaml-syntax",
        ),
        pytest.param("{}", "c.yaml: no nodes", id="empty"),
        pytest.param(
            "nodes: [{name: g-0000, gpu_type: H20}]\ngroups: [{name: g, count: 1, gpu_type: H20}]",
            "c.yaml: node 'g-0000' is named twice",
            id="duplicate",
        ),
        pytest.param(
            "nodes: [{name: a, gpu_type: H20}]\nfailure_model: {repair_hours: [5, 1]}",
            "c.yaml: failure_model.repair_hours: want [min, max] hours",
            id="repair",
        ),
    ],
)
def test_bad_cluster_names_the_place(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_cluster(text, "c.yaml")
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def test_every_problem_at_once() -> None:
    text = "groups: [{name: g, count: 0, gpu_type: H20}, {name: h, count: 1, gpu_type: ''}]"
    with pytest.raises(InvalidInput) as err:
        parse_cluster(text, "c.yaml")
    assert len(err.value.problems) == 2


def test_bad_json_names_line_and_column() -> None:
    with pytest.raises(InvalidInput, match=r"c\.json: not valid JSON \(line 1, column"):
        parse_cluster('{"nodes": [}', "c.json")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        load_cluster(tmp_path / "missing.yaml")


TRACE_YAML = """
start: "2026-03-02T00:00:00Z"
step_minutes: 10
days: 2
online_jobs:
  - {name: recsys, gpu_type: H20, gpus_per_replica: 4, demand: [[0, 8], [600, 4], [60, 8]]}
  - name: ads
    gpu_type: H20
    gpus_per_replica: 4
    min_tier: MA
    schedule: [{at: "08:00", gpus: 8}, {at: "22:30", gpus: 4}]
borrowers:
  - {name: ft, arrival_minute: 5, gpus: 2, duration_minutes: 60, gpu_type: A100}
  - {arrival_minute: 7, gpus: 4, duration_minutes: 30, patience_minutes: 0, min_tier: HA}
failures:
  - {minute: 30, node: gpu-a, index: 3, repair_minutes: 120}
"""


def test_trace_document() -> None:
    trace = parse_trace(TRACE_YAML, "t.yaml", nodes())
    assert trace.step == 10
    assert trace.minutes == 2 * 1440
    assert trace.start == 1772409600.0
    recsys, ads = trace.online
    assert recsys.demand == ((0, 8), (60, 8), (600, 4))  # sorted
    assert recsys.demand_at(599) == 8
    assert recsys.demand_at(600) == 4
    assert ads.min_tier is Tier.MA
    assert [(e.minute_of_day, e.gpus) for e in ads.schedule] == [(480, 8), (1350, 4)]
    ft, second = trace.borrowers
    assert (ft.gpu_type, ft.patience, second.name, second.min_tier) == (
        "A100",
        1440,
        "borrower-1",
        Tier.HA,
    )
    assert trace.failures is not None
    assert [(f.node, f.index, f.repair) for f in trace.failures] == [("gpu-a", 3, 120)]


TRACE_CSV = (
    (
        "kind,minute,name,gpus,gpu_type,min_tier,gpus_per_replica,at,duration_minutes,"
        "patience_minutes,node,index,repair_minutes\n"
    )
    + """online,,recsys,,H20,LA,4,,,,,,
demand,0,recsys,8,,,,,,,,,
demand,600,recsys,4,,,,,,,,,
# a comment
borrower,5,ft,2,A100,,,,60,,,,
failure,30,,,,,,,,,gpu-a,3,120
"""
)


def test_trace_csv_and_round_trip() -> None:
    trace = parse_trace(TRACE_CSV, "t.csv", nodes())
    assert trace.minutes == 1440  # whole days up to the last event
    assert trace.online[0].demand == ((0, 8), (600, 4))
    assert trace.borrowers[0].duration == 60
    again = parse_trace(trace_csv(trace), "again.csv", nodes())
    assert again == trace


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "kind,minute,name,gpus,duration_minutes\nborrower,0,x,two,10\n",
            "t.csv: line 2 (borrower): gpus: want a positive integer, got 'two'",
            id="bad-gpus",
        ),
        pytest.param(
            "kind,minute,name,gpus\nboroower,0,x,2\n",
            "t.csv: line 2: kind: want one of online, demand, schedule, borrower, failure",
            id="bad-kind",
        ),
        pytest.param(
            "kind,minute,name,gpus\ndemand,0,ghost,2\n",
            "t.csv: line 2 (demand): online job 'ghost' is not declared by an 'online' row",
            id="undeclared-job",
        ),
        pytest.param(
            "kind,minute,name,gpu\n",
            "t.csv: line 1: unknown column 'gpu'",
            id="unknown-column",
        ),
        pytest.param(
            "kind,minute,node,index,repair_minutes\nfailure,5,nope,0,10\n",
            "t.csv line 2: failure: node 'nope' is not in the cluster",
            id="unknown-node",
        ),
        pytest.param(
            "kind,minute,node,index,repair_minutes\nfailure,5,gpu-a,4,10\n",
            "t.csv line 2: failure: node 'gpu-a' has no GPU 4 (it has 4)",
            id="no-such-gpu",
        ),
        pytest.param(
            "kind,minute,name,gpus,duration_minutes\nborrower,0,big,16,10\n",
            "t.csv line 2: borrower 'big': asks 16 GPUs, but no node has more than 4",
            id="too-big",
        ),
        pytest.param(
            "kind,minute,name,gpus,duration_minutes\nborrower,0,x,2\n",
            "t.csv: line 2 (borrower): duration_minutes: required",
            id="missing",
        ),
        pytest.param(
            "kind,name,gpu_type\nonline,j,TPU\n",
            "t.csv line 2: online job 'j': no node has GPU type 'TPU'",
            id="unknown-type",
        ),
    ],
)
def test_bad_csv_trace_names_the_line(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_trace(text, "t.csv", nodes())
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "borrowers: [{arrival_minute: 0, gpus: 1}]",
            "t.yaml: borrowers[0].duration_minutes: required",
            id="missing",
        ),
        pytest.param(
            "online_jobs: [{name: j, gpu_type: H20, demand: [[0]]}]",
            "t.yaml: online_jobs[0].demand[0]: want [minute, GPUs]",
            id="demand-point",
        ),
        pytest.param(
            "online_jobs: [{name: j, gpu_type: H20, schedule: [{at: '25:00', gpus: 1}]}]",
            "t.yaml: online_jobs[0].schedule[0].at: want HH:MM (UTC)",
            id="schedule-time",
        ),
        pytest.param(
            "online_jobs: [{name: j, gpu_type: H20}]",
            "t.yaml: online_jobs[0]: online job 'j': no demand",
            id="no-demand",
        ),
        pytest.param(
            "online_jobs: [{name: j, gpu_type: H20, gpus_per_replica: 8, demand: [[0, 8]]}]",
            "t.yaml: online_jobs[0]: online job 'j': 8 GPUs per replica, but its nodes have at",
            id="replica-too-big",
        ),
        pytest.param("start: yesterday", "t.yaml: start: want an ISO 8601 time", id="start"),
    ],
)
def test_bad_yaml_trace_names_the_place(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_trace(text, "t.yaml", nodes())
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def test_cluster_document_round_trip() -> None:
    spec = parse_cluster(CLUSTER, "cluster.yaml")
    text = cluster_document(spec.expand(1), spec.failure_model)
    again = parse_cluster(text, "again.yaml")
    assert again.expand(5) == spec.expand(1)
    assert again.failure_model == spec.failure_model
