"""The extender over real HTTP, with bodies exactly as kube-scheduler's extender client sends."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from common import builders, contract
from extender.cluster.store import MemoryStore
from extender.scheduler.extenderserver import serve
from extender.scheduler.settings import ExtenderSettings
from tests.integration.conftest import Server, small_cluster

NODES = ["node-a", "node-b", "node-c", "node-s", "node-la"]

# Go's encoding/json of extenderv1.ExtenderArgs for a nodeCacheCapable extender: Nodes is null.
POD_JSON = json.dumps(
    {
        "metadata": {
            "name": "hp-a",
            "namespace": "default",
            "uid": "uid-hp-a",
            "resourceVersion": "1042",
            "creationTimestamp": "2026-11-21T10:00:00Z",
            "annotations": {
                "tidelease.io/priority": "high",
                "tidelease.io/owner": "job-a",
                "tidelease.io/reliability": "HA",
                "tidelease.io/checkpoint": "ck",
            },
            "managedFields": [],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:v1",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "4"},
                        "requests": {"cpu": "1", "nvidia.com/gpu": "4"},
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "priorityClassName": "tidelease-online",
            "priority": 1000,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    },
    separators=(",", ":"),
)


async def test_filter_with_node_names(server: Server) -> None:
    body = '{"Pod":' + POD_JSON + ',"Nodes":null,"NodeNames":' + json.dumps(NODES) + "}"
    status, reply = await server.post_raw("filter", body)
    assert status == 200
    assert set(reply) == {
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    }
    assert reply["Nodes"] is None
    assert reply["Error"] == ""
    assert reply["NodeNames"] == ["node-a", "node-c"]
    assert "another job" in reply["FailedAndUnresolvableNodes"]["node-b"]
    assert "standby" in reply["FailedAndUnresolvableNodes"]["node-s"]
    assert "reliability" in reply["FailedAndUnresolvableNodes"]["node-la"]
    assert reply["FailedNodes"] == {}


def node_object(name: str) -> dict:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"gpu": "h20"}},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}},
    }


async def test_filter_with_full_nodes(server: Server) -> None:
    items = [node_object(n) for n in NODES]
    body = (
        '{"Pod":'
        + POD_JSON
        + ',"Nodes":'
        + json.dumps({"metadata": {}, "items": items})
        + ',"NodeNames":null}'
    )
    status, reply = await server.post_raw("filter", body)
    assert status == 200
    assert reply["NodeNames"] is None
    # The passing nodes come back whole, as they were sent.
    assert reply["Nodes"]["items"] == [node_object("node-a"), node_object("node-c")]


async def test_prioritize_both_modes(server: Server) -> None:
    names = ["node-a", "node-c"]
    status, scores = await server.post_raw(
        "prioritize", '{"Pod":' + POD_JSON + ',"Nodes":null,"NodeNames":' + json.dumps(names) + "}"
    )
    assert status == 200
    assert [s["Host"] for s in scores] == names
    assert all(isinstance(s["Score"], int) and 0 <= s["Score"] <= 10 for s in scores)
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert by_host["node-a"] > by_host["node-c"]  # node-a holds the checkpoint
    items = {"metadata": {}, "items": [node_object(n) for n in names]}
    status, again = await server.post_raw(
        "prioritize", '{"Pod":' + POD_JSON + ',"Nodes":' + json.dumps(items) + ',"NodeNames":null}'
    )
    assert status == 200
    assert again == scores


async def test_bind_writes_devices_then_binds(server: Server) -> None:
    status, reply = await server.post_raw(
        "bind", '{"PodName":"hp-a","PodNamespace":"default","PodUID":"uid-hp-a","Node":"node-a"}'
    )
    assert (status, reply) == (200, {"Error": ""})
    pod = server.store.get("Pod", "default", "hp-a")
    assert pod is not None
    assert pod["spec"]["nodeName"] == "node-a"
    devices = pod["metadata"]["annotations"][contract.ANN_DEVICES].split(",")
    assert devices == [builders.device_uuid("node-a", i) for i in range(4)]


async def test_bind_to_a_node_without_room_reports_in_error_field(server: Server) -> None:
    status, reply = await server.post(
        "bind",
        {"PodName": "hp-a", "PodNamespace": "default", "PodUID": "uid-hp-a", "Node": "node-b"},
    )
    assert status == 200
    assert "another job" in reply["Error"]
    assert reply["Error"].startswith("tidelease: ")
    assert reply["Error"].count("tidelease: ") == 1  # placement's reason keeps its one prefix
    assert (server.store.get("Pod", "default", "hp-a") or {})["spec"].get("nodeName") is None


async def test_preempt_answers_meta_victims_with_borrowers(server: Server) -> None:
    # The borrower holds node-a's 8 devices; the high-priority pod needs 4 of them.
    await server.post(
        "bind",
        {
            "PodName": "borrower",
            "PodNamespace": "default",
            "PodUID": "uid-borrower",
            "Node": "node-a",
        },
    )
    await server.store.settle()
    body = (
        '{"Pod":' + POD_JSON + ',"NodeNameToVictims":null,"NodeNameToMetaVictims":'
        '{"node-a":{"Pods":[{"UID":"uid-borrower"}],"NumPDBViolations":0},'
        '"node-b":{"Pods":[],"NumPDBViolations":0}}}'
    )
    status, reply = await server.post_raw("preempt", body)
    assert status == 200
    assert reply == {
        "NodeNameToMetaVictims": {
            "node-a": {"Pods": [{"UID": "uid-borrower"}], "NumPDBViolations": 0}
        }
    }


async def test_preempt_accepts_full_victims_and_still_answers_meta(server: Server) -> None:
    await server.post(
        "bind",
        {
            "PodName": "borrower",
            "PodNamespace": "default",
            "PodUID": "uid-borrower",
            "Node": "node-a",
        },
    )
    await server.store.settle()
    victim = server.store.get("Pod", "default", "borrower")
    body = {
        "Pod": json.loads(POD_JSON),
        "NodeNameToVictims": {"node-a": {"Pods": [victim], "NumPDBViolations": 1}},
        "NodeNameToMetaVictims": None,
    }
    status, reply = await server.post("preempt", body)
    assert status == 200
    assert reply["NodeNameToMetaVictims"]["node-a"] == {
        "Pods": [{"UID": "uid-borrower"}],
        "NumPDBViolations": 1,
    }


async def test_filter_error_field_for_invalid_annotation(server: Server) -> None:
    pod = json.loads(POD_JSON)
    pod["metadata"]["annotations"]["tidelease.io/reliability"] = "HIGH"
    status, reply = await server.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": NODES})
    assert status == 200
    assert "tidelease.io/reliability: invalid value 'HIGH'" in reply["Error"]


async def test_probes_and_metrics(server: Server) -> None:
    await server.post("filter", {"Pod": json.loads(POD_JSON), "Nodes": None, "NodeNames": NODES})
    async with server.session.get(f"{server.url}/healthz") as r:
        assert r.status == 200
    async with server.session.get(f"{server.url}/readyz") as r:
        assert r.status == 200
    async with server.session.get(f"{server.url}/metrics") as r:
        text = await r.text()
    assert 'tidelease_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
    assert 'tidelease_extender_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'tidelease_extender_decisions_total{reason="fits",verb="filter"} 2.0' in text
    server.running.app.draining = True
    async with server.session.get(f"{server.url}/readyz") as r:
        assert r.status == 503


async def test_probes_on_a_port_of_their_own_leave_the_verbs_port_to_the_verbs() -> None:
    """With probe_port, the verbs listen alone (on loopback in a pod, beside kube-scheduler)
    and /healthz, /readyz, /metrics answer on the other port, which has no verbs."""
    settings = ExtenderSettings(host="127.0.0.1", port=0, probe_host="127.0.0.1", probe_port=0)
    async with (
        serve(store=MemoryStore(small_cluster()), settings=settings) as running,
        aiohttp.ClientSession() as s,
    ):
        assert running.probe_url is not None
        assert running.probe_url != running.url
        pod = {"Pod": json.loads(POD_JSON), "Nodes": None, "NodeNames": NODES}
        async with s.post(f"{running.url}/filter", json=pod) as r:
            assert r.status == 200
        for path in ("healthz", "readyz", "metrics"):
            async with s.get(f"{running.probe_url}/{path}") as r:
                assert r.status == 200, path
            async with s.get(f"{running.url}/{path}") as r:
                assert r.status == 404, path
        async with s.post(f"{running.probe_url}/filter", json=pod) as r:
            assert r.status in (404, 405)


async def test_readiness_follows_the_api_server_and_a_hung_bind_answers_in_time() -> None:
    """While the store does not answer, /readyz turns 503 within stale_after_s (plus a probe)
    and a bind that would hang answers with the protocol's Error before kube-scheduler's
    timeout; once it answers again, ready again."""
    import time

    settings = ExtenderSettings(host="127.0.0.1", port=0, stale_after_s=0.4, bind_timeout_s=0.5)
    store = MemoryStore(small_cluster())
    async with serve(store=store, settings=settings) as running, aiohttp.ClientSession() as s:

        async def ready() -> int:
            async with s.get(f"{running.url}/readyz") as r:
                return r.status

        assert await ready() == 200
        store.down = True
        start = time.monotonic()
        while await ready() == 200:
            assert time.monotonic() - start < 3, "still ready long after the store went silent"
            await asyncio.sleep(0.05)
        async with s.get(f"{running.url}/readyz") as r:
            assert "has not answered" in await r.text()
        start = time.monotonic()
        body = {
            "PodName": "hp-a",
            "PodNamespace": "default",
            "PodUID": "uid-hp-a",
            "Node": "node-a",
        }
        async with s.post(f"{running.url}/bind", json=body) as r:
            reply = await r.json()
        assert time.monotonic() - start < 2
        assert "bind did not finish within 0.5 s" in reply["Error"]
        store.down = False
        start = time.monotonic()
        while await ready() != 200:
            assert time.monotonic() - start < 3, "not ready again after the store came back"
            await asyncio.sleep(0.05)


async def test_sigterm_with_a_hung_bind_in_flight_stops_within_the_grace_period() -> None:
    """Stop (what SIGTERM sets) while a bind hangs on a silent API server: readiness fails,
    the bind answers by its timeout, and the process is done well within the pod's 15 s (it
    took 29.6 s: aiohttp waits a minute for in-flight handlers by default)."""
    import time

    from extender.scheduler.extenderserver import run_extender

    settings = ExtenderSettings(host="127.0.0.1", port=0, bind_timeout_s=2.0)
    store = MemoryStore(small_cluster())
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        run_extender(store=store, settings=settings, stop=stop, drain_s=1.0, ready=ready)
    )
    url = await asyncio.wait_for(ready, timeout=10)
    store.down = True
    body = {"PodName": "hp-a", "PodNamespace": "default", "PodUID": "uid-hp-a", "Node": "node-a"}
    async with aiohttp.ClientSession() as s:
        bind = asyncio.create_task(s.post(f"{url}/bind", json=body))
        await asyncio.sleep(0.2)  # in flight, hanging on the store
        start = time.monotonic()
        stop.set()
        await asyncio.wait_for(server, timeout=20)
        stopped_s = time.monotonic() - start
        async with await bind as r:
            assert "bind did not finish" in (await r.json())["Error"]
    assert stopped_s < 1.0 + 2.0 + 2.0  # the drain, a bind's timeout, slack


FREEZE_PROBE = """
import asyncio, gc, sys
from extender.cluster.store import MemoryStore
from extender.scheduler.extenderserver import run_extender
from extender.scheduler.settings import ExtenderSettings
from tests.integration.conftest import small_cluster

