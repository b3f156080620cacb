"""The Helm chart, rendered by the real helm: it lints clean, its schema refuses bad values, both
scheduling modes render what they promise, and every tidelease command line it ships is one
the `tidelease` parser accepts."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import contract
from tests.chart import (
    CHART,
    NAMESPACE,
    ROOT,
    agent_pod,
    containers,
    find,
    helm,
    kube_version,
    render,
)


def test_helm_lint_is_clean_in_both_modes() -> None:
    for mode in ("ownScheduler", "clusterScheduler"):
        done = helm(
            "lint", "--strict", str(CHART), "--kube-version", kube_version(), "--set",
            f"scheduling.mode={mode}",
        )  # fmt: skip
        assert "0 chart(s) failed" in done.stdout, done.stdout


def test_the_chart_follows_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == package
    extender = find(render(), "Deployment", "tidelease-extender")
    assert containers(extender)["extender"]["image"] == f"tidelease:{package}"


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("scheduling.mode=kubeScheduler", "/scheduling/mode"),
        ("extender.port=0", "/extender/port"),
        ("agent.backend=cuda", "/agent/backend"),
        ("extender.replicas=0", "/extender/replicas"),
        ("extender.logLevel=LOUD", "/extender/logLevel"),
        ("extender.typo=1", "typo"),
        ("agent.cache.hostPath=relative/dir", "/agent/cache/hostPath"),
    ],
)
def test_the_schema_refuses_bad_values(value: str, complaint: str) -> None:
    done = helm(
        "template", "tidelease", str(CHART), "--kube-version", kube_version(), "--set", value,
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert complaint in done.stderr, done.stderr


def test_the_kueue_check_is_off_by_default_and_needs_the_leasing_controller() -> None:
    def flag_and_rules(objs: list[dict[str, Any]]) -> tuple[bool, list[dict[str, Any]]]:
        args = containers(find(objs, "Deployment", "tidelease-controllers"))["controllers"]["args"]
        role = find(objs, "ClusterRole", "tidelease-controllers")
        kueue = [r for r in role["rules"] if "kueue.x-k8s.io" in r["apiGroups"]]
        return "--kueue-admission-check" in args, kueue

    assert flag_and_rules(render()) == (False, [])
    on, rules = flag_and_rules(render("extender.controllers.kueue=true"))
    assert on
    assert rules == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["workloads", "admissionchecks"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["workloads/status", "admissionchecks/status"],
            "verbs": ["patch"],
        },
    ]
    done = helm(
        "template", "tidelease", str(CHART), "--kube-version", kube_version(),
        "--set", "extender.controllers.kueue=true", "--set", "extender.controllers.leasing=false",
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "extender.controllers.kueue needs extender.controllers.leasing" in done.stderr


def test_the_kueue_check_writes_only_the_checks_the_admin_names() -> None:
    """extender.controllers.kueueChecks: the controllers' setting kueue_checks, and the names
    the admission policy lets the controllers' token write (tests/e2e/test_kueue.py tries it)."""

    def names(objs: list[dict[str, Any]]) -> tuple[list[str], str]:
        settings = yaml.safe_load(
            find(objs, "ConfigMap", "tidelease-extender-settings")["data"]["settings.yaml"]
        )
        policy = find(objs, "ValidatingAdmissionPolicy", "tidelease-controllers-kueue")
        checks = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["checks"]
        return settings["kueue_checks"], checks

    off = render()
    assert not [o for o in off if o["metadata"]["name"] == "tidelease-controllers-kueue"]
    assert names(render("extender.controllers.kueue=true")) == (
        ["tidelease-lent-gpus"], '["tidelease-lent-gpus"]',
    )  # fmt: skip
    assert names(
        render("extender.controllers.kueue=true", "extender.controllers.kueueChecks={a,b.c}")
    ) == (["a", "b.c"], '["a","b.c"]')


def _scheduler_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = find(objs, "ConfigMap", "tidelease-scheduler-config")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return cfg


