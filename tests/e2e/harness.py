"""The e2e cluster handle (from hack/cluster-up.sh's state file) and per-test node groups.

Tests are independent: each makes its own namespace and, when it needs a device layout of its
own, its own group of kwok nodes. A group's nodes carry a NoSchedule taint and a label with the
group's id, and the group's pods tolerate the taint and select the label, so no test's pods land
on another test's nodes, and tests can run in any order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import ssl
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import builders, contract
from common.keyfile import key_file
from common.model import Device, Priority
from common.queuerelease import release_proof
from tests.background import running
from tests.e2e.kube import ApiError, Kube, get_text, post_json, wait_for
from tests.processes import Processes, last_taken

ROOT = Path(__file__).resolve().parents[2]

GROUP_LABEL = "e2e.tidelease.io/group"
GPU = contract.DEFAULT_GPU_RESOURCE
# tidelease's PriorityClasses (the chart's), applied by hack/cluster-up.sh.
ONLINE = "tidelease-online"
BORROWER = "tidelease-borrower"


@contextlib.contextmanager
def local_cluster(
    prefix: str,
    env: Mapping[str, str],
    *,
    start_timeout_s: float = 600,
    logs: Path | None = None,
) -> Iterator[dict[str, str]]:
    """A local cluster of its own (hack/cluster-up.sh in the foreground, in a temporary
    directory named ``prefix``..., with ``env`` added to this process's environment; it stops
    when this process dies): its cluster.env facts while the block runs; its components' logs
    copied to ``logs`` at the end, if given."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        base = Path(tmp)
        full = {
            **os.environ,
            "TL_CLUSTER_DIR": str(base / "cluster"),
            "TL_CLUSTER_PARENT_PID": str(os.getpid()),
            **env,
        }
        with running(
            [str(ROOT / "hack" / "cluster-up.sh"), "-f"],
            state=base / "cluster" / "cluster.env",
            log=base / "cluster-up.log",
            what="hack/cluster-up.sh",
            start_timeout_s=start_timeout_s,
            stop_timeout_s=180,
            env=full,
        ) as facts:
            try:
                yield facts
            finally:
                if logs is not None:
                    shutil.copytree(base / "cluster" / "logs", logs, dirs_exist_ok=True)


def _current_pid(facts: Mapping[str, str], role: str, key: str) -> int:
    """The pid of the cluster's process of ``role`` now: the last one a test started again,
    else the one cluster-up started (``key`` of cluster.env); 0 if none."""
    return last_taken(Path(facts["TL_CLUSTER_DIR"]), role) or int(facts.get(key) or 0)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


REAL_NODE_TAINT = "tidelease.io/real-node"


