#!/usr/bin/env python3
"""Scale run: GPU pods onto many kwok nodes through the real kube-scheduler, with the tidelease
extender, with an extender that does nothing, and with none, on one cluster, in one run.

usage: hack/bench-scale.py [--nodes 1250] [--pods 1000] [--rounds 2] [--qps 500] [--burst 1000]
                           [--timeout 900] [--json FILE] [--keep] [--profile DIR] [--null-http]
                           [--controllers FLAGS] [--compare KEY=VALUE,...]
                           [--variant-http] [--variant-source DIR] [--leases N]
                           [--phases NAME,...] [--smoke]

Starts hack/cluster-up.sh (foreground, in a temporary directory) with --nodes kwok GPU nodes (8
H20 each, a GpuNode each) and two kube-schedulers: the default one with the extender
(the chart's scheduler configuration) and a second one, profile "tidelease-plain", from the same
configuration without extenders. Both get the same client QPS/burst (--qps/--burst; kube-
scheduler's own default of 50/100 would cap the plain scheduler's binding calls, while the
extender binds with its own unthrottled client).

A third kube-scheduler (when phase null is run), profile "tidelease-null", calls
benchmarks/nullextender (Go, net/http, built here): filter passes every node, prioritize scores
zero, no bind: what the protocol costs.
It is served as the extender is (HTTPS, the scheduler's client certificate required, HTTP/1.1:
kube-scheduler keeps at most two idle connections to an extender, so both pay TLS handshakes
under load); --null-http serves it over plain HTTP, as the records before the extender's HTTPS.
The controllers' process runs the chart's default controllers (--controllers to change).

--leases N: N GpuLeases (each of a StatefulSet kept at 0 replicas) exist throughout, so the
controllers watch the cluster for them: what they cost per pod with leases to act for.

--compare KEY=VALUE,...: a fourth phase, "variant": a second tidelease extender with those
settings (docs/reference.md; e.g. bind_attempts=2) and a kube-scheduler of its own calling it,
so that a change is judged against the extender as it is, in one run, phases alternated; the
ratio per round is printed. Both extenders watch the cluster throughout, as two replicas would.
--variant-http serves that variant over plain HTTP on loopback, as the ownScheduler mode does
(kube-scheduler in the extender's pod): with --null-http, both extenders without TLS.
--variant-source DIR runs the variant's extender from the Python sources in DIR (a clone of the
code before a change: git worktree add DIR HEAD), so that a change of code, not of settings, is
judged against the code before it in one run.

--smoke: every phase on 24 nodes with 16 pods, one round, a variant too (the test command runs
it: tests/e2e/test_bench_scale_smoke.py); not a measurement.

--phases NAME,...: the phases of each round (default plain,null,extender; --compare adds
variant). Two more measure the DRA mode on the plain kube-scheduler (no extender): every
kwok node's GpuNode published as its ResourceSlice, as the node agent's DRA driver does, and
the pods' GPUs a claim each from a ResourceClaimTemplate of their size. "dra-tidelease":
claims of tidelease-ha (high-priority pods) and tidelease-borrow (the rest); "dra-plain": the
same claims on a DeviceClass of the driver alone (no attribute looked at).

Phase "plain": --pods pods with schedulerName tidelease-plain; all bound; deleted, waited for.
Phase "null": the same pods with tidelease-null. Phase "extender": with the default scheduler.
--rounds rounds, the phases' order reversed every other round (this machine's noise drifts);
the figures are the medians over the rounds. CPU per pod: each process's CPU time (utime +
stime from /proc) over the phase, divided by its pods. For each phase: pods/s from the first
create to the last bind, the rate between 10% and 90% bound, and per-pod create-to-bound
latency. For the extender phase: p50/p99 per verb from the extender's /metrics histogram
tidelease_extender_request_duration_seconds (the phase's increase, interpolated inside buckets
as Prometheus' histogram_quantile does), and its request counts by outcome.

--profile DIR: py-spy samples the extender and the controllers' process during every extender
phase (100 Hz, only while a process holds the GIL): DIR/<process>-r<round>.txt holds the
collapsed stacks (for any flame graph tool), and the run prints, per process, the functions
with the most samples of their own and the modules with the most samples in all. pip install
py-spy (root, or ptrace allowed).

The pods: sizes 1, 2, 4, 8 GPUs in turn; one in five is tidelease.io/priority: high with an
owner (PriorityClass tidelease-online), the rest low (tidelease-borrower).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv" / "bin" / "python"

try:
    import aiohttp
except ImportError:  # run with the project's environment (hack/lib/python.sh creates it)
    if VENV_PY.exists() and Path(sys.executable) != VENV_PY:
        os.execv(str(VENV_PY), [str(VENV_PY), *sys.argv])
    raise

sys.path.insert(0, str(ROOT))  # tests/ (its support modules), beside the installed packages
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402 (as above)

from common import builders, contract, deviceattributes  # noqa: E402 (the project's environment)
from common.tenancy import LABEL_ONLINE  # noqa: E402
from tests.benchtools import (  # noqa: E402
    cpu_s,
    profile_summary,
    profiling,
    quantile,
    settings_pairs,
)

PLAIN = "tidelease-plain"
NULL = "tidelease-null"
EXTENDER = "default-scheduler"
VARIANT = "tidelease-variant"
PROFILES = {
    "plain": PLAIN,
    "null": NULL,
    "extender": EXTENDER,
    "variant": VARIANT,
    "dra-tidelease": PLAIN,
    "dra-plain": PLAIN,
}
SIZES = (1, 2, 4, 8)
# Throughput ratios printed, where both phases ran: (phase, against phase).
RATIOS = (
    ("extender", "null"),
    ("extender", "plain"),
    ("null", "plain"),
    ("variant", "extender"),
    ("variant", "null"),
    ("dra-tidelease", "dra-plain"),
    ("dra-tidelease", "plain"),
    ("dra-plain", "plain"),
)
VERBS = ("filter", "prioritize", "bind", "preempt")


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} [bench-scale] {msg}", file=sys.stderr, flush=True)


@dataclass
class Phase:
    name: str
    pods: int
    create_s: float = 0.0  # first create to last create
    bound: int = 0
    total_s: float = 0.0  # first create to last bind
    pods_per_s: float = 0.0
    pods_per_s_10_90: float = 0.0
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    extender: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    cpu_ms_per_pod: dict[str, float] = field(default_factory=dict)  # process -> CPU per pod
    round: int = 0


class Api:
    def __init__(self, session: aiohttp.ClientSession, facts: dict[str, str]) -> None:
        self.session = session
        self.server = facts["TL_CLUSTER_SERVER"]
        self.headers = {"Authorization": f"Bearer {facts['TL_CLUSTER_TOKEN']}"}

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        for attempt in range(10):
            try:
                async with self.session.request(
                    method, self.server + path, json=body, headers=self.headers
                ) as resp:
                    data = await resp.json(content_type=None)
                    if resp.status in (429, 500, 503, 504) and attempt < 9:
                        await asyncio.sleep(0.1 * 2**attempt)
                        continue
                    return resp.status, data
            except (aiohttp.ClientError, TimeoutError):
                if attempt == 9:
                    raise
                await asyncio.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, data = await self.call(method, path, body)
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {str(data)[:300]}")
        return data


LEASES_NS = "bench-leases"


def granted_namespace(name: str) -> dict[str, Any]:
    """A namespace the admin granted online jobs (docs/tenancy.md): a fifth of the bench's pods
    are high-priority, which the extender refuses elsewhere."""
    return {"metadata": {"name": name, "labels": {LABEL_ONLINE: "true"}}}


async def make_leases(api: Api, count: int) -> None:
    """``count`` GpuLeases, each of a StatefulSet of its own kept at 0 replicas (no schedule):
    the leasing and prewarm controllers watch the cluster for them and step them, but none
    lends or reclaims, so the phases schedule the same pods as without them."""
    if not count:
        return
    await api.ok("POST", "/api/v1/namespaces", granted_namespace(LEASES_NS))
    for i in range(count):
        name = f"online-{i:03d}"
        sts = builders.statefulset(name, LEASES_NS, replicas=0, image="registry.example/c")
        await api.ok("POST", f"/apis/apps/v1/namespaces/{LEASES_NS}/statefulsets", sts)
        lease = builders.gpu_lease(name, LEASES_NS, gpus_per_replica=1, desired_gpus=0, grace_s=30)
        await api.ok("POST", f"/apis/tidelease.io/v1alpha1/namespaces/{LEASES_NS}/gpuleases", lease)
    log(f"made {count} GpuLeases (and their StatefulSets, at 0 replicas) in {LEASES_NS}")


def bench_pod(
    i: int, namespace: str, scheduler: str, classes: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Pod ``i`` of a phase. ``classes``: the DRA phases' DeviceClasses (high, low): the pod's
    GPUs are a claim from the template of its class and size (:func:`claim_templates`), not
    the extended resource."""
    gpus = SIZES[i % len(SIZES)]
    high = i % 5 == 0
    annotations = {"tidelease.io/priority": "high" if high else "low"}
    if high:
        annotations["tidelease.io/owner"] = f"job-{i % 7}"
    container: dict[str, Any] = {"name": "main", "image": "registry.example/train:v1"}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "priorityClassName": "tidelease-online" if high else "tidelease-borrower",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if classes is None:
        gpu = {"nvidia.com/gpu": str(gpus)}
        container["resources"] = {"limits": gpu, "requests": gpu}
    else:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        template = template_name(classes[0] if high else classes[1], gpus)
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{i:05d}", "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }


# --- DRA ---

# The DRA phases: the plain kube-scheduler (no extender) allocating claims by DeviceClass, the
# GPUs published as ResourceSlices. (high-priority pods' class, low-priority pods' class)
DRA_CLASSES = {
    "dra-tidelease": (deviceattributes.CLASS_HA, deviceattributes.CLASS_BORROW),
    "dra-plain": ("bench-gpu", "bench-gpu"),
}
# The baseline class: the driver's devices, no attribute looked at.
PLAIN_CLASS = {
    "apiVersion": deviceattributes.API_VERSION,
    "kind": deviceattributes.KIND_CLASS,
    "metadata": {"name": "bench-gpu"},
    "spec": {
        "selectors": [{"cel": {"expression": f'device.driver == "{deviceattributes.DRIVER}"'}}]
    },
}
DRA = f"/apis/{deviceattributes.API_VERSION}"


def template_name(device_class: str, gpus: int) -> str:
    return f"{device_class}-{gpus}"


def claim_templates(namespace: str, classes: tuple[str, str]) -> list[dict[str, Any]]:
    """A ResourceClaimTemplate per class and size: ``gpus`` whole devices of the class."""
    return [
        builders.claim_template(namespace, template_name(cls, gpus), cls, count=gpus)
        for cls in sorted(set(classes))
        for gpus in SIZES
    ]


