"""The extender's serving certificate renewed in the cluster while the real kube-scheduler keeps
scheduling through it (issue 31).

The certificate rotation (extender/certrotation, as the controllers run it) keeps its three
Secrets on the local cluster's API server, in the test's namespace, with a serving certificate
that lasts SERVING_LIFE (renewed at 2/3 of it). A kubelet-like sync writes the serving Secret
into a Secret volume directory (tests/certswap.py), from which a real ``tidelease extender``
serves as the chart runs it in clusterScheduler mode (HTTPS, kube-scheduler's client certificate
required, its files followed). kube-scheduler's client certificate (365 days in the chart,
copied to the control-plane hosts by an admin) is written once into the directory the chart's
KubeSchedulerConfiguration names. A real kube-scheduler with that configuration and a profile
of its own calls the extender through a TCP forwarder that the test cuts once the extender has
loaded each renewal: kube-scheduler must open new TLS connections and verify the renewed
certificate with the CA file it read at start.

GPU pods of that profile are created one after another until the test has outlived the first
serving certificate and seen two renewals: every pod is bound by the extender's bind verb, none
has a FailedScheduling event, and the extender reports each certificate it loaded.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from common import builders, certificates
from common.kubeclient import KubeClient
from extender.certrotation.controller import KubeSecrets, Rotation, RotationMetrics
from extender.certrotation.policy import CLIENT_SECRET, SERVING_SECRET, RotationSettings
from tests.certswap import SVC, SecretVolume
from tests.chart import CHART, helm, kube_version
from tests.e2e.forwarding import forwarding
from tests.e2e.harness import Cluster, NodeGroup, unique
from tests.e2e.kube import wait_for
from tests.ports import free_port

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
SERVING_LIFE = datetime.timedelta(seconds=24)
RENEWALS = 2  # seen and loaded by the extender before the test ends


def scheduler_config(cluster: Cluster, profile: str, url: str, client_dir: Path) -> str:
    """The chart's KubeSchedulerConfiguration for clusterScheduler mode, as an admin would give
    it to kube-scheduler, pointed at this cluster and ``url``, with one profile."""
    rendered = helm(
        "template", "tidelease", str(CHART), "--namespace", "tidelease-system",
        "--kube-version", kube_version(), "--set", "scheduling.mode=clusterScheduler",
        "--set", f"scheduling.clientCertDir={client_dir}",
        "--show-only", "templates/scheduler-config.yaml",
    ).stdout  # fmt: skip
    config = yaml.safe_load(yaml.safe_load(rendered)["data"]["config.yaml"])
    config["clientConnection"]["kubeconfig"] = str(cluster.kubeconfig)
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [{"schedulerName": profile}]
    (extender,) = config["extenders"]
    assert extender["tlsConfig"]["serverName"] == SVC
    extender["urlPrefix"] = url
    return yaml.safe_dump(config)


def serving_not_after(url: str, token: str) -> float | None:
    """When the certificate the extender serves now ends, as its /metrics says
    (``tidelease_extender_tls_not_after_timestamp_seconds{certificate="serving"}``)."""
    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "tidelease_extender_tls_not_after_timestamp_seconds"
                and sample.labels.get("certificate") == "serving"
            ):
                return sample.value
    return None


class Process:
    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.log = name, log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
            )

    def alive(self) -> None:
        assert self.proc.poll() is None, f"{self.name} died:\n{self.log.read_text()[-3000:]}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()


async def test_kube_scheduler_schedules_through_the_serving_certificates_renewals(
    cluster: Cluster,
    group: NodeGroup,
    namespace: str,
    processes: list[Process],
    tmp_path: Path,
) -> None:
    node = group.add_node("n1", lambda name: builders.devices(name, 8))
    await asyncio.to_thread(group.wait_ready)
    kube = await KubeClient.connect(cluster.kubeconfig)
    secrets = KubeSecrets(kube, namespace)
    settings = RotationSettings(
        namespace=namespace,
        dns_names=(SVC,),
        ca_life=datetime.timedelta(days=1),
        serving_life=SERVING_LIFE,
        client_life=datetime.timedelta(days=365),
        interval_s=0.5,
    )
    rotation = Rotation(secrets, settings, RotationMetrics.create(CollectorRegistry()))
    await rotation.step()  # the install: the CA and both leaves, in the API server
    held = await secrets.get(SERVING_SECRET)
    client = await secrets.get(CLIENT_SECRET)
    assert held is not None
    assert client is not None
    serving = SecretVolume(tmp_path / "extender-tls")
    serving.write(held[0])
    written = held[1]
    first = certificates.facts(held[0]["tls.crt"])
    host_copy = SecretVolume(tmp_path / "control-plane-host")
    host_copy.write(client[0])
    rotating = asyncio.create_task(rotation.run())

    profile = unique("certswap")  # kube-scheduler's profile, which this extender serves
    port, probe_port = free_port(), free_port()
    probes = f"http://127.0.0.1:{probe_port}"
    extender = Process(
        "extender",
        [
            str(ROOT / ".venv/bin/tidelease"),
            "extender",
            "--kubeconfig",
            str(cluster.as_account("tidelease-extender")),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--probe-host",
            "127.0.0.1",
            "--probe-port",
            str(probe_port),
            "--tls-cert-file",
            str(serving.path("tls.crt")),
            "--tls-key-file",
            str(serving.path("tls.key")),
            "--client-ca-file",
            str(serving.path("ca.crt")),
        ],
        tmp_path / "extender.log",
        {
            "TIDELEASE_EXTENDER_METRICS_AUTH": "true",
            "TIDELEASE_EXTENDER_SCHEDULER_NAMES": profile,
            "TIDELEASE_EXTENDER_QUEUE_RELEASE_KEY_FILE": str(cluster.dir / "queue-release.key"),
        },
    )
    processes.append(extender)

    def ready() -> bool:
        extender.alive()
        try:
            with urllib.request.urlopen(f"{probes}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    await asyncio.to_thread(wait_for, ready, what="the extender ready", timeout=60)
    try:
        with forwarding("127.0.0.1", ("127.0.0.1", port)) as forwarder:
            config = tmp_path / "scheduler.yaml"
            url = f"https://127.0.0.1:{forwarder.port}"
            config.write_text(scheduler_config(cluster, profile, url, host_copy.root))
            scheduler_dir = tmp_path / "scheduler"
            scheduler_dir.mkdir()
            scheduler = Process(
                "kube-scheduler",
                [
                    str(cluster.kubectl_path.parent / "kube-scheduler"),
                    f"--config={config}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    f"--cert-dir={scheduler_dir}",
                    "--v=2",
                ],
                tmp_path / "kube-scheduler.log",
                {},
            )
            processes.append(scheduler)
            loaded: list[datetime.datetime] = [first.not_after]
            placed = cuts = 0
            until = first.not_after + datetime.timedelta(seconds=3)
            while datetime.datetime.now(datetime.UTC) < until or len(loaded) <= RENEWALS:
                extender.alive()
                scheduler.alive()
                assert placed < 200, f"{len(loaded) - 1} renewals loaded after {placed} pods"
                # The kubelet's sync of the extender's Secret volume.
                held = await secrets.get(SERVING_SECRET)
                assert held is not None
                if held[1] != written:
                    serving.write(held[0])
                    written = held[1]
                # Once the extender serves the renewed certificate, kube-scheduler's open
                # connections are cut: its next call is a new TLS handshake.
                facts = certificates.facts(held[0]["tls.crt"])
                serves = await asyncio.to_thread(serving_not_after, probes, cluster.token)
                if facts.not_after > loaded[-1] and serves == facts.not_after.timestamp():
                    loaded.append(facts.not_after)
                    cuts += forwarder.cut()
                # One GPU pod of the profile, bound through the extender, then gone.
                name = unique("pod")
                pod = group.pod(namespace, name, 1, node=node)
                pod["spec"]["schedulerName"] = profile
                await asyncio.to_thread(cluster.kube.create, pod)
                await asyncio.to_thread(cluster.wait_bound, namespace, name, 20)
                await asyncio.to_thread(cluster.kube.delete, "Pod", name, namespace)
                placed += 1
    finally:
        rotating.cancel()
        await asyncio.gather(rotating, return_exceptions=True)
        await kube.close()
    events = cluster.kube.list("Event", namespace)
    failed = [e["message"] for e in events if e.get("reason") == "FailedScheduling"]
    assert failed == [], failed
    print(
        f"certificate-rotation: {placed} pods bound through {len(loaded) - 1} serving "
        f"renewals ({SERVING_LIFE.seconds} s certificates), kube-scheduler's connections cut "
        f"{cuts} times, {forwarder.accepted} connections in all",
        flush=True,
    )
    assert len(loaded) > RENEWALS
    # kube-scheduler made new connections after the last renewal (its handshakes verified
    # the renewed certificate), and scheduling went on past the first certificate's end.
    assert forwarder.accepted > cuts > 0
    assert datetime.datetime.now(datetime.UTC) > first.not_after