@dataclass(frozen=True)
class RealNode:
    """A node that a real kubelet runs, with fake GPUs: in extender mode (``real-0``, Debian's
    containerd, the agent's device plugin) or in DRA mode (``real-dra-0``, containerd 2.x with
    CDI, the agent's ResourceSlice and kubelet DRA plugin)."""

    name: str
    ip: str
    gpus: int
    containerd_socket: Path
    gateway: str  # the host's address on the node's pod bridge (what pods reach the host at)
    dra: bool = False
    tiers: tuple[str, ...] = ()  # DRA mode: the tier cluster-up asked for each GPU, by index
    cdi_dir: Path | None = None  # DRA mode: where the agent writes CDI specs, containerd reads

    @classmethod
    def from_state(cls, facts: dict[str, str]) -> RealNode | None:
        """The extender-mode real node of cluster.env, if any."""
        if not facts.get("TL_CLUSTER_REAL_NODE"):
            return None
        return cls(
            name=facts["TL_CLUSTER_REAL_NODE"],
            ip=facts["TL_CLUSTER_REAL_NODE_IP"],
            gpus=int(facts["TL_CLUSTER_REAL_NODE_GPUS"]),
            containerd_socket=Path(facts["TL_CLUSTER_REAL_NODE_CTRD_SOCK"]),
            gateway=facts["TL_CLUSTER_REAL_NODE_GATEWAY"],
        )

    @classmethod
    def dra_from_state(cls, facts: dict[str, str]) -> RealNode | None:
        """The DRA-mode real node of cluster.env (TL_CLUSTER_REAL_DRA_NODE), if any."""
        if not facts.get("TL_CLUSTER_REAL_DRA_NODE"):
            return None
        return cls(
            name=facts["TL_CLUSTER_REAL_DRA_NODE"],
            ip=facts["TL_CLUSTER_REAL_DRA_NODE_IP"],
            gpus=int(facts["TL_CLUSTER_REAL_DRA_NODE_GPUS"]),
            containerd_socket=Path(facts["TL_CLUSTER_REAL_DRA_NODE_CTRD_SOCK"]),
            gateway=facts["TL_CLUSTER_REAL_DRA_NODE_GATEWAY"],
            dra=True,
            tiers=tuple(facts["TL_CLUSTER_REAL_DRA_NODE_TIERS"].split("-")),
            cdi_dir=Path(facts["TL_CLUSTER_REAL_DRA_NODE_CDI_DIR"]),
        )

    def pod(
        self,
        namespace: str,
        name: str,
        *,
        gpus: int = 0,
        image: str = "docker.io/local/app:v1",
        annotations: dict[str, str] | None = None,
        claim_templates: dict[str, str] | None = None,
        scheduler_name: str | None = None,
    ) -> dict[str, Any]:
        """A pod for this node: hack/images.py's local image (never pulled), the node's
        taint tolerated, the node selected by its hostname label. ``claim_templates``: DRA
        claims (claim name: ResourceClaimTemplate name), each given to the container."""
        container: dict[str, Any] = {"name": "app", "image": image, "imagePullPolicy": "Never"}
        if gpus:
            container["resources"] = {"limits": {GPU: str(gpus)}}
        spec: dict[str, Any] = {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": self.name},
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [container],
        }
        if claim_templates:
            spec["resourceClaims"] = [
                {"name": claim, "resourceClaimTemplateName": template}
                for claim, template in claim_templates.items()
            ]
            container.setdefault("resources", {})["claims"] = [
                {"name": claim} for claim in claim_templates
            ]
        if scheduler_name is not None:
            spec["schedulerName"] = scheduler_name
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": spec,
        }


