"""Strangers cannot use the extender (issue 16): the local cluster runs it as the chart's
clusterScheduler mode does, the verbs over HTTPS with kube-scheduler's client certificate
required and /metrics for tokens allowed to get it. Every e2e test that schedules a GPU pod
goes through that authenticated path; here a process on the host and a pod on the real node
try without credentials, and a pending GPU pod is the bait: it must stay unbound."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.parse
from pathlib import Path

import pytest

from common import builders, contract
from common.model import Priority
from tests.certs import issue, make_ca
from tests.e2e.forwarding import forwarding
from tests.e2e.harness import Cluster, RealNode, unique
from tests.e2e.kube import get_text, post_json, wait_for

pytestmark = pytest.mark.cluster


def bait(cluster: Cluster, namespace: str) -> tuple[dict[str, object], str]:
    """A GPU pod no scheduler serves (it stays pending), and the node a bind would put it on;
    the bind and preempt bodies a stranger would send for it."""
    name = unique("bait")
    pod = builders.pod(name, 1, namespace=namespace, priority=Priority.LOW)
    del pod["metadata"]["uid"], pod["status"]
    pod["spec"]["schedulerName"] = "nobody"
    created = cluster.kube.create(pod)
    node = cluster.nodes[0]
    bind = {
        "PodName": name,
        "PodNamespace": namespace,
        "PodUID": created["metadata"]["uid"],
        "Node": node,
    }
    return bind, node


def assert_not_bound(cluster: Cluster, namespace: str, bind: dict[str, object]) -> None:
    pod = cluster.kube.get("Pod", str(bind["PodName"]), namespace)
    assert pod is not None
    assert not pod["spec"].get("nodeName"), "a stranger bound the bait pod"
    assert contract.ANN_DEVICES not in (pod["metadata"].get("annotations") or {})
    ledger = cluster.kube.get(contract.KIND_GPU_ALLOCATION, str(bind["Node"])) or {}
    held = [a["name"] for a in (ledger.get("spec") or {}).get("allocations") or []]
    assert bind["PodName"] not in held


def test_a_host_process_without_the_client_certificate_cannot_bind_preempt_or_read_metrics(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    body, _ = bait(cluster, namespace)
    url = cluster.extender_url
    ca = cluster.extender_client_certs / "ca.crt"
    no_cert = ssl.create_default_context(cafile=str(ca))
    stranger_ca = make_ca(tmp_path / "stranger", "stranger-ca")
    stranger = issue(stranger_ca, tmp_path / "stranger", "kube-scheduler", client=True)
    wrong_ca = ssl.create_default_context(cafile=str(ca))
    wrong_ca.load_cert_chain(str(stranger.cert), str(stranger.key))

    for verb, payload in (("bind", body), ("preempt", {"Pod": {}, "NodeNameToMetaVictims": {}})):
        for context in (no_cert, wrong_ca):
            with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
                post_json(f"{url}/{verb}", payload, tls=context)
        # Plain HTTP to the HTTPS port: no answer at all.
        plain = url.replace("https://", "http://")
        with pytest.raises((ConnectionError, urllib.error.URLError, OSError)):
            post_json(f"{plain}/{verb}", payload)
    assert_not_bound(cluster, namespace, body)

    # /metrics: no token, then a token of an account nobody granted anything.
    metrics = f"{cluster.extender_probe_url}/metrics"
    with pytest.raises(urllib.error.HTTPError) as refused:
        get_text(metrics)
    assert refused.value.code == 401
    refused.value.close()
    cluster.kubectl("create", "serviceaccount", "nosy", "-n", namespace)
    token = cluster.kubectl("create", "token", "nosy", "-n", namespace).strip()
    with pytest.raises(urllib.error.HTTPError) as forbidden:
        get_text(metrics, token=token)
    assert forbidden.value.code == 403
    assert "may not get /metrics" in forbidden.value.read().decode()
    forbidden.value.close()
    # Granted what the chart's tidelease-metrics-reader grants, the same account may.
    reader = unique("metrics-reader")
    cluster.kubectl("create", "clusterrole", reader, "--verb=get", "--non-resource-url=/metrics")
    cluster.kubectl(
        "create", "clusterrolebinding", reader, f"--clusterrole={reader}",
        f"--serviceaccount={namespace}:nosy",
    )  # fmt: skip
    try:
        wait_for(
            lambda: _reads(metrics, token),
            what="the granted account to read /metrics (refusals are cached 10 s)",
            timeout=30,
        )
    finally:
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", reader)

    # The path works for kube-scheduler's certificate: the same bind is answered (and refused
    # for what it is: a pod of another scheduler), still without binding anything.
    reply = post_json(f"{url}/bind", body, tls=cluster.extender_tls())
    assert "nobody" in reply["Error"]
    assert_not_bound(cluster, namespace, body)


def _reads(url: str, token: str) -> bool:
    try:
        return "tidelease_extender_requests_total" in get_text(url, token=token)
    except urllib.error.HTTPError as e:
        e.close()
        return False


def finished(cluster: Cluster, namespace: str, name: str) -> None:
    wait_for(
        lambda: (
            (cluster.kube.get("Pod", name, namespace) or {}).get("status", {}).get("phase")
            in ("Succeeded", "Failed")
        ),
        what=f"pod {name} to finish",
        timeout=90,
    )


POD_SCRIPT = """
echo "healthz: $(wget -q -O - http://{gw}:{probes}/healthz 2>&1)"
echo "metrics: $(wget -q -O - http://{gw}:{probes}/metrics 2>&1)"
printf '{bind}' | nc -w 5 {gw} {verbs} >/tmp/bind 2>&1
echo "bind answered: $(cat /tmp/bind)"
echo done
"""


def test_a_pod_on_the_real_node_cannot_bind_or_read_metrics(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    """The extender reached from a pod's network, as a Service would expose it: TLS stops the
    plaintext bind before HTTP, /metrics refuses without a token, /healthz answers (the
    path itself is open)."""
    body, _ = bait(cluster, namespace)
    # The node's pod bridge, and the gateway address on it, come with its first pod.
    warm = unique("warm")
    pod = real_node.pod(namespace, warm)
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "true"]
    cluster.kube.create(pod)
    finished(cluster, namespace, warm)
    verbs = urllib.parse.urlsplit(cluster.extender_url)
    probes = urllib.parse.urlsplit(cluster.extender_probe_url)
    assert verbs.hostname is not None
    assert verbs.port is not None
    assert probes.hostname is not None
    assert probes.port is not None
    payload = json.dumps(body)
    request = (
        "POST /bind HTTP/1.1\\r\\nHost: extender\\r\\nContent-Type: application/json\\r\\n"
        f"Content-Length: {len(payload)}\\r\\nConnection: close\\r\\n\\r\\n{payload}"
    )
    with (
        forwarding(real_node.gateway, (verbs.hostname, verbs.port)) as verbs_fwd,
        forwarding(real_node.gateway, (probes.hostname, probes.port)) as probes_fwd,
    ):
        script = POD_SCRIPT.format(
            gw=real_node.gateway, probes=probes_fwd.port, verbs=verbs_fwd.port,
            bind=request.replace("'", ""),
        )  # fmt: skip
        name = unique("stranger")
        pod = real_node.pod(namespace, name)
        pod["spec"]["restartPolicy"] = "Never"
        pod["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", script]
        cluster.kube.create(pod)
        wait_for(
            lambda: (
                (cluster.kube.get("Pod", name, namespace) or {}).get("status", {}).get("phase")
                in ("Succeeded", "Failed")
            ),
            what=f"pod {name} to finish",
            timeout=90,
        )
    log = subprocess.run(
        [str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "logs", "-n",
         namespace, name],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    lines = log.splitlines()
    assert "healthz: ok" in lines, log  # the pod reaches the extender
    (metrics,) = [line for line in lines if line.startswith("metrics:")]
    assert "401" in metrics, log
    assert "tidelease_" not in log, log
    assert "HTTP/1.1 200" not in log, log  # the TLS port never spoke HTTP to it
    assert lines[-1] == "done", log
    assert_not_bound(cluster, namespace, body)