async def main() -> None:
    stop = asyncio.Event()
    ready = asyncio.get_running_loop().create_future()
    settings = ExtenderSettings(host="127.0.0.1", port=0)
    server = asyncio.create_task(run_extender(
        store=MemoryStore(small_cluster()), settings=settings, stop=stop, drain_s=0.0,
        ready=ready, freeze=sys.argv[1] == "freeze",
    ))
    await asyncio.wait_for(ready, timeout=10)
    print(gc.get_freeze_count())
    stop.set()
    await server

asyncio.run(main())
"""


def test_the_extender_process_moves_what_it_holds_once_synced_out_of_the_collectors_way() -> None:
    """``tidelease extender`` freezes (gc.freeze) what it holds once synced and listening; an
    extender run inside another process (these tests) leaves that process's collector alone."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def frozen(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", FREEZE_PROBE, mode],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return int(out.stdout.split()[-1])

    assert frozen("freeze") > 10_000  # the modules and the view, at least
    assert frozen("no") == 0


async def test_a_verbs_log_lines_name_the_verb_and_the_pod(server: Server) -> None:
    """--log-format json: the bind's own line, and a refused bind's, say which verb and pod."""
    from tests.logcapture import json_log_lines

    with json_log_lines() as lines:
        for pod, uid, node in (
            ("hp-a", "uid-hp-a", "node-a"),
            ("borrower", "uid-borrower", "node-c"),
        ):
            body = {"PodName": pod, "PodNamespace": "default", "PodUID": uid, "Node": node}
            assert (await server.post("bind", body))[0] == 200
    entries = lines.entries()
    about = {
        (e.get("verb"), e.get("namespace"), e.get("name"))
        for e in entries
        if e["logger"] == "extender.scheduler.binding" or "bind of" in e["msg"]
    }
    assert about == {("bind", "default", "hp-a"), ("bind", "default", "borrower")}, entries


