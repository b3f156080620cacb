"""The whole stack installed as an admin would, from the chart, with the image built here.

A real kubelet node of its own (hack/realnode.sh -a: no agent beside it, 8 stand-in GPU device
nodes) joins the local cluster; the tidelease image and a kube-scheduler image, both built on
this machine (hack/build-image.sh), are imported into its containerd: nothing is pulled. `helm
install` then runs, as pods on that node, the extender (2 replicas, each with its own
kube-scheduler, scheduling.mode=ownScheduler), the orchestrator and the agent DaemonSet (fake
NVML). The release lives in a namespace of its own, so the session cluster's host extender and
agents do not mix with it: each side counts only the agents that heartbeat in its namespace.

The cluster has no kube-proxy, so the pods reach the API server through a forwarder on their
bridge's gateway, named kubernetes.default.svc (a name in the API server's certificate) by the
chart's kubernetesAPI and hostAliases values.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shlex
import subprocess
import tarfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from common import builders, contract
from tests.background import read_state, running
from tests.chart import CHART, binary, helm, probe_of
from tests.e2e.forwarding import forwarding
from tests.e2e.harness import BORROWER, ONLINE, Cluster, RealNode, devices_of, unique, workload
from tests.e2e.kube import wait_for
from tests.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "tidelease"
NAMESPACE = "tidelease-helm"
NODE = "helm-0"
GPUS = 8
SCHEDULER = "tidelease-scheduler"
POD_TIMEOUT_S = 240
# The chart an upgrade starts from: main's at the last change landed before this chart version's
# changes (the chart's directory at this commit of the repository's history).
PREVIOUS_CHART_COMMIT = "0cf14af2d89f5ed786b2f4368c7a7e9331ef6b8e"


@dataclass(frozen=True)
class Image:
    ref: str  # as the pod spec names it
    archive: Path


@dataclass
class Stack:
    cluster: Cluster
    node: RealNode
    socket: Path
    values: list[str]
    tidelease: Image
    workloads: str  # the namespace of the GPU pods, kept through the module's tests
    installed: bool = False

    def helm(self, *args: str) -> str:
        return helm(
            *args, "--kubeconfig", str(self.cluster.kubeconfig), "--namespace", NAMESPACE,
            timeout=300,
        ).stdout  # fmt: skip

    def ctr(self, *args: str) -> str:
        done = subprocess.run(
            ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"ctr {' '.join(args)}: {done.stderr}"
        return done.stdout

    def pods(self, component: str) -> list[dict[str, Any]]:
        return self.cluster.kube.list(
            "Pod", NAMESPACE, f"app.kubernetes.io/name=tidelease-{component}"
        )

    def wait_ready(self, component: str, count: int, *, image: str | None = None) -> list[str]:
        """The names of ``count`` ready pods of the component (all of ``image``, if given),
        and no others (a rollout that left an old pod behind is not done)."""

        def ready() -> list[str] | None:
            pods = [p for p in self.pods(component) if not p["metadata"].get("deletionTimestamp")]
            good = [
                p
                for p in pods
                if all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
                and (image is None or p["spec"]["containers"][0]["image"] == image)
            ]
            if len(pods) == len(good) == count:
                return sorted(p["metadata"]["name"] for p in good)
            return None

        return wait_for(
            ready,
            what=f"{count} ready {component} pods" + (f" of {image}" if image else ""),
            timeout=POD_TIMEOUT_S,
            interval=1,
            describe=lambda: self.describe(component),
        )

    def wait_installed(self, what: str) -> None:
        """Every component's pods ready, and the node's GPUs published by ``what`` (an agent)."""
        for component, count in (("extender", 2), ("orchestrator", 2), ("controllers", 2)):
            self.wait_ready(component, count)
        self.wait_ready("agent", 1)
        wait_for(
            lambda: len(self.cluster.gpu_node_uuids(NODE)) == GPUS,
            what=f"{NODE}'s GPUs published by {what}",
            timeout=POD_TIMEOUT_S,
        )

    def describe(self, component: str) -> str:
        out = []
        for pod in self.pods(component):
            name = pod["metadata"]["name"]
            out.append(self.cluster.describe_pod(NAMESPACE, name))
            for c in pod["spec"]["containers"]:
                done = subprocess.run(
                    [str(self.cluster.kubectl_path), "--kubeconfig", str(self.cluster.kubeconfig),
                     "logs", "-n", NAMESPACE, name, "-c", c["name"], "--tail", "30"],
                    capture_output=True, text=True, timeout=30, check=False,
                )  # fmt: skip
                out.append(f"--- logs {name}/{c['name']}:\n{done.stdout}{done.stderr}")
        return "\n".join(out)

    def ledger(self) -> dict[str, list[str]]:
        """The node's GpuAllocation ledger: pod name -> devices."""
        obj = self.cluster.kube.get(contract.KIND_GPU_ALLOCATION, NODE) or {}
        allocations = (obj.get("spec") or {}).get("allocations") or []
        return {a["name"]: sorted(a["devices"]) for a in allocations}

    def place(self, name: str, gpus: int) -> str:
        """A GPU pod for the chart's scheduler, once it runs: the devices the extender chose
        are in the node's ledger and are exactly what its container sees."""
        pod = self.node.pod(self.workloads, name, gpus=gpus)
        pod["spec"]["schedulerName"] = SCHEDULER
        self.cluster.kube.create(pod)
        try:
            pod = self.cluster.wait_running(self.workloads, name, timeout=POD_TIMEOUT_S)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.describe('extender')}") from None
        uuids = devices_of(pod)
        assert len(uuids) == gpus
        assert pod["spec"]["nodeName"] == NODE
        # Bound through the in-cluster extender: its bind wrote the devices (no other binder
        # knows them), and they are in the node's ledger.
        assert pod["metadata"]["annotations"][contract.ANN_DEVICE_NODE] == NODE
        assert self.ledger()[name] == sorted(uuids)
        node_devices = self.cluster.gpu_node_uuids(NODE)
        env = self.cluster.exec(self.workloads, name, "env")
        assert f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}" in env.splitlines()
        listed = self.cluster.exec(self.workloads, name, "ls", "/dev").split()
        assert sorted(n for n in listed if n.startswith("nvidia")) == sorted(
            f"nvidia{node_devices[u]['index']}" for u in uuids
        )
        return name

    def assert_no_device_twice(self) -> None:
        """Ledger and pods agree, and no device is held by two pods."""
        ledger = self.ledger()
        pods = {
            p["metadata"]["name"]: sorted(devices_of(p))
            for p in self.cluster.kube.list("Pod", self.workloads)
            if not p["metadata"].get("deletionTimestamp")
        }
        assert ledger == pods
        every = [u for devices in ledger.values() for u in devices]
        assert len(every) == len(set(every)), f"a device was given twice: {ledger}"


def full_ref(ref: str) -> str:
    """A reference as containerd stores it (docker.io/library/ for bare names, as the kubelet
    resolves them)."""
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref}" if rest else f"docker.io/library/{ref}"


def build_image(*args: str) -> Image:
    """hack/build-image.sh's archive (cached by its inputs: cheap when warm), named by its most
    specific tag (tidelease:<version>-<commit> rather than tidelease:<version>)."""
    done = subprocess.run(
        [str(ROOT / "hack" / "build-image.sh"), *args],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, f"hack/build-image.sh {' '.join(args)}: {done.stderr[-3000:]}"
    archive = Path(done.stdout.splitlines()[-1])
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        (manifest,) = json.load(member)
    return Image(max(manifest["RepoTags"], key=len), archive)


@dataclass(frozen=True)
class ChartNode:
    """A real kubelet node of a module's own for the chart's pods (hack/realnode.sh -a)."""

    node: RealNode
    facts: dict[str, str]  # its realnode.env
    values: list[str]  # what the chart needs on this machine to run its pods there


@contextlib.contextmanager
def chart_node(
    cluster: Cluster, base: Path, name: str, gpus: int, *flags: str
) -> Iterator[ChartNode]:
    """hack/realnode.sh -a (and ``flags``) as node ``name`` with ``gpus`` stand-in GPUs, in
    ``base``; labelled as GPU feature discovery labels a GPU node (the agent DaemonSet's default
    selector), with the RuntimeClass the GPU Operator's toolkit makes (docs/gpu-operator.md),
    here on the node's runc; a forwarder from its pods' gateway to the API server. Its values:
    the API server through that forwarder, images never pulled, the agent's fake NVML on the
    node's stand-in devices, every component's pods on this node."""
    state = base / "node" / "realnode.env"
    ca = read_state(cluster.dir / "cluster.env")["TL_CLUSTER_KUBELET_CLIENT_CA"]
    command = [
        str(ROOT / "hack" / "realnode.sh"), "-D", str(state.parent), "-k", str(cluster.kubeconfig),
        "-n", name, "-g", str(gpus), "-a", *flags, "-c", ca, "-L", str(base / "logs"),
    ]  # fmt: skip
    env = {**os.environ, "TL_REALNODE_PARENT_PID": str(os.getpid())}
    with running(
        command,
        state=state,
        log=base / "realnode.log",
        what=f"hack/realnode.sh -a {' '.join(flags)}",
        start_timeout_s=180,
        stop_timeout_s=90,
        env=env,
    ) as facts:
        node = RealNode(
            name,
            facts["TL_REALNODE_IP"],
            gpus,
            Path(facts["TL_REALNODE_CTRD_SOCK"]),
            facts["TL_REALNODE_GATEWAY"],
            dra=facts["TL_REALNODE_MODE"] == "dra",
            cdi_dir=Path(facts["TL_REALNODE_CDI_DIR"]) if facts["TL_REALNODE_CDI_DIR"] else None,
        )
        api = urllib.parse.urlsplit(cluster.server)
        assert api.hostname is not None
        assert api.port is not None
        with forwarding(facts["TL_REALNODE_GATEWAY"], (api.hostname, api.port)) as forwarder:
            on_node = [
                f"nodeSelector.kubernetes\\.io/hostname={name}",
                "tolerations[0].key=tidelease.io/real-node",
                "tolerations[0].operator=Exists",
            ]
            values = [
                "image.pullPolicy=Never",
                "kubernetesAPI.host=kubernetes.default.svc",
                f"kubernetesAPI.port={forwarder.port}",
                f"hostAliases[0].ip={facts['TL_REALNODE_GATEWAY']}",
                "hostAliases[0].hostnames[0]=kubernetes.default.svc",
                # The session cluster made them already (not this release's to own).
                "priorityClasses.create=false",
                "agent.backend=fake",
                f"agent.fakeGpus={gpus}",
                f"agent.hostDeviceRoot={facts['TL_REALNODE_FAKEDEV']}",
                f"agent.cache.hostPath={state.parent / 'cache'}",
                # The controllers take the extender's placement values.
                *(f"{component}.{v}" for component in ("agent", "extender", "orchestrator")
                  for v in on_node),
            ]  # fmt: skip
            cluster.kubectl("label", "node", name, "nvidia.com/gpu.present=true")
            cluster.kubectl("apply", "-f", "-", input=json.dumps({
                "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"}, "handler": "runc",
            }))  # fmt: skip
            yield ChartNode(node, facts, values)