async def publish_slices(api: Api) -> None:
    """tidelease's DeviceClasses, the baseline class, and every GpuNode's ResourceSlice as its
    node agent's DRA driver publishes it (common.deviceattributes): kwok nodes run no agent."""
    for obj in [*deviceattributes.device_classes(), PLAIN_CLASS]:
        await api.ok("POST", f"{DRA}/deviceclasses", obj)
    nodes = await api.ok("GET", "/api/v1/nodes")
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in nodes["items"]}
    gpunodes = await api.ok("GET", f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}")
    pending = [g for g in gpunodes["items"] if g["metadata"]["name"] in uids]

    async def publisher() -> None:
        while pending:
            gpunode = pending.pop()
            name = gpunode["metadata"]["name"]
            obj = deviceattributes.resource_slice(name, uids[name], gpunode, 1)
            await api.ok("POST", deviceattributes.SLICES_PATH, obj)

    await asyncio.gather(*(publisher() for _ in range(16)))
    log(f"published {len(uids)} ResourceSlices and the DeviceClasses")


async def watch_binds(
    api: Api, namespace: str, bound_at: dict[str, float], started: asyncio.Event
) -> None:
    """Record when each pod of the namespace is first seen with a node: list, then watch from
    the list's version; resume (or relist) whenever the watch ends."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)

    def seen(obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name and (obj.get("spec") or {}).get("nodeName") and name not in bound_at:
            bound_at[name] = time.monotonic()

    version = ""
    while True:
        if not version:
            listed = await api.ok("GET", path)
            for item in listed.get("items") or []:
                seen(item)
            version = listed["metadata"]["resourceVersion"]
            started.set()
        query = f"?watch=true&allowWatchBookmarks=true&resourceVersion={version}"
        try:
            async with api.session.get(
                api.server + path + query, headers=api.headers, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientError(f"HTTP {resp.status}")
                buffer = b""
                # Chunks, not readline(): aiohttp's readline() fails on lines over 64 KiB.
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":  # e.g. 410 Gone: relist
                            version = ""
                            break
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        seen(obj)
                    await asyncio.sleep(0)
        except (aiohttp.ClientError, ValueError, TimeoutError) as e:
            log(f"watch of {namespace} ended ({e!r}); resuming")
            await asyncio.sleep(0.5)


async def scrape(
    url: str, session: aiohttp.ClientSession, token: str
) -> dict[tuple[str, ...], float]:
    """The extender's samples of interest: {(metric, verb, le|outcome): value}. /metrics is
    for a bearer token allowed to get it (the cluster's admin token is)."""
    async with session.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}) as resp:
        resp.raise_for_status()
        text = await resp.text()
    samples: dict[tuple[str, ...], float] = {}
    for name, fields, value in parse_metrics(text):
        verb = fields.get("verb", "")
        if name == "tidelease_extender_request_duration_seconds_bucket":
            samples[("bucket", verb, fields["le"])] = value
        elif name == "tidelease_extender_request_duration_seconds_count":
            samples[("count", verb)] = value
        elif name == "tidelease_extender_request_duration_seconds_sum":
            samples[("sum", verb)] = value
        elif name == "tidelease_extender_requests_total":
            samples[("requests", verb, fields.get("outcome", ""))] = value
    return samples


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition: (name, labels, value)."""
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


async def scrape_scheduler(
    url: str, session: aiohttp.ClientSession, profile: str
) -> dict[tuple[str, ...], float]:
    """kube-scheduler's scheduling attempt and algorithm histograms for one profile."""
    async with session.get(f"{url}/metrics", ssl=False) as resp:
        text = await resp.text()
    samples: dict[tuple[str, ...], float] = {}
    for name, labels, value in parse_metrics(text):
        if name == "scheduler_scheduling_attempt_duration_seconds_bucket":
            if labels.get("profile") == profile and labels.get("result") == "scheduled":
                samples[("attempt", labels["le"])] = value
        elif name == "scheduler_scheduling_algorithm_duration_seconds_bucket":
            samples[("algorithm", labels["le"])] = value
        elif name == "scheduler_schedule_attempts_total" and labels.get("profile") == profile:
            samples[("attempts", labels["result"])] = value  # scheduled, unschedulable, error
    return samples


def scheduler_summary(
    before: dict[tuple[str, ...], float], after: dict[tuple[str, ...], float]
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for what in ("attempt", "algorithm"):
        buckets = [
            (float(key[1]), after[key] - before.get(key, 0.0)) for key in after if key[0] == what
        ]
        if buckets:
            summary[f"{what}_p50_ms"] = round(1000 * histogram_quantile(0.5, buckets), 2)
            summary[f"{what}_p99_ms"] = round(1000 * histogram_quantile(0.99, buckets), 2)
    summary["attempts"] = {
        key[1]: round(after[key] - before.get(key, 0.0)) for key in after if key[0] == "attempts"
    }
    return summary


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) pairs."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound  # beyond the last finite bucket: its upper bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def extender_summary(
    before: dict[tuple[str, ...], float], after: dict[tuple[str, ...], float]
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for verb in VERBS:
        buckets = [
            (float(key[2]), after[key] - before.get(key, 0.0))
            for key in after
            if key[0] == "bucket" and key[1] == verb
        ]
        count = after.get(("count", verb), 0.0) - before.get(("count", verb), 0.0)
        if count <= 0:
            continue
        total = after.get(("sum", verb), 0.0) - before.get(("sum", verb), 0.0)
        outcomes = {
            key[2]: int(after[key] - before.get(key, 0.0))
            for key in after
            if key[0] == "requests" and key[1] == verb and after[key] - before.get(key, 0.0) > 0
        }
        summary[verb] = {
            "requests": int(count),
            "outcomes": outcomes,
            "mean_ms": round(1000 * total / count, 2),
            "p50_ms": round(1000 * histogram_quantile(0.5, buckets), 2),
            "p99_ms": round(1000 * histogram_quantile(0.99, buckets), 2),
        }
    return summary


PROFILED = ("extender", "controllers")


async def run_phase(
    api: Api,
    facts: dict[str, str],
    name: str,
    pods: int,
    limit_s: float,
    *,
    sched_url: str,
    pids: dict[str, int],
    round_: int = 0,
    profile: Path | None = None,
    ext_url: str = "",
) -> Phase:
    scheduler = PROFILES[name]
    namespace = f"bench-{name}-{round_}"
    await api.ok("POST", "/api/v1/namespaces", granted_namespace(namespace))
    classes = DRA_CLASSES.get(name)
    if classes is not None:
        for template in claim_templates(namespace, classes):
            await api.ok("POST", f"{DRA}/namespaces/{namespace}/resourceclaimtemplates", template)
    bound_at: dict[str, float] = {}
    created_at: dict[str, float] = {}
    started = asyncio.Event()
    watcher = asyncio.create_task(watch_binds(api, namespace, bound_at, started))
    await asyncio.wait_for(started.wait(), 30)
    ext_url = ext_url or facts["TL_CLUSTER_EXTENDER_PROBE_URL"]
    token = facts["TL_CLUSTER_TOKEN"]
    before = await scrape(ext_url, api.session, token)
    sched_before = await scrape_scheduler(sched_url, api.session, scheduler)
    cpu_before = {what: cpu_s(pid) for what, pid in pids.items()}

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(pods):
        queue.put_nowait(i)

    async def creator() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            pod = bench_pod(i, namespace, scheduler, classes)
            await api.ok("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
            created_at[pod["metadata"]["name"]] = time.monotonic()

    log(f"phase {name}: creating {pods} pods (schedulerName {scheduler})")
    with profiling(
        profile if name in ("extender", "variant") else None,
        {what: pids[what] for what in PROFILED},
        f"{name}-r{round_}",
    ):
        t0 = time.monotonic()
        await asyncio.gather(*(creator() for _ in range(32)))
        t_created = time.monotonic()
        deadline = t0 + limit_s
        last_report = t0
        while len(bound_at) < pods and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log(f"phase {name}: {len(bound_at)}/{pods} bound after {last_report - t0:.0f} s")
        cpu_after = {what: cpu_s(pid) for what, pid in pids.items()}
    after = await scrape(ext_url, api.session, token)
    sched_after = await scrape_scheduler(sched_url, api.session, scheduler)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
        await watcher

    phase = Phase(name, pods, create_s=round(t_created - t0, 2), bound=len(bound_at))
    phase.round = round_
    phase.cpu_ms_per_pod = {
        what: round(1000 * (cpu_after[what] - cpu_before[what]) / max(1, len(bound_at)), 2)
        for what in pids
    }
    if bound_at:
        times = sorted(bound_at.values())
        phase.total_s = round(times[-1] - t0, 2)
        phase.pods_per_s = round(len(times) / (times[-1] - t0), 1)
        lo, hi = times[int(0.1 * (len(times) - 1))], times[int(0.9 * (len(times) - 1))]
        if hi > lo:
            phase.pods_per_s_10_90 = round(
                (int(0.9 * (len(times) - 1)) - int(0.1 * (len(times) - 1))) / (hi - lo), 1
            )
        latencies = [bound_at[n] - created_at[n] for n in bound_at if n in created_at]
        phase.latency_p50_s = round(quantile(latencies, 0.5), 3)
        phase.latency_p99_s = round(quantile(latencies, 0.99), 3)
    if name in ("extender", "variant"):
        phase.extender = extender_summary(before, after)
    phase.scheduler = scheduler_summary(sched_before, sched_after)
    log(
        f"phase {name}: {phase.bound}/{pods} bound in {phase.total_s} s ({phase.pods_per_s} pods/s)"
    )
    return phase


async def delete_namespace(api: Api, namespace: str, limit_s: float = 300) -> None:
    await api.call("DELETE", f"/api/v1/namespaces/{namespace}")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        status, _ = await api.call("GET", f"/api/v1/namespaces/{namespace}")
        if status == 404:
            return
        await asyncio.sleep(1)
    raise RuntimeError(f"namespace {namespace} not gone after {limit_s} s")


def scheduler_config(facts: dict[str, str], port: int, out: Path, *, tls: bool) -> Path:
    """The default scheduler's configuration (the chart's), for profile NULL and the do-nothing
    extender on loopback, filter and prioritize only: over HTTPS with the scheduler's client
    certificate as the chart's (``tls``), else plain HTTP."""
    import yaml

    src = Path(facts["TL_CLUSTER_DIR"]) / "scheduler-default-scheduler" / "config.yaml"
    cfg = yaml.safe_load(src.read_text())
    cfg["profiles"] = [{"schedulerName": NULL}]
    (ext,) = cfg["extenders"]
    ext["urlPrefix"] = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    ext["enableHTTPS"] = tls
    for key in ("bindVerb", "preemptVerb") if tls else ("tlsConfig", "bindVerb", "preemptVerb"):
        ext.pop(key, None)
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[Any], what: str, log_path: Path) -> None:
    """Until ``url`` answers 2xx (certificates not checked: our own loopback processes)."""
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=2):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start: {log_path}") from None
            time.sleep(0.3)


@contextlib.contextmanager
def side_scheduler(facts: dict[str, str], work: Path, name: str, config: Path) -> Any:
    """A kube-scheduler of its own with ``config``; yields (its pid, its URL)."""
    port = free_port()
    kube_scheduler = Path(facts["TL_CLUSTER_KUBECTL"]).parent / "kube-scheduler"
    log_path = work / f"{name}-scheduler.log"
    with log_path.open("w") as logf:
        sched = subprocess.Popen(
            [str(kube_scheduler), f"--config={config}", "--bind-address=127.0.0.1",
             "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
             f"--secure-port={port}", f"--cert-dir={work / name}", "--v=1"],
            stdout=logf, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"https://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", sched, f"the {name} kube-scheduler", log_path)
        yield sched.pid, url
    finally:
        sched.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            sched.wait(10)


@contextlib.contextmanager
def null_extender(facts: dict[str, str], work: Path, *, tls: bool) -> Any:
    """The do-nothing extender (built from benchmarks/nullextender) and a kube-scheduler for
    profile NULL calling it; yields (their pids, the scheduler's URL). ``tls``: served as the
    tidelease extender is (HTTPS, the scheduler's client certificate required, HTTP/1.1), with
    its certificates."""
    binary = work / "nullextender"
    subprocess.run(
        ["go", "build", "-o", str(binary), "."],
        cwd=ROOT / "benchmarks" / "nullextender",
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"},
        check=True,
    )
    argv = [str(binary)]
    if tls:
        serving = Path(facts["TL_CLUSTER_EXTENDER_CLIENT_CERTS"]).parent / "serving"
        argv += [f"-tls-cert={serving / 'tls.crt'}", f"-tls-key={serving / 'tls.key'}",
                 f"-client-ca={serving / 'ca.crt'}"]  # fmt: skip
    ext = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert ext.stdout is not None
        port = int(ext.stdout.readline())
        config = scheduler_config(facts, port, work / "null-scheduler.yaml", tls=tls)
        with side_scheduler(facts, work, "null", config) as (sched_pid, url):
            how = "HTTPS, client certificates required" if tls else "plain HTTP"
            log(f"do-nothing extender on port {port} ({how}), its kube-scheduler at {url}")
            yield {"null-extender": ext.pid, "kube-scheduler": sched_pid}, url
    finally:
        ext.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            ext.wait(10)