def test_own_scheduler_mode_keeps_the_verbs_on_loopback_beside_a_kube_scheduler() -> None:
    objs = render()
    pod = find(objs, "Deployment", "tidelease-extender")
    byname = containers(pod)
    assert set(byname) == {"extender", "kube-scheduler"}
    args = byname["extender"]["args"]
    assert "--host=127.0.0.1" in args
    assert "--probe-port=8889" in args
    # Only the probes' port is declared and served by the Service; no verbs port anywhere.
    assert [p["containerPort"] for p in byname["extender"]["ports"]] == [8889]
    service = find(objs, "Service", "tidelease-extender")
    assert [p["port"] for p in service["spec"]["ports"]] == [8889]
    cfg = _scheduler_config(objs)
    assert cfg["profiles"] == [{"schedulerName": "tidelease-scheduler"}]
    assert cfg["leaderElection"]["leaderElect"] is True
    assert cfg["leaderElection"]["resourceNamespace"] == NAMESPACE
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8888"
    volumes = {v["name"]: v for v in pod["spec"]["template"]["spec"]["volumes"]}
    assert volumes["scheduler-config"]["configMap"]["name"] == "tidelease-scheduler-config"
    binding = find(objs, "ClusterRoleBinding", "tidelease-scheduler")
    assert binding["roleRef"]["name"] == "tidelease-scheduler"
    # The scheduler's Leases are the extender's, in the release's namespace only.
    role = find(objs, "ClusterRole", "tidelease-scheduler")
    assert not [r for r in role["rules"] if "coordination.k8s.io" in r["apiGroups"]]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tidelease-extender", "namespace": NAMESPACE}
    ]


def test_gang_scheduling_turns_on_the_own_schedulers_gates_and_its_read_of_workloads() -> None:
    def gates_and_rules(objs: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
        scheduler = containers(find(objs, "Deployment", "tidelease-extender"))["kube-scheduler"]
        role = find(objs, "ClusterRole", "tidelease-scheduler")
        gates = [a for a in scheduler["command"] if a.startswith("--feature-gates")]
        return gates, [r for r in role["rules"] if "scheduling.k8s.io" in r["apiGroups"]]

    assert gates_and_rules(render()) == ([], [])  # off by default
    gates, rules = gates_and_rules(render("scheduling.gangScheduling=true"))
    assert gates == ["--feature-gates=GenericWorkload=true,GangScheduling=true"]
    assert rules == [
        {
            "apiGroups": ["scheduling.k8s.io"],
            "resources": ["workloads"],
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_cluster_scheduler_mode_serves_the_verbs_through_the_service() -> None:
    objs = render("scheduling.mode=clusterScheduler")
    pod = find(objs, "Deployment", "tidelease-extender")
    byname = containers(pod)
    assert set(byname) == {"extender"}
    assert "--host=0.0.0.0" in byname["extender"]["args"]
    service = find(objs, "Service", "tidelease-extender")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "verbs": 8888,
        "metrics": 8889,
    }
    cfg = _scheduler_config(objs)
    assert "profiles" not in cfg
    assert "leaderElection" not in cfg
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"] == f"https://tidelease-extender.{NAMESPACE}.svc:8888"
    assert (
        ext["enableHTTPS"] is True
    )  # with a client certificate: tests/integration/test_chart_tls.py
    # No kube-scheduler of its own, so none of its RBAC.
    assert not [o for o in objs if o["kind"].endswith("RoleBinding") and "scheduler" in str(o)]


@pytest.mark.parametrize("mode", ["ownScheduler", "clusterScheduler"])
def test_the_scheduler_configuration_registers_every_verb(mode: str) -> None:
    (ext,) = _scheduler_config(render(f"scheduling.mode={mode}"))["extenders"]
    verbs = (ext["filterVerb"], ext["prioritizeVerb"], ext["preemptVerb"], ext["bindVerb"])
    assert verbs == ("filter", "prioritize", "preempt", "bind")
    assert ext["nodeCacheCapable"] is True
    assert ext["managedResources"] == [
        {"name": contract.DEFAULT_GPU_RESOURCE, "ignoredByScheduler": False}
    ]
    assert ext["ignorable"] is False
    assert _scheduler_config(render(f"scheduling.mode={mode}"))["percentageOfNodesToScore"] == 100


def test_each_part_can_be_switched_off() -> None:
    everything = {(o["kind"], o["metadata"]["name"]) for o in render()}
    for part, gone in (
        ("extender", ("Deployment", "tidelease-extender")),
        ("agent", ("DaemonSet", "tidelease-agent")),
        ("orchestrator", ("Deployment", "tidelease-orchestrator")),
    ):
        assert gone in everything
        left = {(o["kind"], o["metadata"]["name"]) for o in render(f"{part}.enabled=false")}
        assert gone not in left
        assert not any(name.startswith(f"tidelease-{part}") for _, name in left), part
    left = {o["kind"] for o in render("priorityClasses.create=false")}
    assert "PriorityClass" not in left
    # The CRDs always come (helm installs them once and never deletes them).
    crds = [o for o in render("extender.enabled=false") if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 3


def test_the_agent_mounts_only_what_its_parts_need() -> None:
    full = agent_pod("agent.hotRestart.enabled=true")
    assert {v["name"] for v in full["volumes"]} == {
        "kube-api-access",
        "device-plugins",
        "cri",
        "cache",
        "peer-cache-token",
    }
    bare = agent_pod("agent.cache.enabled=false")
    assert [v["name"] for v in bare["volumes"]] == ["kube-api-access", "device-plugins"]
    args = bare["containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--cri-endpoint", "--cache-"))], args


def test_the_peer_cache_has_per_node_identity_and_no_shared_secret() -> None:
    """Each agent presents its own pod-bound token for the cache's audience and checks its
    peers' with a TokenReview: no Secret of the chart's holds a cache token."""
    objs = render()
    assert not [o for o in objs if o["kind"] == "Secret" and "cache" in o["metadata"]["name"]]
    pod = agent_pod()
    (volume,) = [v for v in pod["volumes"] if v["name"] == "peer-cache-token"]
    (source,) = volume["projected"]["sources"]
    assert source["serviceAccountToken"] == {
        "path": "token",
        "audience": "tidelease-peer-cache",
        "expirationSeconds": 3600,
    }
    args = pod["containers"][0]["args"]
    assert "--cache-token-file=/var/run/secrets/tidelease/peer-cache/token" in args
    assert "--cache-audience=tidelease-peer-cache" in args
    assert "--cache-peer-account=tidelease-agent" in args
    rules = find(objs, "ClusterRole", "tidelease-agent")["rules"]
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
            "verbs": ["create"]} in rules  # fmt: skip
    off = find(render("agent.cache.enabled=false"), "ClusterRole", "tidelease-agent")["rules"]
    assert not [r for r in off if "tokenreviews" in r["resources"]]


