"""The chart's dashboards and alerts (manifests/charts/tidelease/dashboards, monitoring/): the
rules pass `promtool check rules` and their unit tests (`promtool test rules`, synthetic series)
with the promtool that hack/build-binaries.sh builds; every dashboard query parses as PromQL;
the dashboards, the rules and the rule tests name only metrics that the code exports, as read
from the real metrics classes' registries; the chart ships both, unchanged, when asked."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from prometheus_client import CollectorRegistry

from common.httpserving import TLSContext
from common.reconcile import ControllerMetrics
from extender.certrotation.controller import RotationMetrics
from extender.cluster.store import MemoryStore
from extender.leasing.metrics import LeasingMetrics
from extender.orchestration.metrics import OrchestratorMetrics
from extender.planner.controller import PlannerMetrics
from extender.prewarm.controller import PrewarmMetrics
from extender.scheduler.extenderserver import TLSExpiry, build_app
from extender.scheduler.settings import ExtenderSettings
from tests.chart import CHART, binary, find, helm, kube_version, render
from tests.integration.conftest import Server

DASHBOARDS = CHART / "dashboards"
RULES = CHART / "monitoring" / "alerts.yaml"
RULE_TESTS = Path(__file__).parent / "monitoring" / "alerts-test.yaml"

# A metric name in PromQL: tidelease_... not preceded by a name character (label values and
# names such as "tidelease-agent-x" do not match).
METRIC = re.compile(r"(?<![A-Za-z0-9_:])tidelease_[A-Za-z0-9_:]*")
# Grafana's variables, replaced by values PromQL parses.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$gpu_type": ".*", "$tier": ".*"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
    "stateset": ("",),
    "gauge": ("",),
    "unknown": ("",),
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, timeout=120, check=False
    )


# --- what the code exports ---


def _registries() -> list[CollectorRegistry]:
    """The registries of the processes: the extender's as serving builds it (its verbs'
    metrics and the cluster's, its certificates' ends), the controllers' (leasing, prewarm,
    planner, the certificate rotation and their reconcile loops) and the orchestrator's."""
    # The per-GPU family too (monitoring.gpuInfo), which the DCGM dashboard joins on.
    extender = build_app(
        store=MemoryStore([]), settings=ExtenderSettings(gpu_info_metric=True)
    ).metrics.registry
    # With HTTPS (clusterScheduler mode): when its certificates end.
    tls = SimpleNamespace(
        serving_not_after=1.0, client_ca_not_after=1.0, client_not_after=1.0, reloads=0
    )
    extender.register(TLSExpiry(cast(TLSContext, tls)))
    controllers = CollectorRegistry()
    RotationMetrics.create(controllers)
    LeasingMetrics(controllers)
    PrewarmMetrics(controllers)
    PlannerMetrics(controllers)
    ControllerMetrics.on(controllers)
    orchestrator = OrchestratorMetrics().registry
    ControllerMetrics.on(orchestrator)
    return [extender, controllers, orchestrator]


def exported_metrics() -> set[str]:
    """Every series name the processes expose (a counter's ``_total``, a histogram's
    ``_bucket``, ``_sum`` and ``_count``, ...), whether or not it has a sample yet."""
    out: set[str] = set()
    for registry in _registries():
        for family in registry.collect():
            out.update(family.name + s for s in SUFFIXES[family.type])
            out.update(s.name for s in family.samples)
    return out


def metric_families() -> set[str]:
    """The metric families' names (a histogram's name alone): what prose may name."""
    return {family.name for registry in _registries() for family in registry.collect()}


# --- what the dashboards and rules query ---


def _strings(node: object) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def dashboard_queries(model: dict[str, Any]) -> list[str]:
    """The PromQL of a Grafana dashboard: its panels' targets and its query variables."""
    exprs: list[str] = []

    def panels(items: Iterable[dict[str, Any]]) -> None:
        for panel in items:
            exprs.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            panels(panel.get("panels", []))

    panels(model["panels"])
    for var in model.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def rule_queries() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def rule_test_series() -> list[str]:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    return [series["series"] for t in tests for series in t["input_series"]]


def unknown_metrics(texts: Iterable[str], exported: set[str]) -> set[str]:
    """The tidelease metric names in ``texts`` that nothing exports."""
    return {name for text in texts for name in METRIC.findall(text)} - exported


# --- the tests ---


def test_the_code_exports_what_the_dashboards_rely_on() -> None:
    exported = exported_metrics()
    # The names of every family the code defines, with their exposition suffixes; also the
    # other engineer's leasing gauges and the cluster collector (families with no sample yet).
    for name in (
        "tidelease_extender_requests_total",
        "tidelease_extender_request_duration_seconds_bucket",
        "tidelease_controller_reconcile_errors_total",
        "tidelease_leasing_reclaim_overdue_seconds",
        "tidelease_leasing_standby_gpus",
        "tidelease_leasing_standby_target_gpus",
        "tidelease_cluster_gpus",
        "tidelease_cluster_agent_silent",
        "tidelease_cluster_node_unhealthy_gpus",
        "tidelease_orchestrator_jobs",
    ):
        assert name in exported


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_a_dashboard_names_only_exported_metrics(name: str) -> None:
    model = dashboards()[name]
    queries = dashboard_queries(model)
    assert queries, f"{name} has no query"
    assert unknown_metrics(queries, exported_metrics()) == set()
    # Titles and descriptions name metrics too (a histogram by its family's name): real ones.
    assert unknown_metrics(_strings(model), exported_metrics() | metric_families()) == set()


def test_the_rules_and_their_tests_name_only_exported_metrics() -> None:
    exported = exported_metrics()
    assert unknown_metrics(rule_queries(), exported) == set()
    assert unknown_metrics(rule_test_series(), exported) == set()


def test_a_renamed_metric_in_a_dashboard_is_caught() -> None:
    """The check itself: a dashboard that names a metric the code does not export fails it."""
    text = (DASHBOARDS / "tidelease-extender.json").read_text()
    assert "tidelease_extender_ledger_conflicts_total" in text
    renamed = json.loads(
        text.replace("tidelease_extender_ledger_conflicts_total", "tidelease_extender_conflicts")
    )
    assert unknown_metrics(dashboard_queries(renamed), exported_metrics()) == {
        "tidelease_extender_conflicts"
    }
    # Suffixes count: a counter's family name alone is not a series.
    assert unknown_metrics(["rate(tidelease_extender_requests[5m])"], exported_metrics()) == {
        "tidelease_extender_requests"
    }


def test_dashboards_are_grafana_models_over_a_datasource_variable() -> None:
    uids = set()
    for name, model in dashboards().items():
        assert model["schemaVersion"] >= 39, name
        uids.add(model["uid"])
        variables = {v["name"]: v for v in model["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in model["panels"]]
        assert len(ids) == len(set(ids)), name
        for panel in model["panels"]:
            assert panel["type"] in {"row", "timeseries", "stat"}, (name, panel["title"])
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == "${datasource}", (name, panel["title"])
                assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
    assert len(uids) == len(dashboards())


def test_the_dashboards_queries_parse_as_promql(tmp_path: Path) -> None:
    """promtool parses each query (Grafana's variables given values), as recording rules."""
    rules = []
    for name, model in dashboards().items():
        for i, expr in enumerate(dashboard_queries(model)):
            if expr.startswith("label_values("):  # Grafana's function, not PromQL
                expr = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", expr)
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, (name, expr)
            record = f"check:{name.removesuffix('.json').replace('-', '_')}:{i}"
            rules.append({"record": record, "expr": expr})
    path = tmp_path / "dashboards-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


# The DCGM dashboard (tidelease-dcgm.json) evaluated by promtool over synthetic series: what the
# extender's two replicas export per GPU (tidelease_cluster_gpu_info, both alike) and what the
# DCGM exporter exports for three of the four GPUs. Each panel's query and the samples it must
# give, by the panel's title.
DCGM_INFO = (
    # UUID, node, tier, health, holder, lent
    ("GPU-a0", "a", "HA", "healthy", "online", "false"),
    ("GPU-a1", "a", "HA", "healthy", "borrower", "true"),
    ("GPU-b0", "b", "LA", "healthy", "none", "true"),
    ("GPU-b1", "b", "LA", "unhealthy", "none", "false"),  # no DCGM exporter reports it
)
DCGM_SERIES = {  # metric: {UUID: value}
    "DCGM_FI_DEV_GPU_UTIL": {"GPU-a0": 90, "GPU-a1": 40, "GPU-b0": 0},
    "DCGM_FI_DEV_FB_USED": {"GPU-a0": 70000, "GPU-a1": 30000, "GPU-b0": 0},
    "DCGM_FI_DEV_POWER_USAGE": {"GPU-a0": 500, "GPU-a1": 300, "GPU-b0": 80},
    "DCGM_FI_DEV_GPU_TEMP": {"GPU-a0": 71, "GPU-a1": 64, "GPU-b0": 40},
    "DCGM_FI_DEV_XID_ERRORS": {"GPU-a0": 0, "GPU-a1": 79, "GPU-b0": 0},
}
DCGM_EXPECTED: dict[str, list[tuple[str, float]]] = {
    "GPUs in both": [("{}", 3)],
    "Not in DCGM": [("{}", 1)],
    "Borrowed GPUs' utilisation": [("{}", 40)],
    "XID on healthy GPUs": [("{}", 1)],
    "GPU utilisation by holder": [
        ('{holder="online"}', 90),
        ('{holder="borrower"}', 40),
        ('{holder="none"}', 0),
    ],
    "GPU utilisation by tier": [('{tier="HA"}', 65), ('{tier="LA"}', 0)],
    "Lent GPUs: utilisation by holder": [('{holder="borrower"}', 40), ('{holder="none"}', 0)],
    "Framebuffer used by holder": [
        ('{holder="online"}', 70000),
        ('{holder="borrower"}', 30000),
        ('{holder="none"}', 0),
    ],
    "Power by holder": [
        ('{holder="online"}', 500),
        ('{holder="borrower"}', 300),
        ('{holder="none"}', 80),
    ],
    "Hottest GPU by tier": [('{tier="HA"}', 71), ('{tier="LA"}', 40)],
    "Last XID error by GPU": [('{UUID="GPU-a1", health="healthy", node="a", tier="HA"}', 79)],
}


def test_the_dcgm_dashboard_reads_dcgm_by_tideleases_view_of_each_gpu(tmp_path: Path) -> None:
    model = dashboards()["tidelease-dcgm.json"]
    queries = {p["title"]: p["targets"][0]["expr"] for p in model["panels"] if p.get("targets")}
    assert set(queries) == set(DCGM_EXPECTED)
    series = []
    for instance in ("extender-0", "extender-1"):  # both replicas export every GPU
        for uuid, node, tier, health, holder, lent in DCGM_INFO:
            labels = (
                f'node="{node}",UUID="{uuid}",gpu_type="H20",tier="{tier}",health="{health}",'
                f'holder="{holder}",lent="{lent}",standby="false",instance="{instance}"'
            )
            series.append({"series": f"tidelease_cluster_gpu_info{{{labels}}}", "values": "1x5"})
    for metric, values in DCGM_SERIES.items():
        for i, (uuid, value) in enumerate(values.items()):
            labels = f'gpu="{i}",UUID="{uuid}",Hostname="dcgm-{uuid[4]}",modelName="NVIDIA H20"'
            series.append({"series": f"{metric}{{{labels}}}", "values": f"{value}x5"})
    cases = []
    for title, expected in DCGM_EXPECTED.items():
        expr = queries[title]
        for var, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(var, value)
        cases.append(
            {
                "expr": expr,
                "eval_time": "2m",
                "exp_samples": [{"labels": labels, "value": v} for labels, v in expected],
            }
        )
    path = tmp_path / "dcgm-test.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}],
            }
        )
    )
    done = promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_rule_tests_pass() -> None:
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}
    fired: set[str] = set()
    silent: set[str] = set()
    for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in t.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    assert fired == alerts
    assert silent == alerts
    for group in groups:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["for"], rule["alert"]
            assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]


# --- the chart ---


def test_the_chart_ships_nothing_of_it_by_default() -> None:
    objs = render()
    assert not [o for o in objs if o["kind"] == "PrometheusRule"]
    assert not [o for o in objs if "grafana_dashboard" in o["metadata"].get("labels", {})]