@contextlib.contextmanager
def variant_extender(
    facts: dict[str, str],
    work: Path,
    settings: dict[str, str],
    *,
    tls: bool,
    source: Path | None = None,
) -> Any:
    """A second tidelease extender, started as hack/lib/cluster.sh starts the first but with
    ``settings`` (TIDELEASE_EXTENDER_<KEY>=VALUE), and a kube-scheduler for profile VARIANT
    calling it with the chart's configuration; yields (the scheduler's URL, their pids, the
    extender's probe URL). Both extenders watch the cluster throughout, as two replicas.
    Without ``tls`` the verbs are plain HTTP on loopback, as in the ownScheduler mode (where
    kube-scheduler runs in the extender's pod). ``source``: a tree of tidelease's sources to
    run the extender from instead of this one."""
    import yaml

    serving = Path(facts["TL_CLUSTER_EXTENDER_CLIENT_CERTS"]).parent / "serving"
    port, probe_port = free_port(), free_port()
    env = {
        **os.environ,
        "TIDELEASE_EXTENDER_METRICS_AUTH": "true",
        "TIDELEASE_EXTENDER_SCHEDULER_NAMES": VARIANT,  # bind serves its scheduler's pods only
    }
    env.update({f"TIDELEASE_EXTENDER_{k.upper()}": v for k, v in settings.items()})
    if source is not None:  # ahead of this tree's editable install
        env["PYTHONPATH"] = str(source.resolve())
    log_path = work / "variant-extender.log"
    argv = [str(ROOT / ".venv" / "bin" / "tidelease"), "extender",
            "--kubeconfig", facts["KUBECONFIG"], "--host", "127.0.0.1", "--port", str(port),
            "--probe-host", "127.0.0.1", "--probe-port", str(probe_port)]  # fmt: skip
    if tls:
        argv += ["--tls-cert-file", str(serving / "tls.crt"),
                 "--tls-key-file", str(serving / "tls.key"),
                 "--client-ca-file", str(serving / "ca.crt")]  # fmt: skip
    with log_path.open("w") as logf:
        ext = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env)
    try:
        probe_url = f"http://127.0.0.1:{probe_port}"
        wait_http(f"{probe_url}/readyz", ext, "the variant extender", log_path)
        src = Path(facts["TL_CLUSTER_DIR"]) / "scheduler-default-scheduler" / "config.yaml"
        cfg = yaml.safe_load(src.read_text())
        cfg["profiles"] = [{"schedulerName": VARIANT}]
        cfg["leaderElection"] = {"leaderElect": False}
        (ext_cfg,) = cfg["extenders"]
        ext_cfg["urlPrefix"] = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        if not tls:
            ext_cfg["enableHTTPS"] = False
            ext_cfg.pop("tlsConfig", None)
        config = work / "variant-scheduler.yaml"
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        with side_scheduler(facts, work, "variant", config) as (sched_pid, url):
            how = "HTTPS" if tls else "plain HTTP"
            what = f"{settings}, {how}" + (f", from {source}" if source else "")
            log(f"variant extender ({what}) on port {port}, its scheduler at {url}")
            yield url, {"extender": ext.pid, "kube-scheduler": sched_pid}, probe_url
    finally:
        ext.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            ext.wait(20)


async def bench(facts: dict[str, str], args: argparse.Namespace, work: Path) -> list[Phase]:
    ctx = ssl.create_default_context(cafile=facts["TL_CLUSTER_CA"])
    connector = aiohttp.TCPConnector(ssl=ctx, limit=64)
    common = {
        "kube-apiserver": int(facts["TL_CLUSTER_APISERVER_PID"]),
        "kube-controller-manager": int(facts["TL_CLUSTER_KCM_PID"]),  # DRA: claims from templates
        "extender": int(facts["TL_CLUSTER_EXTENDER_PID"]),
        "controllers": int(facts["TL_CLUSTER_CONTROLLERS_PID"]),
    }
    phases = []
    with contextlib.ExitStack() as stack:
        # phase -> (its kube-scheduler's URL, the pids it adds or replaces, extender probes);
        # the side extenders and schedulers only for phases that run (they would load the
        # machine while others are measured)
        plain = (
            facts["TL_CLUSTER_PLAIN_SCHEDULER_URL"],
            {"kube-scheduler": int(facts["TL_CLUSTER_PLAIN_SCHEDULER_PID"])},
            "",
        )
        schedulers: dict[str, tuple[str, dict[str, int], str]] = {
            "plain": plain,
            "extender": (facts["TL_CLUSTER_SCHEDULER_URL"],
                         {"kube-scheduler": int(facts["TL_CLUSTER_SCHEDULER_PID"])}, ""),
            "dra-tidelease": plain,
            "dra-plain": plain,
        }  # fmt: skip
        if "null" in args.phases:
            null_pids, null_url = stack.enter_context(
                null_extender(facts, work, tls=not args.null_http)
            )
            schedulers["null"] = (null_url, null_pids, "")
        if args.compare is not None or args.variant_http or args.variant_source:
            schedulers["variant"] = stack.enter_context(
                variant_extender(
                    facts,
                    work,
                    args.compare or {},
                    tls=not args.variant_http,
                    source=args.variant_source,
                )
            )
        schedulers = {k: schedulers[k] for k in [*args.phases, "variant"] if k in schedulers}
        async with aiohttp.ClientSession(connector=connector) as session:
            api = Api(session, facts)
            await make_leases(api, args.leases)
            if any(name in DRA_CLASSES for name in schedulers):
                await publish_slices(api)
            for r in range(args.rounds):
                order = list(schedulers)
                if r % 2:
                    order.reverse()
                for name in order:
                    url, pids, probes = schedulers[name]
                    phases.append(
                        await run_phase(
                            api, facts, name, args.pods, args.timeout,
                            sched_url=url, pids={**common, **pids}, round_=r,
                            profile=args.profile, ext_url=probes,
                        )
                    )  # fmt: skip
                    t = time.monotonic()
                    await delete_namespace(api, f"bench-{name}-{r}")
                    log(f"deleted the {name} phase's pods in {time.monotonic() - t:.0f} s")
    return phases