@dataclass
class Cluster:
    """What a test needs of the running cluster; built from DIR/cluster.env."""

    dir: Path
    kubeconfig: Path
    server: str
    token: str
    ca: Path
    extender_url: str  # the verbs: HTTPS, kube-scheduler's client certificate required
    extender_probe_url: str  # /healthz, /readyz; /metrics for an allowed token
    extender_client_certs: Path  # kube-scheduler's tls.crt, tls.key and ca.crt
    controllers_url: str  # `tidelease controllers`: /healthz, /readyz; /metrics for a token
    kubectl_path: Path
    logs: Path
    nodes: tuple[str, ...]  # the kwok GPU nodes cluster-up made (untainted, shared)
    real_node: RealNode | None  # the kubelet node (hack/realnode.sh), when there is one
    real_dra_node: RealNode | None  # the kubelet node in DRA mode (hack/realnode.sh -d), if any
    controllers_pid: int = 0  # `tidelease controllers` as cluster-up started it
    extender_pid: int = 0  # the extender as cluster-up started it
    scheduler_pid: int = 0  # the kube-scheduler of default-scheduler as cluster-up started it
    kube: Kube = field(init=False)

    def __post_init__(self) -> None:
        self.kube = Kube(self.server, self.token, str(self.ca))

    @functools.cached_property
    def processes(self) -> Processes:
        """The extender's and the controllers' processes, taken over (once, for the session:
        the Popen objects live as long as the processes, which hack/cluster-down.sh stops with
        the rest, by pids.env). ``processes.specs``: how each ran at first."""
        roles = {"controllers": self.controllers_pid, "extender": self.extender_pid}
        if self.scheduler_pid:
            roles["kube-scheduler"] = self.scheduler_pid
        return Processes(self.dir, roles)

    @contextlib.contextmanager
    def controllers_mode(self, *, dra: bool) -> Iterator[int]:
        """The controllers in DRA mode or not (the chart's ``dra.enabled``) for the block
        (:meth:`controllers_with` ``TIDELEASE_EXTENDER_DRA``); the pid of the process in the
        asked mode. A no-op where it runs so already."""
        want = "true" if dra else "false"
        if self.processes.specs["controllers"].env.get("TIDELEASE_EXTENDER_DRA", "false") == want:
            yield self.processes.pids["controllers"]
            return
        with self.controllers_with({"TIDELEASE_EXTENDER_DRA": want}) as pid:
            yield pid

    @contextlib.contextmanager
    def controllers_with(self, env: Mapping[str, str]) -> Iterator[int]:
        """The cluster's `tidelease controllers` stopped (SIGTERM: its leader leases released)
        and started again as it ran but with ``env`` added (settings: ``TIDELEASE_EXTENDER_*``)
        for the block, then as it was; the pid of the process with ``env`` (none: as it runs)."""
        procs = self.processes
        if not env:
            yield procs.pids["controllers"]
            return
        spec = procs.specs["controllers"]
        procs.stop("controllers")
        pid = procs.start("controllers", dataclasses.replace(spec, env={**spec.env, **env}))
        try:
            self.wait_controllers_leading()
            yield pid
        finally:
            procs.stop("controllers")
            procs.start("controllers", spec)
            self.wait_controllers_leading()

    @contextlib.contextmanager
    def controllers_stopped(self) -> Iterator[None]:
        """The cluster's `tidelease controllers` stopped for the block (SIGTERM: its leader
        leases released), so that controllers of another install (a chart's, in its own
        namespace) alone reconcile the GpuLeases; started again as it ran afterwards."""
        procs = self.processes
        spec = procs.specs["controllers"]
        procs.stop("controllers")
        try:
            yield
        finally:
            procs.start("controllers", spec)
            self.wait_controllers_leading()

    @contextlib.contextmanager
    def scheduler_stopped(self) -> Iterator[None]:
        """The cluster's kube-scheduler of ``default-scheduler`` (the one with the host
        extender) stopped for the block, so that another kube-scheduler, configured as an admin
        would configure the cluster's own, alone places the default scheduler's pods; started
        again as it ran afterwards (same flags, same ports)."""
        procs = self.processes
        procs.stop("kube-scheduler")
        try:
            yield
        finally:
            procs.start("kube-scheduler")

    def wait_controllers_leading(self, timeout: float = 60) -> None:
        """Until the controllers process leads leasing (its reconcile loop in /metrics)."""
        url = f"{self.controllers_url}/metrics"

        def leading() -> bool:
            try:
                text = get_text(url, token=self.token)
            except OSError:
                return False
            return 'tidelease_controller_queue_depth{controller="leasing"}' in text

        wait_for(leading, what="the controllers leading leasing", timeout=timeout)

    @classmethod
    def from_state(cls, facts: dict[str, str]) -> Cluster:
        count = int(facts["TL_CLUSTER_NODES"])
        prefix = facts["TL_CLUSTER_NODE_PREFIX"]
        return cls(
            dir=Path(facts["TL_CLUSTER_DIR"]),
            kubeconfig=Path(facts["KUBECONFIG"]),
            server=facts["TL_CLUSTER_SERVER"],
            token=facts["TL_CLUSTER_TOKEN"],
            ca=Path(facts["TL_CLUSTER_CA"]),
            extender_url=facts["TL_CLUSTER_EXTENDER_URL"],
            extender_probe_url=facts["TL_CLUSTER_EXTENDER_PROBE_URL"],
            extender_client_certs=Path(facts["TL_CLUSTER_EXTENDER_CLIENT_CERTS"]),
            controllers_url=facts["TL_CLUSTER_CONTROLLERS_URL"],
            kubectl_path=Path(facts["TL_CLUSTER_KUBECTL"]),
            logs=Path(facts["TL_CLUSTER_LOGS"]),
            nodes=tuple(f"{prefix}-{i}" for i in range(count)),
            real_node=RealNode.from_state(facts),
            real_dra_node=RealNode.dra_from_state(facts),
            controllers_pid=_current_pid(facts, "controllers", "TL_CLUSTER_CONTROLLERS_PID"),
            extender_pid=_current_pid(facts, "extender", "TL_CLUSTER_EXTENDER_PID"),
            scheduler_pid=_current_pid(facts, "kube-scheduler", "TL_CLUSTER_SCHEDULER_PID"),
        )

    def as_account(self, account: str) -> Path:
        """The kubeconfig of the chart's ServiceAccount ``account`` (``tidelease-controllers``,
        ``-extender``, ``-orchestrator``) with the chart's grants (hack/lib/cluster.sh's
        apply_grants): tidelease's components run with these, never the admin's."""
        path = self.dir / "accounts" / f"{account}.kubeconfig"
        assert path.is_file(), f"{path}: the cluster made no kubeconfig for {account}"
        return path

    def extender_tls(self) -> ssl.SSLContext:
        """A client context as kube-scheduler's: its certificate, and the extender's CA."""
        certs = self.extender_client_certs
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        context.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
        return context

    def kubectl(self, *args: str, input: str | None = None) -> str:
        """Run the cluster's kubectl; its stdout (raises with stderr on failure)."""
        done = subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
        return done.stdout

    def wait_running(self, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
        """The pod once all its containers run and it has an IP."""

        def running() -> dict[str, Any] | None:
            pod = self.kube.get("Pod", name, namespace)
            status = (pod or {}).get("status") or {}
            containers = status.get("containerStatuses") or []
            if (
                status.get("phase") == "Running"
                and status.get("podIP")
                and containers
                and all("running" in (c.get("state") or {}) for c in containers)
            ):
                return pod
            return None

        return wait_for(
            running,
            what=f"pod {namespace}/{name} to run",
            timeout=timeout,
            describe=lambda: self.describe_pod(namespace, name),
        )

    def exec(self, namespace: str, pod: str, *command: str) -> str:
        """``command``'s stdout in the pod's container (through the API server and kubelet)."""
        return self.kubectl("exec", "-n", namespace, pod, "--", *command)

    def latest_log(self, role: str) -> str:
        """The log ``role``'s live process writes: cluster-up's ``<role>.log``, or, once a test
        restarted it (tests/processes.py), the newest ``<role>-<generation>.log``."""
        candidates = [self.logs / f"{role}.log", *self.logs.glob(f"{role}-[0-9]*.log")]
        existing = [p for p in candidates if p.exists()]
        if not existing:
            return f"{role}.log"
        return max(existing, key=lambda p: p.stat().st_mtime).name

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / name
        if not path.exists():
            return f"({path} does not exist)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # --- objects tests share ---
    def namespace(self, prefix: str, *, online: bool = True) -> str:
        """A new namespace; ``online``: granted online jobs, as an admin labels it
        (docs/tenancy.md). Tests that play a tenant without the grant say ``online=False``."""
        name = unique(prefix)
        self.kube.create(builders.namespace(name, online=online))
        return name

    def release(self, namespace: str, name: str) -> None:
        """Release a pod of the shared queues as the queues controller does: its proof
        (common.queuerelease) made with the cluster's key (hack/lib/cluster.sh), which the
        extender checks. For tests of other things than the queues' order."""
        pod = self.kube.get("Pod", name, namespace)
        assert pod is not None, f"pod {namespace}/{name}"
        key = key_file(self.dir / "queue-release.key").key()
        assert key, "the cluster has no queue release key"
        proof = release_proof(key, pod["metadata"]["uid"])
        gates = [
            g
            for g in pod["spec"].get("schedulingGates") or []
            if g["name"] != contract.SCHEDULING_GATE
        ]
        # One patch, as the queues controller's: the gate lifted is what kube-scheduler acts on.
        self.kube.patch(
            "Pod",
            name,
            {
                "metadata": {"annotations": {contract.ANN_QUEUE_RELEASED: proof}},
                "spec": {"schedulingGates": gates or None},
            },
            namespace,
        )

    def ensure_priority_class(self, name: str, value: int, policy: str = "Never") -> None:
        try:
            self.kube.create(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                    "preemptionPolicy": policy,
                }
            )
        except ApiError as e:
            if e.status != 409:
                raise

    def gpu_node_uuids(self, node: str) -> dict[str, dict[str, Any]]:
        """The node's devices by UUID, from its GpuNode (status and spec merged)."""
        obj = self.kube.get(contract.KIND_GPU_NODE, node)
        assert obj is not None, f"no GpuNode {node}"
        devices = {d["uuid"]: dict(d) for d in (obj.get("status") or {}).get("devices") or []}
        for d in (obj.get("spec") or {}).get("devices") or []:
            devices.setdefault(d["uuid"], {}).update(d)
        return devices

    # --- pods ---
    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self.kube.get("Pod", name, namespace)
        assert pod is not None, f"pod {namespace}/{name} is gone"
        return pod

    def describe_pod(self, namespace: str, name: str) -> str:
        pod = self.kube.get("Pod", name, namespace)
        if pod is None:
            return f"pod {namespace}/{name}: gone"
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        return (
            f"pod {namespace}/{name}: node={spec.get('nodeName')!r} "
            f"nominated={status.get('nominatedNodeName')!r} phase={status.get('phase')} "
            f"conditions={status.get('conditions')} devices={ann.get(contract.ANN_DEVICES)!r}\n"
            f"--- extender log ---\n{self.log_tail('extender.log', 15)}"
        )

    def wait_bound(self, namespace: str, name: str, timeout: float = 30) -> dict[str, Any]:
        """The pod once it is bound and carries its device annotation."""

        def bound() -> dict[str, Any] | None:
            pod = self.kube.get("Pod", namespace=namespace, name=name)
            if pod is None:
                return None
            ann = pod["metadata"].get("annotations") or {}
            if pod["spec"].get("nodeName") and contract.ANN_DEVICES in ann:
                return pod
            return None

        return wait_for(
            bound,
            what=f"pod {namespace}/{name} to be bound",
            timeout=timeout,
            describe=lambda: self.describe_pod(namespace, name),
        )

    def wait_unschedulable(
        self, namespace: str, name: str, contains: str, timeout: float = 30
    ) -> str:
        """The message of the pod's PodScheduled=False condition, once it contains ``contains``
        (earlier attempts may fail for passing reasons, such as a node not yet Ready)."""
        last = ""

        def message() -> str | None:
            nonlocal last
            pod = self.pod(namespace, name)
            assert not pod["spec"].get("nodeName"), f"{name} was bound to {pod['spec']['nodeName']}"
            for c in (pod.get("status") or {}).get("conditions") or []:
                if c.get("type") == "PodScheduled" and c.get("status") == "False":
                    last = str(c.get("message") or "")
                    return last if contains in last else None
            return None

        return wait_for(
            message,
            what=f"pod {namespace}/{name} to be unschedulable because {contains!r}",
            timeout=timeout,
            describe=lambda: f"last message: {last!r}\n{self.describe_pod(namespace, name)}",
        )