def test_the_chart_ships_the_dashboards_and_rules_unchanged() -> None:
    objs = render(
        "monitoring.dashboards.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
        "monitoring.dashboards.annotations.grafana_folder=tidelease",
    )
    for path in sorted(DASHBOARDS.glob("*.json")):
        name = "tidelease-dashboard-" + path.stem.removeprefix("tidelease-")
        cm = find(objs, "ConfigMap", name)
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "tidelease"}
        assert cm["metadata"]["namespace"] == "tidelease-system"
        assert cm["data"] == {path.name: path.read_text().rstrip("\n")}
    rule = find(objs, "PrometheusRule", "tidelease")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_the_dashboards_go_where_the_sidecar_looks() -> None:
    objs = render(
        "monitoring.dashboards.enabled=true",
        "monitoring.dashboards.namespace=monitoring",
        "monitoring.dashboards.label=dashboards",
        "monitoring.dashboards.labelValue=tidelease",
    )
    cm = find(objs, "ConfigMap", "tidelease-dashboard-gpus")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["dashboards"] == "tidelease"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]


def test_helm_lint_is_clean_with_monitoring_on() -> None:
    done = helm(
        "lint", "--strict", str(CHART), "--kube-version", kube_version(),
        "--set", "monitoring.dashboards.enabled=true",
        "--set", "monitoring.prometheusRule.enabled=true",
    )  # fmt: skip
    assert "0 chart(s) failed" in done.stdout, done.stdout


def test_the_schema_refuses_unknown_monitoring_values() -> None:
    done = helm(
        "template", "tidelease", str(CHART), "--kube-version", kube_version(),
        "--set", "monitoring.prometheusRule.typo=1",
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "typo" in done.stderr, done.stderr


# --- the extender serves the cluster's metrics ---


async def test_the_extender_serves_the_cluster_metrics(server: Server) -> None:
    async with server.session.get(f"{server.url}/metrics") as r:
        text = await r.text()
    # tests/integration/conftest.py's small cluster: 28 healthy H20/HA GPUs on four nodes (one
    # with four not healthy), eight LA, eight lent to job-b, eight standby; no agent's Lease.
    assert 'tidelease_cluster_gpus{gpu_type="H20",health="healthy",tier="HA"} 28.0' in text
    assert 'tidelease_cluster_gpus{gpu_type="H20",health="unhealthy",tier="HA"} 4.0' in text
    assert 'tidelease_cluster_gpus{gpu_type="H20",health="healthy",tier="LA"} 8.0' in text
    assert 'tidelease_cluster_gpus_lent{gpu_type="H20",tier="HA"} 8.0' in text
    assert 'tidelease_cluster_gpus_standby{gpu_type="H20",health="healthy",tier="HA"} 8.0' in text
    assert 'tidelease_cluster_node_unhealthy_gpus{node="node-c"} 4.0' in text
    assert 'tidelease_cluster_nodes{agent="no_heartbeat"} 5.0' in text


def test_every_metrics_endpoint_has_a_service_and_optionally_a_service_monitor() -> None:
    """The extender's, controllers' and orchestrator's /metrics each behind a Service whose
    port reaches a port of the selected pods; with monitoring.serviceMonitor a ServiceMonitor
    selecting each Service's port, scraped with the Prometheus' token, and the ClusterRole
    binding that lets that token in when the admin names the Prometheus' ServiceAccount."""
    objs = render()
    for component in ("extender", "controllers", "orchestrator"):
        service = find(objs, "Service", f"tidelease-{component}")
        deployment = find(objs, "Deployment", f"tidelease-{component}")
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == "metrics"]
        ports = {
            p["name"]
            for c in deployment["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports") or []
        }
        assert port["targetPort"] in ports, (component, port, ports)
    assert not [o for o in objs if o["kind"] == "ServiceMonitor"]
    on = render(
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
        "monitoring.serviceMonitor.prometheusServiceAccount.name=prometheus",
        "monitoring.serviceMonitor.prometheusServiceAccount.namespace=monitoring",
    )
    monitors = {o["metadata"]["name"]: o for o in on if o["kind"] == "ServiceMonitor"}
    assert set(monitors) == {
        "tidelease-extender",
        "tidelease-controllers",
        "tidelease-orchestrator",
    }
    for name, monitor in monitors.items():
        service = find(on, "Service", name)
        assert (
            monitor["spec"]["selector"]["matchLabels"].items()
            <= service["metadata"]["labels"].items()
        )
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
        assert endpoint["bearerTokenFile"].endswith("serviceaccount/token")
    binding = find(on, "ClusterRoleBinding", "tidelease-metrics-reader")
    assert binding["roleRef"]["name"] == "tidelease-metrics-reader"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    ]
