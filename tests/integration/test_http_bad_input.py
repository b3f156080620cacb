"""Bad input gets a clear message in the protocol's Error field or a 4xx; never a 500, never a
state change."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import builders
from extender.cluster.store import MemoryStore
from extender.scheduler.extenderserver import serve
from extender.scheduler.handlers import MAX_BODY_BYTES
from extender.scheduler.settings import ExtenderSettings
from tests.integration.conftest import Server, small_cluster

VERBS = ["filter", "prioritize", "bind", "preempt"]
GOOD_POD = builders.pod("hp-a", 4, uid="uid-hp-a")


def snapshot(store: MemoryStore) -> list[Any]:
    return [store.objects(k) for k in ("Pod", "GpuNode", "GpuAllocation")]


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b"null", "must be a JSON object"),
        (b"{}", ""),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON: nested too deeply"),
        (b'{"Pod":' + b"[" * 5_000 + b"]" * 5_000 + b"}", "not valid JSON: nested too deeply"),
        (b'{"Pod":1' + b"0" * 5_000 + b"}", "not valid JSON: Exceeds the limit"),
        (b'{"Pod":{},"NodeNames":[],"x":NaN}', "not valid JSON: NaN is not JSON"),
        (b'{"Pod":{},"NodeNames":[],"x":-Infinity}', "not valid JSON: -Infinity is not JSON"),
    ],
    ids=[
        "truncated",
        "binary",
        "array",
        "null",
        "empty-object",
        "deep-array",
        "deep-field",
        "long-integer",
        "nan",
        "infinity",
    ],
)
async def test_malformed_bodies_get_400(
    server: Server, verb: str, body: bytes, message: str
) -> None:
    before = snapshot(server.store)
    status, reply = await server.post_raw(verb, body)
    assert status == 400
    assert reply["Error"].startswith("tidelease: ")
    assert message in reply["Error"]
    assert snapshot(server.store) == before


@pytest.mark.parametrize(
    ("verb", "body", "message"),
    [
        ("filter", {"Pod": "x", "NodeNames": []}, "Pod is missing or not an object"),
        ("filter", {"Pod": GOOD_POD, "NodeNames": "node-a"}, "NodeNames must be a list"),
        ("filter", {"Pod": GOOD_POD, "NodeNames": [1]}, "NodeNames must be a list of strings"),
        ("filter", {"Pod": GOOD_POD}, "either NodeNames"),
        ("filter", {"Pod": GOOD_POD, "Nodes": {"items": [{}]}}, "metadata.name"),
        ("prioritize", {"Pod": GOOD_POD, "Nodes": []}, "Nodes must be a NodeList"),
        ("bind", {"PodName": "p", "PodNamespace": 3, "PodUID": "u", "Node": "n"}, "PodNamespace"),
        ("bind", {"PodName": "p"}, "PodNamespace, PodUID, Node"),
        ("preempt", {"Pod": GOOD_POD, "NodeNameToMetaVictims": []}, "must be an object"),
        ("preempt", {"Pod": GOOD_POD, "NodeNameToMetaVictims": {"n": {"Pods": [{}]}}}, "UID"),
        (
            "preempt",
            {"Pod": GOOD_POD, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": "1"}}},
            "NumPDBViolations",
        ),
        (
            "preempt",
            {"Pod": GOOD_POD, "NodeNameToVictims": {"n": {"Pods": [{"UID": "x"}]}}},
            "metadata.uid",
        ),
        (
            "preempt",
            {"Pod": GOOD_POD, "NodeNameToVictims": {"n": {"Pods": [{"metadata": "x"}]}}},
            "victims of node n.Pods[0].metadata.uid must be a non-empty string",
        ),
        (
            "preempt",
            {"Pod": GOOD_POD, "NodeNameToVictims": {"n": {"Pods": [{"metadata": ["uid"]}]}}},
            "victims of node n.Pods[0].metadata.uid must be a non-empty string",
        ),
        (
            "preempt",
            {"Pod": GOOD_POD, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": -1}}},
            "victims of node n.NumPDBViolations must be an integer from 0 to 2^63-1",
        ),
        (
            "preempt",
            {"Pod": GOOD_POD, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": 2**63}}},
            "victims of node n.NumPDBViolations must be an integer from 0 to 2^63-1",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 12 else None,
)
async def test_wrongly_typed_fields_get_400(
    server: Server, verb: str, body: dict, message: str
) -> None:
    before = snapshot(server.store)
    status, reply = await server.post(verb, body)
    assert status == 400, reply
    assert message in reply["Error"]
    assert snapshot(server.store) == before


@pytest.mark.parametrize(
    ("verb", "status"),
    [("filter", 200), ("prioritize", 400), ("preempt", 400)],
)
async def test_unknown_annotation_values(server: Server, verb: str, status: int) -> None:
    pod = builders.pod("p", 1, extra_annotations={"tidelease.io/priority": "urgent"})
    body: dict[str, Any] = {"Pod": pod, "NodeNames": ["node-a"]}
    if verb == "preempt":
        body = {"Pod": pod, "NodeNameToMetaVictims": {}}
    got, reply = await server.post(verb, body)
    assert got == status
    assert "tidelease.io/priority: invalid value 'urgent'" in reply["Error"]


@pytest.mark.parametrize("verb", VERBS)
async def test_wrong_method_path_and_size(server: Server, verb: str) -> None:
    async with server.session.get(f"{server.url}/{verb}") as r:
        assert r.status == 405
    async with server.session.post(f"{server.url}/{verb}s", json={}) as r:
        assert r.status == 404
    body = io.BytesIO(b'{"Pod":"' + b"x" * MAX_BODY_BYTES + b'"}')
    async with server.session.post(f"{server.url}/{verb}", data=body) as r:
        assert r.status == 413


async def test_the_node_names_of_10000_nodes_fit_in_a_body(server: Server) -> None:
    names = [f"gpu-node-{i:05d}.zone-a.cluster.example" for i in range(10_000)]
    status, reply = await server.post("filter", {"Pod": GOOD_POD, "NodeNames": names})
    assert status == 200
    assert len(reply["FailedAndUnresolvableNodes"]) == 10_000  # none of them is known


async def test_unknown_nodes(server: Server) -> None:
    status, reply = await server.post("filter", {"Pod": GOOD_POD, "NodeNames": ["ghost"]})
    assert status == 200
    assert "no GPU inventory" in reply["FailedAndUnresolvableNodes"]["ghost"]
    status, scores = await server.post("prioritize", {"Pod": GOOD_POD, "NodeNames": ["ghost"]})
    assert (status, scores) == (200, [{"Host": "ghost", "Score": 0}])
    before = snapshot(server.store)
    status, reply = await server.post(
        "bind",
        {"PodName": "hp-a", "PodNamespace": "default", "PodUID": "uid-hp-a", "Node": "ghost"},
    )
    assert status == 200
    assert "no GPU inventory" in reply["Error"]
    status, reply = await server.post(
        "bind", {"PodName": "nobody", "PodNamespace": "default", "PodUID": "u", "Node": "node-a"}
    )
    assert "not found" in reply["Error"]
    status, reply = await server.post(
        "preempt", {"Pod": GOOD_POD, "NodeNameToMetaVictims": {"ghost": {"Pods": []}}}
    )
    assert (status, reply) == (200, {"NodeNameToMetaVictims": {}})
    assert snapshot(server.store) == before


# --- fuzz: any JSON, and near-miss protocol bodies, at every verb ---
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
protocol_keys = st.sampled_from(
    [
        "Pod",
        "Nodes",
        "NodeNames",
        "PodName",
        "PodNamespace",
        "PodUID",
        "Node",
        "NodeNameToVictims",
        "NodeNameToMetaVictims",
        "metadata",
        "spec",
        "items",
        "name",
        "uid",
        "annotations",
        "containers",
        "resources",
        "limits",
        "nvidia.com/gpu",
        "Pods",
        "UID",
        "tidelease.io/priority",
        "tidelease.io/reliability",
    ]
)
near_miss = st.recursive(
    st.none()
    | st.integers(-2, 9)
    | st.sampled_from(["node-a", "hp-a", "default", "uid-hp-a", "high", "HA", "4", ""]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(protocol_keys, children, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(verb=st.sampled_from(VERBS), body=json_values | near_miss)
def test_fuzz_every_verb_never_500_never_changes_state(verb: str, body: Any) -> None:
    asyncio.run(_fuzz_once(verb, body))


async def _fuzz_once(verb: str, body: Any) -> None:
    store = MemoryStore(small_cluster())
    before = snapshot(store)
    async with (
        serve(store=store, settings=ExtenderSettings(host="127.0.0.1", port=0)) as running,
        aiohttp.ClientSession() as session,
        session.post(f"{running.url}/{verb}", data=json.dumps(body)) as resp,
    ):
        assert resp.status in (200, 400), await resp.text()
        reply = await resp.json(content_type=None)
        if resp.status == 400:
            assert reply["Error"].startswith("tidelease: ")
    assert snapshot(store) == before