def devices_of(pod: dict[str, Any]) -> list[str]:
    """The device UUIDs the extender wrote on a pod at bind time."""
    raw = pod["metadata"].get("annotations", {}).get(contract.ANN_DEVICES, "")
    return [u for u in raw.split(",") if u]


@dataclass
class NodeGroup:
    """kwok GPU nodes of one test, reserved to that test's pods by a taint and a label."""

    cluster: Cluster
    id: str
    nodes: list[str] = field(default_factory=list)

    def node_name(self, suffix: str) -> str:
        return f"e2e-{self.id}-{suffix}"

    def add_node(
        self, suffix: str, layout: Callable[[str], Sequence[Device]], gpu_type: str = "H20"
    ) -> str:
        """A kwok node with its GpuNode; ``layout(name)`` gives its devices (common.builders)."""
        name = self.node_name(suffix)
        devs = list(layout(name))
        kube = self.cluster.kube
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "type": "kwok",
                        "nvidia.com/gpu.product": gpu_type,
                        GROUP_LABEL: self.id,
                    },
                },
                "spec": {
                    "taints": [{"key": GROUP_LABEL, "value": self.id, "effect": "NoSchedule"}]
                },
                "status": {
                    "capacity": {
                        "cpu": "96",
                        "memory": "1024Gi",
                        "pods": "110",
                        GPU: str(len(devs)),
                    },
                    "allocatable": {
                        "cpu": "96",
                        "memory": "1024Gi",
                        "pods": "110",
                        GPU: str(len(devs)),
                    },
                },
            }
        )
        self.nodes.append(name)
        gpu_node = builders.gpu_node(name, devs)
        status = gpu_node.pop("status")
        kube.create(gpu_node)
        kube.patch(contract.KIND_GPU_NODE, name, {"status": status}, subresource="status")
        return name

    def wait_ready(self, timeout: float = 60) -> None:
        """Until kwok has made every node Ready and the extender holds every node's devices."""
        kube = self.cluster.kube

        def nodes_ready() -> bool:
            for name in self.nodes:
                node = kube.get("Node", name) or {}
                conditions = node.get("status", {}).get("conditions") or []
                if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    return False
                # The controller manager lifts node.kubernetes.io/not-ready once kwok reports
                # Ready; until then kube-scheduler turns the group's pods away for that taint.
                taints = node.get("spec", {}).get("taints") or []
                if any(t["key"] != GROUP_LABEL for t in taints):
                    return False
            return True

        wait_for(nodes_ready, what=f"nodes {self.nodes} to be Ready, untainted", timeout=timeout)

        # The extender's own answer for a borrower asking for every healthy, non-standby device
        # of a fresh node: it fits only once the extender has the node's full GpuNode.
        def extender_knows(name: str) -> bool:
            devices = self.cluster.gpu_node_uuids(name).values()
            usable = sum(
                1 for d in devices if d.get("health") == "Healthy" and not d.get("standby")
            )
            if usable == 0:
                return True
            probe = builders.pod(
                f"probe-{self.id}", usable, namespace="probe", priority=Priority.LOW
            )
            reply = post_json(
                f"{self.cluster.extender_url}/filter",
                {"Pod": probe, "NodeNames": [name]},
                tls=self.cluster.extender_tls(),
            )
            return name in (reply.get("NodeNames") or [])

        for name in self.nodes:
            wait_for(
                functools.partial(extender_knows, name),
                what=f"the extender to see GpuNode {name}",
                timeout=timeout,
            )

    def pod(
        self,
        namespace: str,
        name: str,
        gpus: int,
        *,
        priority_class: str | None = None,
        node: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """A pod (common.builders.pod) kept to this group's nodes, or to one of them."""
        obj = builders.pod(name, gpus, namespace=namespace, **kwargs)
        obj["metadata"].pop("uid")
        obj.pop("status")
        spec = obj["spec"]
        spec["nodeSelector"] = {GROUP_LABEL: self.id}
        if node is not None:
            spec["nodeSelector"]["kubernetes.io/hostname"] = node
        spec["tolerations"] = [{"key": GROUP_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
        spec["terminationGracePeriodSeconds"] = 0
        if priority_class is not None:
            spec["priorityClassName"] = priority_class
        if contract.ANN_JOB_CLASS in obj["metadata"]["annotations"]:
            # A pod of the shared queues waits at their gate (as the chart's gate policy sets
            # it) until released: Cluster.release, or the queues controller.
            spec["schedulingGates"] = [{"name": contract.SCHEDULING_GATE}]
        return obj

    def create_pod(self, namespace: str, name: str, gpus: int, **kwargs: Any) -> str:
        self.cluster.kube.create(self.pod(namespace, name, gpus, **kwargs))
        return name

    def delete(self) -> None:
        for name in self.nodes:
            self.cluster.kube.delete(contract.KIND_GPU_NODE, name)
            self.cluster.kube.delete("Node", name)


_WORKLOAD_API = {"StatefulSet": "apps/v1", "Deployment": "apps/v1", "Job": "batch/v1"}


def parked_pod(name: str, namespace: str, gpus: int = 0, **kwargs: Any) -> dict[str, Any]:
    """A pod (``builders.pod`` with ``gpus`` and ``kwargs``) as a client creates it, which no
    node will take (a node selector no node has): to probe admission, never to run."""
    pod = builders.pod(name, gpus, namespace=namespace, **kwargs)
    pod["metadata"].pop("uid")
    pod.pop("status")
    pod["spec"]["nodeSelector"] = {"no-such-node": "x"}
    return pod


def workload(
    kind: str, name: str, namespace: str, pod: dict[str, Any], **spec: Any
) -> dict[str, Any]:
    """A StatefulSet, Deployment or Job whose pods are ``pod`` (its annotations and spec),
    labelled ``app: <name>``; ``spec``: the controller's own fields (replicas, backoffLimit...).
    A StatefulSet starts its pods in parallel; a Job picks its own selector."""
    body: dict[str, Any] = {
        **spec,
        "template": {
            "metadata": {
                "labels": {"app": name},
                "annotations": pod["metadata"].get("annotations") or {},
            },
            "spec": pod["spec"],
        },
    }
    if kind != "Job":
        body["selector"] = {"matchLabels": {"app": name}}
    if kind == "StatefulSet":
        body = {"serviceName": name, "podManagementPolicy": "Parallel", **body}
    return {
        "apiVersion": _WORKLOAD_API[kind],
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }
