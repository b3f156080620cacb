"""The chart's conventions for where tidelease's own pods go and what an admin adds to them
(issue 38): the extender's replicas never on one node (required anti-affinity: kube-scheduler
calls every replica's verbs, so one node's drain must not stop GPU scheduling) and a
PodDisruptionBudget for each replicated component; per-component scheduling values (the
controllers' falling back to the extender's); the admin's pod labels, annotations and
environment on every workload."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.chart import CHART, containers, find, helm, render

REPLICATED = ("extender", "controllers", "orchestrator")
WORKLOADS = (("Deployment", "extender"), ("Deployment", "controllers"),
             ("Deployment", "orchestrator"), ("DaemonSet", "agent"))  # fmt: skip


def pod_spec(objs: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(objs, kind, f"tidelease-{component}")["spec"]["template"]["spec"]
    return spec


def anti_affinity(spec: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    """(required or preferred, the selector it keeps apart) on kubernetes.io/hostname."""
    anti = (spec.get("affinity") or {}).get("podAntiAffinity") or {}
    for term in anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        assert term["topologyKey"] == "kubernetes.io/hostname"
        return "required", term["labelSelector"]["matchLabels"]
    for weighted in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        term = weighted["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        return "preferred", term["labelSelector"]["matchLabels"]
    return None


def test_the_extenders_replicas_never_share_a_node_and_the_others_prefer_not_to() -> None:
    objs = render()
    for component, want in (("extender", "required"), ("controllers", "preferred"),
                            ("orchestrator", "preferred")):  # fmt: skip
        deployment = find(objs, "Deployment", f"tidelease-{component}")
        selector = deployment["spec"]["selector"]["matchLabels"]
        got = anti_affinity(deployment["spec"]["template"]["spec"])
        assert got == (want, selector), component  # its own replicas, by their selector
    assert anti_affinity(pod_spec(render("extender.antiAffinity=preferred"), "Deployment",
                                      "extender")) is not None  # fmt: skip
    assert anti_affinity(pod_spec(render("extender.antiAffinity=none"), "Deployment",
                                      "extender")) is None  # fmt: skip
    # An affinity of the admin's replaces the default whole.
    mine = pod_spec(render("extender.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring"
                           "Execution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
                           "extender.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring"
                           "Execution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists"),
                    "Deployment", "extender")  # fmt: skip
    assert list(mine["affinity"]) == ["nodeAffinity"]
    spread = pod_spec(render("extender.spreadZones=true"), "Deployment", "extender")
    (constraint,) = spread["topologySpreadConstraints"]
    assert constraint["topologyKey"] == "topology.kubernetes.io/zone"
    assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"


def test_each_replicated_component_has_a_disruption_budget_of_one() -> None:
    objs = render()
    for component in REPLICATED:
        pdb = find(objs, "PodDisruptionBudget", f"tidelease-{component}")
        deployment = find(objs, "Deployment", f"tidelease-{component}")
        assert pdb["spec"] == {
            "maxUnavailable": 1, "selector": {"matchLabels": deployment["spec"]["selector"]
                                              ["matchLabels"]},
        }  # fmt: skip
    budgets = {o["metadata"]["name"] for o in objs if o["kind"] == "PodDisruptionBudget"}
    assert budgets == {f"tidelease-{c}" for c in REPLICATED}
    fewer = render("extender.replicas=1", "controllers.podDisruptionBudget=false")
    left = {o["metadata"]["name"] for o in fewer if o["kind"] == "PodDisruptionBudget"}
    assert left == {"tidelease-orchestrator"}


def test_the_controllers_are_placed_by_their_own_values_else_the_extenders() -> None:
    inherited = pod_spec(render("extender.nodeSelector.pool=control",
                                "extender.priorityClassName=tl-control"),
                         "Deployment", "controllers")  # fmt: skip
    assert inherited["nodeSelector"] == {"pool": "control"}
    assert inherited["priorityClassName"] == "tl-control"
    own = pod_spec(render("extender.nodeSelector.pool=control", "controllers.nodeSelector.pool=c2",
                          "controllers.priorityClassName=tl-c2"),
                   "Deployment", "controllers")  # fmt: skip
    assert own["nodeSelector"] == {"pool": "c2"}
    assert own["priorityClassName"] == "tl-c2"
    agent = pod_spec(render("agent.affinity.podAffinity.x=y"), "DaemonSet", "agent")
    assert agent["affinity"] == {"podAffinity": {"x": "y"}}


@pytest.mark.parametrize(("kind", "component"), WORKLOADS)
def test_the_admins_labels_annotations_and_environment_reach_the_pods(
    kind: str, component: str
) -> None:
    objs = render(
        "podLabels.team=ml", "podLabels.tier=a", "podAnnotations.note=all",
        f"{component}.podLabels.tier=b", f"{component}.podAnnotations.only=me",
        f"{component}.podLabels.app\\.kubernetes\\.io/name=hijack",
        f"{component}.extraEnv[0].name=HTTPS_PROXY",
        f"{component}.extraEnv[0].value=http://proxy:3128",
    )  # fmt: skip
    workload = find(objs, kind, f"tidelease-{component}")
    meta = workload["spec"]["template"]["metadata"]
    assert meta["labels"]["team"] == "ml"
    assert meta["labels"]["tier"] == "b"  # the component's own wins
    # never the selector's labels: the workload would lose its pods
    assert meta["labels"]["app.kubernetes.io/name"] == f"tidelease-{component}"
    assert workload["spec"]["selector"]["matchLabels"].items() <= meta["labels"].items()
    assert {"note": "all", "only": "me"}.items() <= meta["annotations"].items()
    first = workload["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in first["env"]


def test_the_own_schedulers_image_follows_the_cluster_or_is_refused_outside_the_skew() -> None:
    def image(kube: str, *values: str) -> str:
        out = helm(
            "template", "tidelease", str(CHART), "--kube-version", kube,
            *(a for v in values for a in ("--set", v)), "--show-only",
            "templates/extender-deployment.yaml", check=False,
        )  # fmt: skip
        if out.returncode != 0:
            return out.stderr
        (deployment,) = [
            d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"
        ]
        return str(containers(deployment)["kube-scheduler"]["image"])

    assert image("1.35.4") == "registry.k8s.io/kube-scheduler:v1.35.4"
    assert image("1.34.2+k3s1") == "registry.k8s.io/kube-scheduler:v1.34.2"
    tag = "scheduling.kubeScheduler.image.tag"
    assert image("1.35.0", f"{tag}=v1.34.9").endswith(":v1.34.9")  # one minor older: allowed
    assert image("1.35.0", f"{tag}=locally-built").endswith(":locally-built")  # not a version
    for kube, want in (("1.34.2", "v1.35.4"), ("1.36.1", "v1.34.0")):
        refused = image(kube, f"{tag}={want}")
        assert f"{tag} {want} is outside Kubernetes' version skew" in refused, refused