@pytest.fixture(scope="module")
def stack(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tidelease = build_image()
    scheduler = build_image("kube-scheduler")
    with chart_node(cluster, tmp_path_factory.mktemp("helm-node"), NODE, GPUS) as on:
        node = on.node
        values = [
            f"image.repository={tidelease.ref.rpartition(':')[0]}",
            f"image.tag={tidelease.ref.rpartition(':')[2]}",
            f"scheduling.kubeScheduler.image.repository={scheduler.ref.rpartition(':')[0]}",
            f"scheduling.kubeScheduler.image.tag={scheduler.ref.rpartition(':')[2]}",
            "scheduling.kubeScheduler.image.pullPolicy=Never",
            *on.values,
            # On as before it was opt-in: the install with the CRI socket mounted.
            "agent.hotRestart.enabled=true",
            "extender.controllers.hotRestartOperator=true",
            # One node of this machine's 2 cores holds every pod, and a rolling upgrade's
            # surge pods beside them: requests cut to fit (the limits stay).
            "extender.resources.requests.cpu=100m",
            f"agent.hotRestart.criSocket={node.containerd_socket}",
            # One node: the extender's replicas may share it (the chart keeps them apart).
            "extender.antiAffinity=preferred",
        ]
        workloads = cluster.namespace("helm-e2e")
        stack = Stack(cluster, node, node.containerd_socket, values, tidelease, workloads)
        for image in (tidelease, scheduler):
            stack.ctr("images", "import", "--no-unpack", str(image.archive))
        try:
            yield stack
        finally:
            if stack.installed:
                uninstall(cluster, NAMESPACE)
            cluster.kube.delete("Namespace", workloads)


def uninstall(cluster: Cluster, namespace: str) -> None:
    """The release in ``namespace`` uninstalled, at a module's end: what fails is left to the
    cluster's teardown."""
    subprocess.run(
        [binary("helm"), "uninstall", RELEASE, "--kubeconfig", str(cluster.kubeconfig),
         "--namespace", namespace, "--wait"],
        capture_output=True, timeout=180, check=False,
    )  # fmt: skip


def test_the_stack_installs_and_places_a_gpu_pod_on_the_devices_it_chose(stack: Stack) -> None:
    sets = [a for v in stack.values for a in ("--set", v)]
    stack.helm("install", RELEASE, str(CHART), "--create-namespace", *sets)
    stack.installed = True
    extenders = stack.wait_ready("extender", 2)
    stack.wait_ready("orchestrator", 2)
    stack.wait_ready("controllers", 2)  # leasing, prewarm and the hot-restart operator
    stack.wait_ready("agent", 1)
    for name in extenders:  # each with its own kube-scheduler beside it
        pod = stack.cluster.kube.get("Pod", name, NAMESPACE)
        assert pod is not None
        assert [c["name"] for c in pod["spec"]["containers"]] == ["extender", "kube-scheduler"]
        assert pod["spec"]["nodeName"] == NODE
    # The agent pod, with the GPU Operator's RuntimeClass (stood in), published the node's fake
    # GPUs and registered its device plugin.
    (agent,) = stack.cluster.kube.list(
        "Pod", NAMESPACE, selector="app.kubernetes.io/name=tidelease-agent"
    )
    assert agent["spec"]["runtimeClassName"] == "nvidia"
    wait_for(
        lambda: (
            len(stack.cluster.gpu_node_uuids(NODE)) == GPUS
            and (stack.cluster.kube.get("Node", NODE) or {})["status"]["allocatable"].get(
                contract.DEFAULT_GPU_RESOURCE
            )
            == str(GPUS)
        ),
        what=f"{NODE} to offer {GPUS} GPUs through the agent pod",
        timeout=POD_TIMEOUT_S,
        interval=1,
        describe=lambda: stack.describe("agent"),
    )

    assert stack.place(unique("gpu"), 2)

    # The controllers' agent conditions: the node's agent heartbeats, and its GpuNode says so.
    def agent_ready() -> str | None:
        node = stack.cluster.kube.get(contract.KIND_GPU_NODE, NODE) or {}
        conditions = (node.get("status") or {}).get("conditions") or []
        return next((c["status"] for c in conditions if c.get("type") == "AgentReady"), None)

    wait_for(
        lambda: agent_ready() == "True",
        what=f"{NODE}'s AgentReady condition",
        timeout=POD_TIMEOUT_S,
        interval=1,
        describe=lambda: stack.describe("controllers"),
    )


# What it finds goes to the container's termination message as well as its log: the message
# is in the pod's status, which a log the node has not yet (or no longer) kept cannot take away
# (one run's `kubectl logs` found no log directory for a pod that had just succeeded).
STRANGER = """
{{
for ip in {extenders}; do
  bind='POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}'
  echo "verbs $ip: $(printf "$bind" | nc -w 3 $ip {verbs} 2>&1)"
  echo "metrics $ip: $(wget -q -O - http://$ip:{probes}/metrics 2>&1)"
  echo "healthz $ip: $(wget -q -O - http://$ip:{probes}/healthz 2>&1)"
done
for ip in {orchestrators}; do
  echo "orchestrator metrics $ip: $(wget -q -O - http://$ip:{orchestrator}/metrics 2>&1)"
done
echo done
}} 2>&1 | tee /dev/termination-log
"""


def test_a_pod_on_the_node_cannot_reach_the_verbs_or_read_metrics(stack: Stack) -> None:
    """ownScheduler mode: the verbs listen on the extender pod's loopback, so a pod beside it
    finds nothing at the pod's address; /metrics (extender and orchestrator) wants a token the
    API server allows; /healthz answers (the path itself is open)."""

    def ips(component: str) -> str:
        return " ".join(p["status"]["podIP"] for p in stack.pods(component))

    name = unique("stranger")
    pod = stack.node.pod(stack.workloads, name)
    pod["spec"]["restartPolicy"] = "Never"
    script = STRANGER.format(
        extenders=ips("extender"), orchestrators=ips("orchestrator"), verbs=8888, probes=8889,
        orchestrator=8890,
    )  # fmt: skip
    pod["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", script]
    stack.cluster.kube.create(pod)
    wait_for(
        lambda: (
            (stack.cluster.kube.get("Pod", name, stack.workloads) or {})
            .get("status", {})
            .get("phase")
            in ("Succeeded", "Failed")
        ),
        what=f"pod {name} to finish",
        timeout=POD_TIMEOUT_S,
    )
    finished = stack.cluster.kube.get("Pod", name, stack.workloads) or {}
    (status,) = finished["status"]["containerStatuses"]
    log = status["state"]["terminated"].get("message", "")
    stack.cluster.kube.delete("Pod", name, stack.workloads)
    wait_for(
        lambda: stack.cluster.kube.get("Pod", name, stack.workloads) is None,
        what=f"pod {name} gone (the later tests count the namespace's pods)",
        timeout=60,
    )
    lines = log.splitlines()
    assert lines[-1] == "done", log
    verbs = [line for line in lines if line.startswith("verbs ")]
    assert len(verbs) == 2, log
    assert all("refused" in line for line in verbs), log
    assert (
        sum("401" in line for line in lines if line.startswith(("metrics ", "orchestrator"))) == 4
    )
    assert sum(line.endswith(": ok") for line in lines if line.startswith("healthz ")) == 2
    assert "tidelease_" not in log, log


# Each flood is held this long: more than a liveness period (10 s) and several readiness periods.
FLOOD_HOLD_S = 12.0
PROBED = ("extender", "controllers", "orchestrator")


def probe_ports(pod: dict[str, Any]) -> set[int]:
    """The ports the kubelet probes in tidelease's containers of ``pod`` (named ports
    resolved); the kube-scheduler beside the extender is upstream's, left alone."""
    ports: set[int] = set()
    for container in pod["spec"]["containers"]:
        if container["name"] == "kube-scheduler":
            continue
        named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        for kind in ("livenessProbe", "readinessProbe"):
            port = ((container.get(kind) or {}).get("httpGet") or {}).get("port")
            if port is not None:
                ports.add(int(named.get(port, port)))
    return ports


def kubelet_probes(stack: Stack) -> dict[tuple[str, str, str, str], float]:
    """The node's kubelet's own count of its probes (its /metrics/probes, through the API
    server): (pod, container, probe type, result) -> probes, for the release's pods."""
    from prometheus_client.parser import text_string_to_metric_families

    text = stack.cluster.kubectl("get", "--raw", f"/api/v1/nodes/{NODE}/proxy/metrics/probes")
    counts: dict[tuple[str, str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "prober_probe_total" and labels.get("namespace") == NAMESPACE:
                key = (labels["pod"], labels["container"], labels["probe_type"], labels["result"])
                counts[key] = sample.value
    return counts


async def test_the_kubelets_probes_succeed_through_connection_floods(stack: Stack) -> None:
    """Every probes-and-metrics port of every extender, controllers and orchestrator pod is
    flooded at once with 64 and 1,000 idle and silent connections (tests/flooding.py), each
    flood held FLOOD_HOLD_S, while the node's real kubelet probes them: its own count says each
    was probed and fewer probes failed than the kubelet acts on, no container restarted, every
    pod stayed Ready. ``-s``
    prints what a client probing alongside measured."""
    from common.httpserving import raise_fd_limit
    from tests.flooding import FLOODS, flooding, pct, probe

    pods = [p for component in PROBED for p in stack.pods(component)]
    targets = sorted({(p["status"]["podIP"], port) for p in pods for port in probe_ports(p)})
    assert len(targets) == 6, targets  # two pods of each, one probes port each
    raise_fd_limit(4 * 1_000 * len(targets))
    restarts = {
        p["metadata"]["name"]: [c["restartCount"] for c in p["status"]["containerStatuses"]]
        for p in pods
    }
    failure_thresholds = {
        (p["metadata"]["name"], c["name"], kind): probe_of(c, kind.lower()).failure_threshold
        for p in pods
        for c in p["spec"]["containers"]
        for kind in ("Liveness", "Readiness")
    }
    before = kubelet_probes(stack)
    for kind, count in FLOODS:
        async with flooding(targets, kind, count) as flood:
            latencies: list[float] = []
            end = asyncio.get_running_loop().time() + FLOOD_HOLD_S
            while asyncio.get_running_loop().time() < end:
                for host, port in targets:
                    latencies.append(await probe(host, port))
                await asyncio.sleep(0.5)
        print(
            f"probe-flood (real node): {count} {kind} connections to each of {len(targets)} "
            f"ports (opened in {flood.opened_s:.1f} s), {FLOOD_HOLD_S:.0f} s: "
            f"{len(latencies)} probes alongside, all 200, p50 {pct(latencies, 0.5):.1f} ms, "
            f"p99 {pct(latencies, 0.99):.1f} ms",
            flush=True,
        )
    after = kubelet_probes(stack)
    probed = {(pod, c, kind) for pod, c, kind, _ in after if c != "kube-scheduler"}
    assert len(probed) == 2 * len(targets), probed  # liveness and readiness, each container
    totals: dict[str, float] = {}
    for pod, container, kind in sorted(probed):

        def delta(result: str, key: tuple[str, str, str] = (pod, container, kind)) -> float:
            return after.get((*key, result), 0.0) - before.get((*key, result), 0.0)

        # Fewer failures in all than the probe's failureThreshold: the kubelet never had that
        # many in a row, so it never marked the container unready or restarted it (what the
        # chart promises). A lone failure is tolerated: two clean-clone runs of five saw one
        # readiness probe miss its 1 s timeout on the loaded two-core machine.
        threshold = failure_thresholds.get((pod, container, kind), 3)
        assert delta("failed") < threshold, (pod, container, kind, threshold)
        assert delta("unknown") == 0, (pod, container, kind)
        # At least one probe per liveness period of the four floods' time.
        assert delta("successful") >= len(FLOODS) * FLOOD_HOLD_S // 10, (pod, container, kind)
        totals[kind] = totals.get(kind, 0.0) + delta("successful")
    print(
        "probe-flood (real node): the kubelet's probes meanwhile: "
        + ", ".join(f"{kind} {n:.0f} successful" for kind, n in sorted(totals.items()))
        + ", failures below each probe's threshold",
        flush=True,
    )
    for p in stack.pods("extender") + stack.pods("controllers") + stack.pods("orchestrator"):
        name = p["metadata"]["name"]
        assert [c["restartCount"] for c in p["status"]["containerStatuses"]] == restarts[name]
        assert all(c["ready"] for c in p["status"]["containerStatuses"]), name


def test_a_pod_with_invalid_annotations_is_refused_at_creation(stack: Stack) -> None:
    """The chart's ValidatingAdmissionPolicy, enforced by the cluster's API server: kubectl
    create fails with the message the extender's filter would give; nothing is created."""
    name = unique("bad")
    pod = stack.node.pod(stack.workloads, name, gpus=1)
    pod["spec"]["schedulerName"] = SCHEDULER
    bad = {contract.ANN_PRIORITY: "urgent", contract.ANN_GPU_TYPE: "H20 SXM"}
    pod["metadata"].setdefault("annotations", {}).update(bad)
    want = (
        f"annotation {contract.ANN_PRIORITY}: invalid value 'urgent' (want high or low); "
        f"annotation {contract.ANN_GPU_TYPE}: invalid GPU type 'H20 SXM' "
        "(want letters, digits, '-', '_' or '.', at most 63)"
    )
    with pytest.raises(AssertionError) as refused:
        stack.cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    assert f"denied request: {want}" in str(refused.value)
    assert stack.cluster.kube.get("Pod", name, stack.workloads) is None
    # The same pod with valid annotations is created (and placed).
    pod["metadata"]["annotations"][contract.ANN_PRIORITY] = "low"
    del pod["metadata"]["annotations"][contract.ANN_GPU_TYPE]
    stack.cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    stack.cluster.wait_running(stack.workloads, name, timeout=POD_TIMEOUT_S)
    # Its GPU back for the tests that follow (they count the node's eight).
    stack.cluster.kubectl(
        "delete", "pod", "-n", stack.workloads, name, "--grace-period=0", "--force", "--wait"
    )
    wait_for(lambda: name not in stack.ledger(), what=f"{name}'s allocation to go", timeout=120)


def test_a_killed_extender_pod_is_replaced_and_no_device_is_given_twice(stack: Stack) -> None:
    # Kill the pod whose kube-scheduler leads (its identity starts with the pod's hostname).
    lease = stack.cluster.kubectl(
        "get", "lease", "-n", NAMESPACE, SCHEDULER, "-o", "jsonpath={.spec.holderIdentity}"
    )
    (leader,) = [n for n in stack.wait_ready("extender", 2) if lease.startswith(n)]
    stack.cluster.kubectl("delete", "pod", "-n", NAMESPACE, leader, "--grace-period=0", "--force")
    # Scheduling resumes (the other pod's scheduler takes the lease) while a new pod comes up.
    placed = [stack.place(unique("gpu"), 2) for _ in range(3)]
    replaced = stack.wait_ready("extender", 2)
    assert leader not in replaced
    stack.assert_no_device_twice()
    assert sum(len(d) for d in stack.ledger().values()) == GPUS == 2 + 2 * len(placed)


def test_helm_upgrade_rolls_every_pod_and_keeps_the_allocations(stack: Stack) -> None:
    before = stack.ledger()
    running = {p["metadata"]["name"] for p in stack.cluster.kube.list("Pod", stack.workloads)}
    assert set(before) == running
    new = f"{stack.tidelease.ref}-next"
    stack.ctr("images", "tag", full_ref(stack.tidelease.ref), full_ref(new))
    tag = new.rpartition(":")[2]
    stack.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", f"image.tag={tag}")
    stack.wait_ready("extender", 2, image=new)
    stack.wait_ready("orchestrator", 2, image=new)
    stack.wait_ready("controllers", 2, image=new)
    stack.wait_ready("agent", 1, image=new)
    # Every allocation is where it was, and every GPU pod still runs on its devices.
    assert stack.ledger() == before
    for name in running:
        pod = stack.cluster.wait_running(stack.workloads, name)
        assert sorted(devices_of(pod)) == before[name]
    # The upgraded stack schedules: the devices of a deleted pod go to a new one.
    gone = sorted(running)[0]
    stack.cluster.kube.delete("Pod", gone, stack.workloads)
    freed = before[gone]
    wait_for(lambda: gone not in stack.ledger(), what=f"the ledger to release {gone}", timeout=60)
    name = unique("gpu")
    stack.place(name, 2)
    assert stack.ledger()[name] == freed
    stack.assert_no_device_twice()


def previous_chart(into: Path) -> Path:
    """The chart as it was at :data:`PREVIOUS_CHART_COMMIT`, from the repository's history."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS_CHART_COMMIT,
         "manifests/charts/tidelease"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"the previous chart needs the repository's history (a full clone): {done.stderr!r}"
    )
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(into, filter="data")
    return into / "manifests" / "charts" / "tidelease"


def test_helm_upgrade_from_the_previous_chart_keeps_live_leases_and_their_return(
    stack: Stack, tmp_path: Path
) -> None:
    """The previous chart runs a lease that lends a replica's 4 GPUs to a borrower; `helm
    upgrade` to this chart (every pod rolled, a new image tag) loses no tag, no ledger entry and
    no borrower, and the next reclaim gives the replica back exactly the devices it lent. The
    previous chart runs this build's image (the previous image is not built here): what is
    tested is the chart's change and a roll of every pod with live leases, not an old binary."""
    kube, ns = stack.cluster.kube, stack.workloads
    for pod in kube.list("Pod", ns):  # the earlier tests' GPU pods: the node's 8 GPUs free
        kube.delete("Pod", pod["metadata"]["name"], ns)
    wait_for(lambda: not stack.ledger(), what="the earlier pods' devices freed", timeout=90)
    # The release as the previous chart installs it (a downgrade with --reuse-values would
    # carry this chart's new values into the old chart's schema, which refuses them).
    stack.helm("uninstall", RELEASE, "--wait")
    stack.installed = False
    sets = [a for v in [*stack.values, f"extender.leaseNamespaces={{{ns}}}"] for a in ("--set", v)]
    stack.helm("install", RELEASE, str(previous_chart(tmp_path)), *sets)
    stack.installed = True
    stack.wait_installed("the previous chart's agent")
    gpus = GPUS // 2
    with stack.cluster.controllers_stopped():  # the chart's controllers alone lease here
        owner = stack.node.pod(
            ns, "template", gpus=gpus,
            annotations={contract.ANN_PRIORITY: "high", contract.ANN_OWNER: "recsys"},
        )  # fmt: skip
        owner["spec"]["priorityClassName"] = ONLINE
        owner["spec"]["schedulerName"] = SCHEDULER
        kube.create(workload("StatefulSet", "recsys", ns, owner, replicas=2))
        kube.create(
            builders.gpu_lease(
                "recsys", ns, gpus_per_replica=gpus, desired_gpus=2 * gpus, grace_s=30
            )
        )
        held = {
            f"recsys-{i}": sorted(devices_of(stack.cluster.wait_running(ns, f"recsys-{i}")))
            for i in range(2)
        }
        kube.patch(contract.KIND_GPU_LEASE, "recsys", {"spec": {"desiredGPUs": gpus}}, ns)

        def lease_status() -> dict[str, Any]:
            return (kube.get(contract.KIND_GPU_LEASE, "recsys", ns) or {}).get("status") or {}

        def lent() -> list[tuple[str, list[str]]] | None:
            status = lease_status()
            groups = [(g["replica"], sorted(g["devices"])) for g in status.get("lent") or []]
            return groups if status.get("phase") == "Steady" and groups else None

        groups = wait_for(lent, what=f"{gpus} devices lent", timeout=POD_TIMEOUT_S)
        assert groups == [("recsys-1", held["recsys-1"])]
        borrower = stack.node.pod(
            ns, "finetune", gpus=gpus, annotations={contract.ANN_PRIORITY: "low"}
        )
        borrower["spec"]["priorityClassName"] = BORROWER
        borrower["spec"]["schedulerName"] = SCHEDULER
        kube.create(borrower)
        running = stack.cluster.wait_running(ns, "finetune", timeout=POD_TIMEOUT_S)
        assert sorted(devices_of(running)) == held["recsys-1"]

        def tags() -> list[dict[str, Any]]:
            node = kube.get(contract.KIND_GPU_NODE, NODE) or {}
            return sorted((node.get("spec") or {}).get("devices") or [], key=lambda d: d["uuid"])

        before_tags, before_ledger = tags(), stack.ledger()
        assert {t["uuid"] for t in before_tags if t.get("owner")} == set(held["recsys-1"])
        assert set(before_ledger) == {"recsys-0", "finetune"}
        before_lease = lease_status()

        new = f"{stack.tidelease.ref}-upgraded"
        stack.ctr("images", "tag", full_ref(stack.tidelease.ref), full_ref(new))
        stack.helm(
            "upgrade", RELEASE, str(CHART), "--reuse-values",
            "--set", f"image.tag={new.rpartition(':')[2]}",
        )  # fmt: skip
        for component, count in (("extender", 2), ("orchestrator", 2), ("controllers", 2)):
            stack.wait_ready(component, count, image=new)
        stack.wait_ready("agent", 1, image=new)
        # Nothing lost in the roll: the tags, the ledger, the borrower (the same pod, running
        # on the lent devices) and the lease's record of what it lent.
        assert tags() == before_tags
        assert stack.ledger() == before_ledger
        now = kube.get("Pod", "finetune", ns)
        assert now is not None
        assert now["metadata"]["uid"] == running["metadata"]["uid"]
        assert now["status"]["phase"] == "Running"
        assert lease_status()["lent"] == before_lease["lent"]

        # The next reclaim: the borrower goes, recsys-1 comes back on exactly what it lent.
        kube.patch(contract.KIND_GPU_LEASE, "recsys", {"spec": {"desiredGPUs": 2 * gpus}}, ns)
        wait_for(
            lambda: lease_status().get("phase") == "Steady" and lease_status().get("reclaims") == 1,
            what="the reclaim to finish",
            timeout=POD_TIMEOUT_S,
        )
        back = stack.cluster.wait_running(ns, "recsys-1", timeout=POD_TIMEOUT_S)
        assert sorted(devices_of(back)) == held["recsys-1"]
        assert sorted(devices_of(stack.cluster.wait_running(ns, "recsys-0"))) == held["recsys-0"]
        gone = kube.get("Pod", "finetune", ns)
        assert gone is None or gone["metadata"].get("deletionTimestamp"), "the borrower stayed"
        assert not [t for t in tags() if t.get("owner")]
        kube.delete(contract.KIND_GPU_LEASE, "recsys", ns)
        kube.delete("StatefulSet", "recsys", ns)


def test_helm_uninstall_leaves_only_the_crds_and_their_objects(stack: Stack) -> None:
    stack.helm("uninstall", RELEASE, "--wait")
    stack.installed = False
    left = stack.cluster.kubectl(
        "get", "deployments,daemonsets,services,configmaps,secrets,serviceaccounts,roles,"
        "rolebindings,clusterroles,clusterrolebindings,validatingadmissionpolicies,"
        "validatingadmissionpolicybindings", "-A", "-l",
        f"app.kubernetes.io/part-of=tidelease,app.kubernetes.io/instance={RELEASE}", "-o", "name",
    )  # fmt: skip
    assert left.strip() == ""
    wait_for(lambda: not stack.pods("extender") and not stack.pods("agent"), what="pods gone")
    # The CRDs stay, and so do the objects they hold (documented in docs/install.md).
    for crd in ("gpunodes", "gpuallocations", "gpuleases"):
        stack.cluster.kubectl("get", "crd", f"{crd}.tidelease.io")
    assert stack.cluster.kube.get(contract.KIND_GPU_NODE, NODE) is not None


# --- install.md's quick install, run as written ---

INSTALL_DOC = ROOT / "docs" / "install.md"
EXAMPLES = ROOT / "manifests" / "examples" / "online-job-pod.yaml"


def shell_block(doc: Path, heading: str) -> str:
    """The first ```sh block under ``heading`` (how a line of the doc begins, e.g. ``## Quick
    install``)."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    opening = next(i for i in range(start, len(lines)) if lines[i].strip() == "```sh")
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].strip() == "```")
    return "\n".join(lines[opening + 1 : closing]) + "\n"


def shims(into: Path, cluster: Cluster, environment: list[str]) -> Path:
    """`helm` and `kubectl` for the doc's commands: the real binaries, given this cluster's
    kubeconfig; helm's install and upgrade also get ``environment`` (what this machine needs
    and an admin's cluster has: the API server through the node's forwarder, the release on the
    real node, fake NVML, images already on the node) after the doc's own arguments."""
    into.mkdir()
    kubeconfig = shlex.quote(str(cluster.kubeconfig))
    sets = " ".join(shlex.quote(f"--set={v}") for v in environment)
    helm_shim = into / "helm"
    helm_shim.write_text(
        "#!/bin/sh\n"
        'case "$1" in install|upgrade) extra=1;; *) extra=;; esac\n'
        f'if [ -n "$extra" ]; then exec {shlex.quote(str(binary("helm")))} "$@" '
        f"--kubeconfig {kubeconfig} {sets}; fi\n"
        f'exec {shlex.quote(str(binary("helm")))} "$@" --kubeconfig {kubeconfig}\n'
    )
    kubectl_shim = into / "kubectl"
    kubectl = shlex.quote(str(cluster.kubectl_path))
    kubectl_shim.write_text(f'#!/bin/sh\nexec {kubectl} --kubeconfig {kubeconfig} "$@"\n')
    for shim in (helm_shim, kubectl_shim):
        shim.chmod(0o755)
    return into


def run_block(
    cluster: Cluster, tmp_path: Path, heading: str, environment: list[str], **substitutions: str
) -> str:
    """docs/install.md's first command block under ``heading``, run by bash as written but for
    ``substitutions`` (each text of the block that must be in it, and what replaces it): what
    helm and kubectl printed. ``environment`` is added to its helm install (:func:`shims`); the
    caller uninstalls the release it made, whether this passes or not."""
    block = shell_block(INSTALL_DOC, heading)
    script = block
    for text, replacement in substitutions.items():
        assert text in block, f"{text!r} not in {heading}'s block:\n{block}"
        script = script.replace(text, replacement)
    path = shims(tmp_path / "bin", cluster, environment)
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=ROOT,
        env={**os.environ, "PATH": f"{path}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert done.returncode == 0, f"{script}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "WARNING" not in done.stdout  # the block names the namespaces the notes ask for
    return done.stdout


def doc_environment(stack: Stack) -> list[str]:
    """Everything of the module's values but the image's repository and tag, which the doc's
    own command decides (its tag: the chart's appVersion, built here too)."""
    return [v for v in stack.values if not v.startswith(("image.repository=", "image.tag="))]


def online_namespace(stack: Stack) -> str:
    """``ml``, the namespace the doc's blocks name, labelled for online jobs as
    docs/tenancy.md says; the module's GPU pods deleted, so that the node's GPUs are free."""
    kube = stack.cluster.kube
    for pod in kube.list("Pod", stack.workloads):
        kube.delete("Pod", pod["metadata"]["name"], stack.workloads)
    if kube.get("Namespace", "ml") is None:
        kube.create(builders.namespace("ml", online=True))
    return "ml"


@contextlib.contextmanager
def examples_placed(stack: Stack, namespace: str, *, mode: str) -> Iterator[dict[str, list[str]]]:
    """The pods of manifests/examples/online-job-pod.yaml created in ``namespace`` as the doc
    says for the scheduling ``mode`` (clusterScheduler: without their ``schedulerName``), with
    what this machine needs added (images named as built here, the real node's toleration and
    node selector); once the online pod and the borrower each run on 4 GPUs of the real node,
    none shared: each one's devices. Deleted after the block."""
    kube = stack.cluster.kube
    names = []
    try:
        for example in yaml.safe_load_all(EXAMPLES.read_text()):
            spec = example["spec"]
            assert spec["schedulerName"] == SCHEDULER  # the examples opt in, as the doc says
            if mode == "clusterScheduler":
                del spec["schedulerName"]
            onto = stack.node.pod(namespace, example["metadata"]["name"])["spec"]
            spec["nodeSelector"] = onto["nodeSelector"]
            spec["tolerations"] = onto["tolerations"]
            spec["terminationGracePeriodSeconds"] = 1
            for container in spec["containers"]:
                container["image"] = onto["containers"][0]["image"]
                container["imagePullPolicy"] = "Never"
            example["metadata"]["namespace"] = namespace
            kube.create(example)
            names.append(example["metadata"]["name"])
        assert sorted(names) == ["finetune-0", "recsys-0"]
        placed: dict[str, list[str]] = {}
        for name in names:
            pod = stack.cluster.wait_running(namespace, name, timeout=POD_TIMEOUT_S)
            assert pod["spec"]["nodeName"] == NODE
            assert pod["metadata"]["annotations"][contract.ANN_DEVICE_NODE] == NODE
            placed[name] = sorted(devices_of(pod))
            assert len(placed[name]) == 4
        assert not set(placed["recsys-0"]) & set(placed["finetune-0"])
        yield placed
    finally:
        for name in names:
            kube.delete("Pod", name, namespace)


def test_the_quick_install_as_install_md_writes_it_places_the_example_pods(
    stack: Stack, tmp_path: Path
) -> None:
    """docs/install.md's quick install block, run by bash as written, with two substitutions:
    REGISTRY/tidelease, the admin's registry, is the image built here, and the release's
    namespace is this module's (the session cluster's own processes use tidelease-system). The
    example pods, in the namespace the block names, are placed by the installed tidelease's own
    kube-scheduler (the ownScheduler mode) on the real node."""
    online = online_namespace(stack)
    stack.installed = True
    run_block(
        stack.cluster, tmp_path, "## Quick install", doc_environment(stack),
        **{"REGISTRY/tidelease": stack.tidelease.ref.rpartition(":")[0],
           "--namespace tidelease-system": f"--namespace {NAMESPACE}"},
    )  # fmt: skip
    stack.wait_installed("the documented install's agent")
    with examples_placed(stack, online, mode="ownScheduler"):
        pass


def test_the_cluster_scheduler_mode_as_install_md_writes_it_places_the_example_pods(
    stack: Stack, tmp_path: Path
) -> None:
    """The clusterScheduler block of docs/install.md, run by bash as written, after the quick
    install's release is gone: the chart installed in that mode, the configuration and
    kube-scheduler's client certificate copied to the control-plane host's /etc/kubernetes
    (here a directory of the test's: the one substitution besides the quick install's two, made
    in the block and in the configuration it wrote). The cluster's kube-scheduler is then
    replaced by one started with that configuration, unchanged (its kubeconfig the host's
    scheduler.conf, as kubeadm writes it), and places the example pods (the default scheduler's,
    as the doc says for this mode) through the extender's Service over HTTPS with the copied
    client certificate. This cluster has no kube-proxy: the Service's address is stood in by a
    forwarder on loopback to the Service's ready endpoints (`scheduling.extenderURL`, as the doc
    says for a kube-scheduler that cannot resolve Service names); the serving certificate is
    still checked against the Service's name."""
    if stack.installed:
        stack.helm("uninstall", RELEASE, "--wait")
        stack.installed = False
    wait_for(lambda: not stack.pods("extender"), what="the last release's pods gone")
    online = online_namespace(stack)
    kube = stack.cluster.kube
    service = "tidelease-extender"

    def endpoint() -> tuple[str, int] | None:
        for s in kube.list("EndpointSlice", NAMESPACE, f"kubernetes.io/service-name={service}"):
            for e in s.get("endpoints") or []:
                if (e.get("conditions") or {}).get("ready"):
                    return e["addresses"][0], 8888
        return None

    host_etc = tmp_path / "etc-kubernetes"  # a control-plane host's /etc/kubernetes
    host_etc.mkdir()
    (host_etc / "scheduler.conf").write_text(stack.cluster.kubeconfig.read_text())
    with forwarding("127.0.0.1", endpoint) as service_address:
        stack.installed = True
        run_block(
            stack.cluster, tmp_path, "* **`clusterScheduler`**",
            [*doc_environment(stack), f"scheduling.extenderURL=https://127.0.0.1:{service_address.port}"],
            **{"REGISTRY/tidelease": stack.tidelease.ref.rpartition(":")[0],
               "-n tidelease-system": f"-n {NAMESPACE}", "/etc/kubernetes": str(host_etc)},
        )  # fmt: skip
        written = host_etc / "tidelease-scheduler.yaml"
        config = yaml.safe_load(written.read_text())
        (extender,) = config["extenders"]
        assert extender["tlsConfig"]["serverName"] == f"{service}.{NAMESPACE}.svc"
        assert extender["enableHTTPS"] is True
        assert extender["ignorable"] is False
        assert config["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"
        assert "profiles" not in config  # default-scheduler's alone
        for name in ("tls.crt", "tls.key", "ca.crt"):
            assert (host_etc / "tidelease" / name).read_bytes().startswith(b"-----BEGIN ")
        written.write_text(written.read_text().replace("/etc/kubernetes", str(host_etc)))
        stack.wait_installed("the documented install's agent")
        log = tmp_path / "kube-scheduler.log"
        with stack.cluster.scheduler_stopped(), log.open("wb") as out:
            scheduler = subprocess.Popen(
                [binary("kube-scheduler"), f"--config={written}", "--bind-address=127.0.0.1",
                 f"--secure-port={free_port()}", f"--cert-dir={tmp_path / 'scheduler-certs'}"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                with examples_placed(stack, online, mode="clusterScheduler"):
                    # Through the Service's stand-in, over HTTPS: the verbs this release serves.
                    assert service_address.accepted > 0
            except BaseException:
                print(log.read_text()[-4000:])
                raise
            finally:
                scheduler.terminate()
                scheduler.wait(timeout=30)