async def test_a_pod_tidelease_refuses_is_filtered_out_scored_flat_and_preempts_nobody(
    server: Server,
) -> None:
    """A high-priority pod of a namespace not granted online jobs (docs/tenancy.md): the filter
    says why in its Error; prioritize and preempt, which kube-scheduler may call for it anyway
    (preempt after its own filters refused every node), answer nothing for it, not a 400."""
    from common.model import Priority, Tier
    from common.tenancy import online_refusal

    pod = builders.pod(
        "intruder", 4, namespace="team-b", priority=Priority.HIGH, owner="job-b", tier=Tier.HA
    )
    nodes = ["node-a", "node-b"]
    status, reply = await server.post("filter", {"Pod": pod, "NodeNames": nodes})
    assert status == 200
    assert reply["Error"] == "tidelease: " + online_refusal(
        "team-b", f"{contract.ANN_PRIORITY}: high"
    )
    status, reply = await server.post("prioritize", {"Pod": pod, "NodeNames": nodes})
    assert (status, reply) == (200, [{"Host": n, "Score": 0} for n in nodes])
    status, reply = await server.post(
        "preempt",
        {
            "Pod": pod,
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {"node-a": {"Pods": [], "NumPDBViolations": 0}},
        },
    )
    assert (status, reply) == (200, {"NodeNameToMetaVictims": {}})