SA = "/var/run/secrets/kubernetes.io/serviceaccount"
# The agent's mounts by default (no hot restart): mount path -> (volume, read-only).
DEFAULT_MOUNTS = {
    "/var/lib/kubelet/device-plugins": ("device-plugins", False),
    SA: ("kube-api-access", True),
    "/var/cache/tidelease": ("cache", False),
    "/var/run/secrets/tidelease/peer-cache": ("peer-cache-token", True),
}
DEFAULT_HOST_PATHS = {
    "device-plugins": ("/var/lib/kubelet/device-plugins", "Directory"),
    "cache": ("/var/cache/tidelease", "DirectoryOrCreate"),
}


def _mounts(pod: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    (agent,) = pod["containers"]
    return {m["mountPath"]: (m["name"], m.get("readOnly", False)) for m in agent["volumeMounts"]}


def _host_paths(pod: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        v["name"]: (v["hostPath"]["path"], v["hostPath"]["type"])
        for v in pod["volumes"]
        if "hostPath" in v
    }


def _least_privilege(pod: dict[str, Any]) -> None:
    """Root (the device-plugin directory and kubelet.sock are root's) with nothing else: no
    capability, no escalation, a read-only root, RuntimeDefault seccomp, none of the host's
    namespaces."""
    assert pod["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (agent,) = pod["containers"]
    assert agent["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
    }
    assert not {"hostPID", "hostIPC", "hostNetwork"} & set(pod)
    assert pod["automountServiceAccountToken"] is False
    assert pod["runtimeClassName"] == "nvidia"  # NVML's device nodes, not a /dev host path


def test_the_default_agent_runs_with_the_least_privileges_and_no_cri_socket() -> None:
    pod = agent_pod()
    _least_privilege(pod)
    assert _mounts(pod) == DEFAULT_MOUNTS
    assert _host_paths(pod) == DEFAULT_HOST_PATHS
    (agent,) = pod["containers"]
    assert not [a for a in agent["args"] if a.startswith("--cri-endpoint")], agent["args"]
    assert "containerd" not in yaml.safe_dump(pod)
    role = find(render(), "ClusterRole", "tidelease-agent")
    assert "events" not in {r for rule in role["rules"] for r in rule["resources"]}


def test_hot_restart_opts_in_to_the_cri_socket_and_nothing_more() -> None:
    values = ("agent.hotRestart.enabled=true", "agent.hotRestart.criSocket=/run/k3s/cri.sock")
    pod = agent_pod(*values)
    _least_privilege(pod)
    assert _mounts(pod) == {**DEFAULT_MOUNTS, "/run/tidelease/cri.sock": ("cri", False)}
    assert _host_paths(pod) == {**DEFAULT_HOST_PATHS, "cri": ("/run/k3s/cri.sock", "Socket")}
    (agent,) = pod["containers"]
    assert "--cri-endpoint=unix:///run/tidelease/cri.sock" in agent["args"]
    role = find(render(*values), "ClusterRole", "tidelease-agent")
    events = [rule for rule in role["rules"] if "events" in rule["resources"]]
    assert events == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_the_api_server_override_reaches_every_container() -> None:
    objs = render("kubernetesAPI.host=10.88.0.1", "kubernetesAPI.port=6443")
    seen = 0
    for obj in objs:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            for c in containers(obj).values():
                env = {e["name"]: e.get("value") for e in c.get("env") or []}
                assert env["KUBERNETES_SERVICE_HOST"] == "10.88.0.1", c["name"]
                assert env["KUBERNETES_SERVICE_PORT"] == "6443", c["name"]
                seen += 1
    assert seen == 5  # extender, kube-scheduler, controllers, agent, orchestrator


def test_the_controllers_run_in_a_deployment_of_their_own() -> None:
    """The extender's pods serve the verbs only; each controller switched on is a flag of the
    controllers Deployment, whose ServiceAccount holds the writes the extender no longer has."""
    objs = render(
        "extender.controllers.planner=true", "extender.controllers.hotRestartOperator=true"
    )
    extender = containers(find(objs, "Deployment", "tidelease-extender"))["extender"]["args"]
    assert not [a for a in extender if "controller" in a or "planner" in a or "operator" in a]
    deployment = find(objs, "Deployment", "tidelease-controllers")
    args = containers(deployment)["controllers"]["args"]
    assert args[1] == "controllers"
    for flag in (
        "--leasing-controller",
        "--hot-restart-operator",
        "--agent-conditions",
        "--prewarm-controller",
        "--planner",
    ):
        assert flag in args, flag
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "tidelease-controllers"
    rules = find(objs, "ClusterRole", "tidelease-extender")["rules"]
    extender_verbs = {(r["resources"][0], v) for r in rules for v in r["verbs"]}
    for write in (("pods", "patch"), ("pods", "delete"), ("pods/eviction", "create")):
        assert write not in extender_verbs, write
    # Off, all of them: no Deployment, no ServiceAccount.
    off = render(
        *(f"extender.controllers.{c}=false" for c in ("leasing", "prewarm", "agentConditions"))
    )
    assert not [o for o in off if "tidelease-controllers" in o["metadata"]["name"]]


def test_the_settings_file_is_valid_and_names_the_release_namespace(tmp_path: Path) -> None:
    from extender.scheduler.settings import load_settings

    cm = find(
        render("extender.settings.standby.H20/HA=16"), "ConfigMap", "tidelease-extender-settings"
    )
    f = tmp_path / "settings.yaml"
    f.write_text(cm["data"]["settings.yaml"])
    settings = load_settings(file=f, env={})
    assert settings.agent_namespace == NAMESPACE
    assert settings.standby == {"H20/HA": 16}


@pytest.mark.parametrize("mode", ["ownScheduler", "clusterScheduler"])
def test_the_queues_release_key_is_a_secret_both_deployments_mount_and_the_settings_name(
    mode: str, tmp_path: Path
) -> None:
    """With the queues on: the Secret the queues controller makes in the cluster (none rendered:
    `helm template` stays the same), mounted read-only (optional: it fills in once made) into
    the extender's and the controllers' pods; the settings file's queue_release_key_file
    points into that mount and names the Secret. No Role of the chart reads it."""
    from extender.scheduler.settings import load_settings

    objs = render("extender.controllers.queues=true", f"scheduling.mode={mode}")
    assert not [o for o in objs if o["kind"] == "Secret"]
    secret = {"metadata": {"name": "tidelease-queue-release-key"}}
    settings_yaml = find(objs, "ConfigMap", "tidelease-extender-settings")["data"]["settings.yaml"]
    assert yaml.safe_load(settings_yaml)["queue_release_secret"] == secret["metadata"]["name"]
    key_file = Path(yaml.safe_load(settings_yaml)["queue_release_key_file"])
    for name, container in (
        ("tidelease-extender", "extender"),
        ("tidelease-controllers", "controllers"),
    ):
        spec = find(objs, "Deployment", name)["spec"]["template"]["spec"]
        (volume,) = [
            v
            for v in spec["volumes"]
            if v.get("secret", {}).get("secretName") == secret["metadata"]["name"]
        ]
        assert volume["secret"]["defaultMode"] == 0o440
        assert volume["secret"]["optional"] is True
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
        (mount,) = [
            m
            for m in containers({"spec": {"template": {"spec": spec}}})[container]["volumeMounts"]
            if m["name"] == volume["name"]
        ]
        assert mount["readOnly"] is True
        assert key_file.parent == Path(mount["mountPath"]), name
    for role in (o for o in objs if o["kind"] in ("Role", "ClusterRole")):
        for rule in role.get("rules") or []:
            assert secret["metadata"]["name"] not in rule.get("resourceNames", []), role
    # The settings load before the Secret exists (its pods start; queue pods wait), and read
    # the key once the mount has it.
    key = tmp_path / "key"
    f = tmp_path / "settings.yaml"
    f.write_text(settings_yaml)
    env = {"TIDELEASE_EXTENDER_QUEUE_RELEASE_KEY_FILE": str(key)}
    settings = load_settings(file=f, env=env)
    assert settings.queue_release_key() == b""  # refuses every queue pod meanwhile
    key.write_bytes(b"k" * 64)
    assert settings.queue_release_key() == b"k" * 64

    # Queues off (the default): no Secret, no mount, no setting.
    off = render()
    assert not [o for o in off if o["metadata"]["name"] == "tidelease-queue-release-key"]
    settings_off = find(off, "ConfigMap", "tidelease-extender-settings")["data"]["settings.yaml"]
    assert "queue_release_key_file" not in yaml.safe_load(settings_off)
    assert "queue-release" not in yaml.safe_dump(find(off, "Deployment", "tidelease-extender"))


@pytest.mark.parametrize(
    "values",
    [(), ("scheduling.mode=clusterScheduler", "extender.controllers.planner=true"),
     ("agent.backend=fake", "agent.hostDeviceRoot=/srv/fake"), ("dra.enabled=true",)],
    ids=["defaults", "cluster-scheduler-with-planner", "fake-gpus", "dra"],
)  # fmt: skip
def test_every_tidelease_command_line_is_one_tidelease_accepts(values: tuple[str, ...]) -> None:
    """Every flag the chart ships exists, with a value of the right form (a renamed or
    mistyped flag would crash-loop the pods)."""
    from common.cli import parser

    checked = 0
    for obj in render(*values):
        if obj["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for c in containers(obj).values():
            if not c["image"].startswith("tidelease:"):
                continue
            args = [a.replace("$(POD_IP)", "10.0.0.7") for a in c["args"]]
            try:
                parsed = parser().parse_args(args)
            except SystemExit:
                pytest.fail(f"{obj['metadata']['name']}: tidelease rejects {args}")
            assert callable(parsed.run)
            checked += 1
    assert checked == 4  # extender, controllers, agent, orchestrator


def test_every_pod_mounts_its_token_itself_and_runs_with_a_restricted_container() -> None:
    """The token is mounted explicitly (the pods run where the ServiceAccount admission plugin
    is off); every container drops all capabilities and keeps its root file system read-only."""
    for obj in render():
        if obj["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = obj["spec"]["template"]["spec"]
        # The Service tidelease-extender's link variables would read as extender settings.
        assert spec["enableServiceLinks"] is False
        assert spec["automountServiceAccountToken"] is False
        (volume,) = [v for v in spec["volumes"] if v["name"] == "kube-api-access"]
        sources = volume["projected"]["sources"]
        assert {next(iter(s)) for s in sources} == {
            "serviceAccountToken",
            "configMap",
            "downwardAPI",
        }
        for c in spec["containers"]:
            mounts = {m["name"]: m for m in c["volumeMounts"]}
            mount = mounts["kube-api-access"]
            assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize(
    ("mode", "served"),
    [("ownScheduler", ("tidelease-scheduler",)), ("clusterScheduler", ("default-scheduler",))],
)
def test_bind_serves_only_the_scheduler_of_the_mode(
    tmp_path: Path, mode: str, served: tuple[str, ...]
) -> None:
    from extender.scheduler.settings import load_settings

    cm = find(render(f"scheduling.mode={mode}"), "ConfigMap", "tidelease-extender-settings")
    f = tmp_path / "settings.yaml"
    f.write_text(cm["data"]["settings.yaml"])
    assert load_settings(file=f, env={}).scheduler_names == served


# networkPolicies.metricsFrom's default: the Prometheus Operator's Prometheus pods.
PROMETHEUS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
]


def test_network_policies_admit_only_the_scheduler_to_the_verbs() -> None:
    own = find(render(), "NetworkPolicy", "tidelease-extender")["spec"]["ingress"]
    # ownScheduler: no rule names the verbs' port (they listen on loopback in the pod).
    assert [[p["port"] for p in rule["ports"]] for rule in own] == [[8889, 10259]]
    cluster = find(
        render("scheduling.mode=clusterScheduler", "networkPolicies.schedulerCIDRs={10.0.0.0/24}"),
        "NetworkPolicy",
        "tidelease-extender",
    )["spec"]["ingress"]
    assert cluster == [
        {"from": PROMETHEUS, "ports": [{"port": 8889, "protocol": "TCP"}]},
        {
            "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
            "ports": [{"port": 8888, "protocol": "TCP"}],
        },
    ]
    # Without scheduler addresses, the verbs are reachable from nowhere.
    closed = find(render("scheduling.mode=clusterScheduler"), "NetworkPolicy", "tidelease-extender")
    assert [[p["port"] for p in r["ports"]] for r in closed["spec"]["ingress"]] == [[8889]]
    cache = find(render(), "NetworkPolicy", "tidelease-agent")["spec"]["ingress"]
    (rule,) = cache
    assert rule["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "tidelease-agent",
                    "app.kubernetes.io/instance": "tidelease",
                }
            }
        }
    ]
    assert rule["ports"] == [{"port": 8477, "protocol": "TCP"}]