def read_state(path: Path) -> dict[str, str]:
    facts = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key] = value
    return facts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1250)
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2, help="rounds of the three phases")
    p.add_argument("--qps", type=float, default=500)
    p.add_argument("--burst", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=900, help="seconds per phase")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the cluster directory (logs)")
    p.add_argument(
        "--profile", type=Path, help="py-spy the extender and the controllers into this directory"
    )
    p.add_argument(
        "--null-http",
        action="store_true",
        help="serve the do-nothing extender over plain HTTP (the record before the extender's "
        "HTTPS; default: HTTPS with client certificates, as the extender)",
    )
    p.add_argument(
        "--compare",
        type=settings_pairs,
        metavar="KEY=VALUE,...",
        help="a fourth phase, 'variant': a second tidelease extender with these settings "
        "(e.g. bind_attempts=2) and a kube-scheduler of its own",
    )
    p.add_argument(
        "--variant-http",
        action="store_true",
        help="the variant phase's extender over plain HTTP on loopback, as in the ownScheduler "
        "mode (with --null-http: both without TLS)",
    )
    p.add_argument(
        "--variant-source",
        type=Path,
        help="run the variant's extender from the tidelease sources in this directory (the "
        "code before a change), to judge a change of code in one run",
    )
    p.add_argument(
        "--phases",
        type=lambda text: text.split(","),
        default=["plain", "null", "extender"],
        metavar="NAME,...",
        help="the phases of each round, of plain, null, extender, dra-tidelease, dra-plain "
        "(default: plain,null,extender; --compare adds variant)",
    )
    p.add_argument(
        "--leases",
        type=int,
        default=0,
        help="GpuLeases in the cluster throughout (each of an idle StatefulSet): what the "
        "controllers cost while they have leases to watch for",
    )
    p.add_argument(
        "--controllers",
        default="--leasing-controller --prewarm-controller",
        help="the controllers' flags (default: the chart's default controllers)",
    )
    p.add_argument(
        "--topology",
        default="",
        metavar="LAYOUT",
        help="every kwok node's GpuNode publishes the topology of this NVML fake layout (8 GPUs: "
        "nvswitch-8 or pcie-2socket-8): placement's topology tie-break at scale",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a few seconds of every phase (24 nodes, 16 pods, one round, a variant with "
        "bind_attempts=2): that the script still runs, not a measurement",
    )
    args = p.parse_args()
    if args.smoke:
        args.nodes, args.pods, args.rounds, args.timeout = 24, 16, 1, 180
        args.phases = [name for name in PROFILES if name != "variant"]
        args.compare = args.compare or {"bind_attempts": "2"}
    choices = set(PROFILES) - {"variant"}  # the variant phase comes with --compare
    if set(args.phases) - choices:
        p.error(f"unknown phases {sorted(set(args.phases) - choices)}: of {sorted(choices)}")
    wanted = sum(SIZES[i % len(SIZES)] for i in range(args.pods))
    if wanted > 8 * args.nodes:
        p.error(f"{args.pods} pods need {wanted} GPUs; {args.nodes} nodes have {8 * args.nodes}")

    # SIGTERM unwinds as Ctrl-C does: the side extenders and schedulers are stopped, and the
    # cluster follows its parent (TL_CLUSTER_PARENT_PID).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = Path(tempfile.mkdtemp(prefix="tidelease-bench."))
    state = base / "cluster" / "cluster.env"
    env = {
        **os.environ,
        "TL_CLUSTER_DIR": str(state.parent),
        "TL_CLUSTER_NODES": str(args.nodes),
        "TL_CLUSTER_PLAIN_SCHEDULER": "true",
        "TL_CLUSTER_PARENT_PID": str(os.getpid()),
        "TL_CLUSTER_SCHEDULER_QPS": str(args.qps),
        "TL_CLUSTER_SCHEDULER_BURST": str(args.burst),
        # 1,250 kwok nodes renewing 40 s leases every 10 s would be most of the API traffic.
        "TL_CLUSTER_NODE_LEASE_S": "240",
        "TL_CLUSTER_NODE_GRACE": "600s",
        "TL_CLUSTER_READY_TIMEOUT": "900",
        "TL_CLUSTER_KEEP_DIR": "true" if args.keep else "false",
        "TL_CLUSTER_CONTROLLER_FLAGS": args.controllers,
        # Every kwok node's GpuNode publishing the topology of this NVML fake layout.
        "TL_CLUSTER_NODE_TOPOLOGY": args.topology,
    }
    log_path = base / "cluster-up.log"
    log(f"starting a cluster with {args.nodes} kwok GPU nodes in {base}")
    t0 = time.monotonic()
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            [str(ROOT / "hack" / "cluster-up.sh"), "-f"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        while not state.exists():
            if proc.poll() is not None:
                sys.stderr.write(log_path.read_text()[-4000:])
                log("the cluster did not start (binaries missing? run hack/build-binaries.sh)")
                return 1
            time.sleep(0.5)
        up_s = time.monotonic() - t0
        log(f"cluster up in {up_s:.0f} s")
        facts = read_state(state)
        phases = asyncio.run(bench(facts, args, base))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not args.keep:
            with contextlib.suppress(OSError):
                log_path.unlink()
                base.rmdir()

    result = {
        "nodes": args.nodes,
        "null_extender": "http" if args.null_http else "https",
        "controllers": args.controllers,
        "compare": args.compare,
        "variant_source": str(args.variant_source) if args.variant_source else None,
        "leases": args.leases,
        "pods": args.pods,
        "scheduler_qps": args.qps,
        "scheduler_burst": args.burst,
        "cluster_up_s": round(up_s, 1),
        "cpus": os.cpu_count(),
        "phases": [asdict(ph) for ph in phases],
    }
    print(
        f"\n{args.pods} GPU pods onto {args.nodes} kwok nodes ({os.cpu_count()} CPUs), "
        f"{args.rounds} rounds:"
    )
    for ph in phases:
        print(
            f"  {ph.name:9s} round {ph.round}: {ph.bound}/{ph.pods} bound in {ph.total_s:6.1f} s: "
            f"{ph.pods_per_s:6.1f} pods/s overall, {ph.pods_per_s_10_90:6.1f} pods/s 10-90%, "
            f"create->bound p50 {ph.latency_p50_s:.2f} s p99 {ph.latency_p99_s:.2f} s"
        )
        sc = ph.scheduler
        if sc:
            print(
                f"  {'':9s} kube-scheduler: attempt p50 {sc.get('attempt_p50_ms')} ms "
                f"p99 {sc.get('attempt_p99_ms')} ms; algorithm (extender calls included) "
                f"p50 {sc.get('algorithm_p50_ms')} ms p99 {sc.get('algorithm_p99_ms')} ms; "
                f"attempts {sc.get('attempts')}"
            )
        cpu = ", ".join(f"{k} {v}" for k, v in ph.cpu_ms_per_pod.items())
        print(f"  {'':9s} CPU ms per pod: {cpu}")
    rate = {
        name: statistics.median(ph.pods_per_s for ph in phases if ph.name == name)
        for name in PROFILES
        if any(ph.name == name for ph in phases)
    }
    print("  median pods/s: " + ", ".join(f"{n} {r:.1f}" for n, r in rate.items()))
    for a, b in RATIOS:
        if rate.get(a) and rate.get(b):
            per_round = [
                f"{x.pods_per_s / y.pods_per_s:.2f}x"
                for x, y in zip(
                    [ph for ph in phases if ph.name == a],
                    [ph for ph in phases if ph.name == b],
                    strict=True,
                )
            ]
            what = a
            if a == "variant":
                what += f" ({args.compare or {}}{', plain HTTP' if args.variant_http else ''}"
                what += f", from {args.variant_source})" if args.variant_source else ")"
            print(
                f"  ratio {what} / {b}: {rate[a] / rate[b]:.2f}x (per round: "
                f"{', '.join(per_round)})"
            )
    for name in ("extender", "variant"):
        last = [ph for ph in phases if ph.name == name][-1:]
        if not last:
            continue
        print(f"  {name} latency under that load (from its /metrics histogram), last round:")
        for verb, summary in last[0].extender.items():
            print(
                f"    {verb:10s} {summary['requests']:5d} requests {summary['outcomes']}: "
                f"p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms, "
                f"mean {summary['mean_ms']} ms"
            )
    if args.profile:
        for what in PROFILED:
            for path in sorted(args.profile.glob(f"{what}-*.txt")):
                print(f"  profile of the {what}, {path.name}:")
                print("\n".join(f"    {line}" for line in profile_summary(path)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if all(ph.bound == ph.pods for ph in phases) else 1


if __name__ == "__main__":
    sys.exit(main())