def pod_templates(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, pod template) of every workload the chart renders."""
    out = []
    for o in objs:
        spec = o.get("spec") or {}
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
            template = spec["template"]
        elif o["kind"] == "CronJob":
            template = spec["jobTemplate"]["spec"]["template"]
        elif o["kind"] == "Pod":
            template = o
        else:
            continue
        out.append((f"{o['kind']}/{o['metadata']['name']}", template))
    return out


def policies_of(objs: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """The ingress NetworkPolicies whose podSelector (matchLabels) selects ``labels``."""
    out = []
    for o in objs:
        if o["kind"] != "NetworkPolicy" or "Ingress" not in o["spec"].get("policyTypes", []):
            continue
        selector = o["spec"]["podSelector"]
        assert set(selector) <= {"matchLabels"}, selector  # what this check understands
        if (selector.get("matchLabels") or {}).items() <= labels.items():
            out.append(o)
    return out


@pytest.mark.parametrize(
    "values",
    [
        pytest.param((), id="defaults"),
        pytest.param(
            ("scheduling.mode=clusterScheduler", "networkPolicies.schedulerCIDRs={10.0.0.0/24}"),
            id="cluster-scheduler",
        ),
        pytest.param(
            (
                "extender.controllers.hotRestartOperator=true",
                "extender.controllers.queues=true",
                "agent.hotRestart.enabled=true",
                "queues.gatePolicy=true",
            ),
            id="everything-on",
        ),
        pytest.param(("agent.cache.enabled=false",), id="no-cache"),
    ],
)
def test_every_pod_and_every_container_port_is_under_a_network_policy(
    values: tuple[str, ...],
) -> None:
    objs = render(*values)
    templates = pod_templates(objs)
    assert templates
    for name, template in templates:
        assert not template["spec"].get("hostNetwork"), name  # policies would not apply
        policies = policies_of(objs, template["metadata"].get("labels") or {})
        assert policies, f"{name}: no NetworkPolicy selects its pods"
        admitted = {
            port.get("port")
            for policy in policies
            for rule in policy["spec"].get("ingress") or []
            for port in rule.get("ports") or []
        }
        spec = template["spec"]
        every = spec.get("containers", []) + spec.get("initContainers", [])
        for container in every:
            for port in container.get("ports") or []:
                assert {port["containerPort"], port.get("name")} & admitted, (
                    f"{name}: port {port} of {container['name']} is in no NetworkPolicy"
                )


def test_probe_and_metrics_ports_are_admitted_from_the_nodes_and_the_scrapers_only() -> None:
    def ingress(*args: str) -> dict[str, list[dict[str, Any]]]:
        out = helm(
            "template", "tidelease", str(CHART), "--namespace", NAMESPACE,
            "--kube-version", kube_version(), *args,
        ).stdout  # fmt: skip
        return {
            o["metadata"]["name"]: o["spec"]["ingress"]
            for o in yaml.safe_load_all(out)
            if o and o["kind"] == "NetworkPolicy"
        }

    probes = {"tidelease-extender": 8889, "tidelease-controllers": 8891}
    probes["tidelease-orchestrator"] = 8890
    # Defaults: the scrapers (Prometheus in monitoring); the kubelet as the pod's own node.
    for name, port in probes.items():
        (rule, *_) = ingress()[name]
        assert rule["from"] == PROMETHEUS, name
        assert {"port": port, "protocol": "TCP"} in rule["ports"]
    # Nodes named, scrapers elsewhere.
    scraper = {"namespaceSelector": {"matchLabels": {"team": "observability"}}}
    named = ingress(
        "--set", "networkPolicies.nodeCIDRs={192.168.10.0/24}",
        "--set-json", f"networkPolicies.metricsFrom=[{json.dumps(scraper)}]",
    )  # fmt: skip
    for name in probes:
        (rule,) = named[name]
        assert rule["from"] == [{"ipBlock": {"cidr": "192.168.10.0/24"}}, scraper], name
    # Neither: no rule (an empty `from` would admit every source), so nothing but the node.
    closed = ingress("--set-json", "networkPolicies.metricsFrom=[]")
    for name in probes:
        assert closed[name] == [], name
    assert closed["tidelease-agent"] != []  # the peer cache: the other agents


def test_the_admission_policies_are_the_generated_ones_and_can_be_switched_off() -> None:
    """The chart's policies are common.admissionpolicy's, byte for byte in their specs, with
    the release's namespace and online PriorityClass (the templates are generated;
    tests/unit/test_admission_policy.py keeps them fresh), and their bindings enforce them."""
    from common import admissionpolicy

    names = {
        admissionpolicy.POLICY_NAME,
        admissionpolicy.ONLINE_POLICY_NAME,
        admissionpolicy.WRITTEN_POLICY_NAME,
    }
    for sets, online_class, trusted in (
        ((), "tidelease-online", ()),
        (("priorityClasses.online.name=gold",), "gold", ()),
        (
            ("admissionPolicy.trustedUsers={ops-runner,ci}",),
            "tidelease-online",
            ("ops-runner", "ci"),
        ),
    ):
        rendered = {
            (o["kind"], o["metadata"]["name"]): o
            for o in render(*sets)
            if o["metadata"]["name"] in names
        }
        want = {
            (o["kind"], o["metadata"]["name"]): o
            for o in admissionpolicy.objects(NAMESPACE, online_class, trusted)
        }
        assert rendered.keys() == want.keys()
        for key, obj in want.items():
            assert rendered[key]["spec"] == obj["spec"], key
            if key[0] == "ValidatingAdmissionPolicyBinding":
                assert obj["spec"]["validationActions"] == ["Deny"]
    left = render("admissionPolicy.enabled=false")
    assert not [o for o in left if o["metadata"]["name"] in names]


def test_values_a_previous_release_lacks_take_their_defaults() -> None:
    """`helm upgrade --reuse-values` from a release made before these values keeps its own
    values, without the new keys: the chart renders, with the new parts as by default."""
    from common import admissionpolicy

    objs = render("admissionPolicy=null", "monitoring=null", "queues=null", "dra=null")
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("ValidatingAdmissionPolicy", admissionpolicy.POLICY_NAME) in names
    assert ("ValidatingAdmissionPolicy", admissionpolicy.ONLINE_POLICY_NAME) in names
    assert not [
        n for k, n in names if k in ("PrometheusRule", "MutatingAdmissionPolicy", "DeviceClass")
    ]


def test_dra_mode_installs_the_classes_and_turns_the_agents_into_dra_drivers() -> None:
    """dra.enabled: common.deviceattributes's DeviceClasses; agents that serve DRA and no device
    plugin (the kubelet would offer the GPUs twice), with the kubelet's plugin dirs and the CDI dir
    mounted at the host's paths, and RBAC for their slices and claims; nothing of it by default."""
    from common import deviceattributes

    objs = render("dra.enabled=true")
    classes = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "DeviceClass"}
    assert classes == {c["metadata"]["name"]: c["spec"] for c in deviceattributes.device_classes()}
    pod = agent_pod("dra.enabled=true")
    args = pod["containers"][0]["args"]
    assert "--dra" in args
    assert "--no-device-plugin" in args
    mounts = _mounts(pod)
    paths = _host_paths(pod)
    for path in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi"):
        name, read_only = mounts[path]
        assert not read_only
        assert paths[name][0] == path  # the kubelet dials the path the plugin registers
    assert "/var/lib/kubelet/device-plugins" not in mounts
    _least_privilege(pod)
    role = find(objs, "ClusterRole", "tidelease-agent")
    granted = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert granted[("resource.k8s.io", "resourceslices")] == {
        "get", "list", "watch", "create", "update", "delete"
    }  # fmt: skip
    assert granted[("resource.k8s.io", "resourceclaims")] == {"get"}
    assert ("resource.k8s.io", "resourceclaims/status") not in granted

    default = render()
    assert not [o for o in default if o["kind"] == "DeviceClass"]
    assert "--dra" not in agent_pod()["containers"][0]["args"]
    default_role = find(default, "ClusterRole", "tidelease-agent")
    assert not [r for r in default_role["rules"] if "resource.k8s.io" in r["apiGroups"]]


def test_dra_mode_has_the_leasing_controller_pin_claims() -> None:
    """dra.enabled: the controllers' settings say dra, and their role lets them read claims
    and write a returning replica's (finalizer, allocation); nothing of it by default."""

    def granted(objs: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
        role = find(objs, "ClusterRole", "tidelease-controllers")
        return {
            (g, r): set(rule["verbs"])
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
        }

    def settings(objs: list[dict[str, Any]]) -> dict[str, Any]:
        config = find(objs, "ConfigMap", "tidelease-extender-settings")
        loaded: dict[str, Any] = yaml.safe_load(config["data"]["settings.yaml"])
        return loaded

    objs = render("dra.enabled=true")
    assert settings(objs)["dra"] is True
    dra_rules = {k: v for k, v in granted(objs).items() if k[0] == "resource.k8s.io"}
    assert dra_rules == {
        ("resource.k8s.io", "resourceclaims"): {"get", "list", "watch", "patch"},
        ("resource.k8s.io", "resourceclaims/status"): {"patch"},
    }
    default = render()
    assert "dra" not in settings(default)
    assert not [k for k in granted(default) if k[0] == "resource.k8s.io"]


def test_dra_only_mode_keeps_the_controllers_without_the_extender() -> None:
    """dra.enabled with extender.enabled=false: kube-scheduler's own DRA places the claims, so
    no extender, no scheduler of tidelease's and no scheduler configuration; the controllers
    still run (the leasing controller lends and pins returning claims) with their settings,
    RBAC, admission policies and network policy. Without DRA, extender.enabled=false leaves no
    controllers (nothing would place what they lend)."""
    objs = render("dra.enabled=true", "extender.enabled=false")
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("Deployment", "tidelease-extender") not in names
    assert not [n for k, n in names if k == "ConfigMap" and n == "tidelease-scheduler-config"]
    args = containers(find(objs, "Deployment", "tidelease-controllers"))["controllers"]["args"]
    assert "--leasing-controller" in args
    settings = yaml.safe_load(
        find(objs, "ConfigMap", "tidelease-extender-settings")["data"]["settings.yaml"]
    )
    assert settings["dra"] is True
    for kind, name in (("ClusterRole", "tidelease-controllers"),
                       ("ValidatingAdmissionPolicy", "tidelease-controllers-pods"),
                       ("NetworkPolicy", "tidelease-controllers"),
                       ("DaemonSet", "tidelease-agent")):  # fmt: skip
        assert (kind, name) in names, (kind, name)
    plain = {(o["kind"], o["metadata"]["name"]) for o in render("extender.enabled=false")}
    assert ("Deployment", "tidelease-controllers") not in plain
    done = helm(
        "lint", "--strict", str(CHART), "--kube-version", kube_version(),
        "--set", "dra.enabled=true", "--set", "extender.enabled=false",
    )  # fmt: skip
    assert "0 chart(s) failed" in done.stdout, done.stdout
