"""The node's ResourceSlice (common.deviceattributes, nodeagent.dradriver.slices): what each device
publishes, which devices are withdrawn, the slice's name and pool generation, and the mirror that
keeps the stored slice equal to what the GpuNode says, against a fake API server that checks
resourceVersions as the real one does.

The CEL of the DeviceClasses is judged by the real kube-scheduler in tests/e2e/test_dra.py."""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from common import builders, contract, deviceattributes
from common.errors import Conflict, InvalidInput, NotFound, Unavailable
from common.kubeclient import KubeClient
from common.model import Tier
from common.reconcile import ReconcileSettings
from nodeagent.dradriver.slices import GPU_NODES, NODES, SliceMirror, run_slice_mirror, sync_once
from tests.polling import eventually

b = builders
NODE = "gpu-node-1"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def gpu_node(*groups: list[Any], unhealthy: dict[int, str] | None = None) -> dict[str, Any]:
    """The GpuNode of NODE with these devices; ``unhealthy``: index -> its health instead."""
    obj = b.gpu_node(NODE, [d for group in groups for d in group])
    for entry in obj["status"]["devices"]:
        if entry["index"] in (unhealthy or {}):
            entry["health"] = (unhealthy or {})[entry["index"]]
    return obj


def attrs(entry: dict[str, Any]) -> dict[str, Any]:
    """A device's attributes by short name, their values unwrapped."""
    prefix = f"{deviceattributes.DOMAIN}/"
    out = {}
    for key, value in entry["attributes"].items():
        assert key.startswith(prefix), key
        ((_, inner),) = value.items()
        out[key.removeprefix(prefix)] = inner
    return out


# --- what the slice publishes ---


def test_each_device_publishes_its_attributes_under_the_tidelease_domain() -> None:
    obj = gpu_node(
        b.devices(NODE, 1, gpu_type="H100", tier=Tier.HA),
        b.devices(NODE, 1, gpu_type="H100", tier=Tier.MA, start=1, owner="job-b", replica="b-0"),
        b.devices(NODE, 1, gpu_type="H100", tier=Tier.LA, start=2, standby=True),
    )
    # The leasing controller marks gpu-1 (lent) and, wrongly, gpu-0 (no owner) as reclaiming.
    tags = obj["spec"]["devices"]
    assert [t["uuid"] for t in tags] == [b.device_uuid(NODE, 1), b.device_uuid(NODE, 2)]
    tags[0]["reclaiming"] = True
    tags.append({"uuid": b.device_uuid(NODE, 0), "reclaiming": True})
    devices = deviceattributes.slice_devices(obj)
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2"]
    assert [attrs(d) for d in devices] == [
        {
            "type": "H100",
            "tier": "HA",
            "tierRank": 3,
            "uuid": b.device_uuid(NODE, 0),
            "index": 0,
            "lentBy": "",
            "replica": "",
            "standby": False,
            "reclaiming": False,  # only a lent device is reclaimed
        },
        {
            "type": "H100",
            "tier": "MA",
            "tierRank": 2,
            "uuid": b.device_uuid(NODE, 1),
            "index": 1,
            "lentBy": "default/job-b",
            "replica": "b-0",
            "standby": False,
            "reclaiming": True,
        },
        {
            "type": "H100",
            "tier": "LA",
            "tierRank": 1,
            "uuid": b.device_uuid(NODE, 2),
            "index": 2,
            "lentBy": "",
            "replica": "",
            "standby": True,
            "reclaiming": False,
        },
    ]
    # Typed as the API wants them: ints for numbers, a bool for standby; no capacity.
    assert devices[0]["attributes"]["tidelease.io/tierRank"] == {"int": 3}
    assert devices[2]["attributes"]["tidelease.io/standby"] == {"bool": True}
    assert devices[0]["attributes"]["tidelease.io/lentBy"] == {"string": ""}
    assert all(set(d) == {"name", "attributes"} for d in devices)


def test_every_attribute_is_published_and_named_as_the_api_allows() -> None:
    (entry,) = deviceattributes.slice_devices(gpu_node(b.devices(NODE, 1)))
    assert set(entry["attributes"]) == {
        deviceattributes.qualified(a) for a in deviceattributes.ATTRIBUTES
    }
    for attribute in deviceattributes.ATTRIBUTES:
        assert C_IDENTIFIER.match(attribute), attribute
        assert len(attribute) <= 32, attribute
    for domain in (deviceattributes.DOMAIN, deviceattributes.DRIVER):
        assert DNS_SUBDOMAIN.match(domain), domain
        assert len(domain) <= 63, domain


@pytest.mark.parametrize("health", ["Unhealthy", "Unknown"])
def test_devices_that_are_not_healthy_are_withdrawn(health: str) -> None:
    obj = gpu_node(b.devices(NODE, 4), unhealthy={1: health, 3: health})
    assert [d["name"] for d in deviceattributes.slice_devices(obj)] == ["gpu-0", "gpu-2"]
    all_down = gpu_node(b.devices(NODE, 2), unhealthy={0: health, 1: health})
    assert deviceattributes.slice_devices(all_down) == []
    assert "devices" not in deviceattributes.resource_slice(NODE, None, all_down, 1)["spec"]


def test_devices_sharing_an_index_are_both_withdrawn() -> None:
    obj = gpu_node(b.devices(NODE, 3))
    obj["status"]["devices"][2]["index"] = 1
    assert [d["name"] for d in deviceattributes.slice_devices(obj)] == ["gpu-0"]


def test_a_slice_holds_at_most_128_devices_the_lowest_indexes() -> None:
    obj = gpu_node(b.devices(NODE, 130))
    names = [d["name"] for d in deviceattributes.slice_devices(obj)]
    assert len(names) == deviceattributes.MAX_DEVICES == 128
    assert names[-1] == "gpu-127"


def test_a_gpu_node_that_does_not_parse_is_refused() -> None:
    obj = gpu_node(b.devices(NODE, 1))
    obj["status"]["devices"][0]["tier"] = "XA"
    with pytest.raises(InvalidInput, match="tier"):
        deviceattributes.slice_devices(obj)


def test_long_job_names_are_shortened_to_the_api_limit_stably() -> None:
    owner = "job-" + "x" * 200
    value = deviceattributes.attribute_string(owner)
    assert len(value) == deviceattributes.MAX_STRING == 64
    assert value.startswith(owner[:55] + "-")
    assert value == deviceattributes.attribute_string(owner)
    assert value != deviceattributes.attribute_string(owner[:-1] + "y")
    assert deviceattributes.attribute_string("job-b") == "job-b"
    # Tags name the job with its namespace: the slice publishes that key, shortened alike.
    (entry,) = deviceattributes.slice_devices(gpu_node(b.devices(NODE, 1, owner=f"ml/{owner}")))
    assert attrs(entry)["lentBy"] == deviceattributes.attribute_string(f"ml/{owner}")


# --- the slice's name, pool and owner ---


@pytest.mark.parametrize(
    "node",
    ["n1", "kwok-gpu-0.example.com", "a" * 243, "a" * 244, "b." * 126 + "c", "x" * 253],
    ids=["short", "dotted", "longest-kept", "one-too-long", "dots-at-the-cut", "longest-node"],
)
def test_slice_names_are_dns_subdomains_of_at_most_253_characters(node: str) -> None:
    name = deviceattributes.slice_name(node)
    assert len(name) <= 253
    assert DNS_SUBDOMAIN.match(name), name
    assert name.startswith("tidelease-")
    if len(node) <= 243:
        assert name == f"tidelease-{node}"


def test_long_node_names_keep_their_slices_apart() -> None:
    one, two = "n" * 250 + "-aa", "n" * 250 + "-bb"
    assert deviceattributes.slice_name(one) != deviceattributes.slice_name(two)


def test_the_slice_is_the_nodes_pool_of_one_slice_owned_by_the_node() -> None:
    obj = deviceattributes.resource_slice(NODE, "uid-1", gpu_node(b.devices(NODE, 2)), 7)
    assert obj["apiVersion"] == "resource.k8s.io/v1"
    assert obj["kind"] == "ResourceSlice"
    assert obj["metadata"]["name"] == f"tidelease-{NODE}"
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1", "controller": True}
    ]
    spec = obj["spec"]
    assert spec["driver"] == "gpu.tidelease.io"
    assert spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 7, "resourceSliceCount": 1}
    assert [DNS_LABEL.match(d["name"]) is not None for d in spec["devices"]] == [True, True]
    without = deviceattributes.resource_slice(NODE, None, gpu_node(b.devices(NODE, 2)), 7)
    assert "ownerReferences" not in without["metadata"]


def _stored(devices: list[dict[str, Any]], generation: int) -> dict[str, Any]:
    return {"spec": deviceattributes.slice_spec(NODE, devices, generation)}


DEVS = deviceattributes.slice_devices(gpu_node(b.devices(NODE, 2)))
LENT = deviceattributes.slice_devices(gpu_node(b.devices(NODE, 2, owner="job-b")))


@pytest.mark.parametrize(
    ("stored", "devices", "floor", "want"),
    [
        (None, DEVS, 0, 1),
        (None, DEVS, 4, 5),
        (_stored(DEVS, 3), DEVS, 0, 3),
        (_stored(DEVS, 3), LENT, 0, 4),
        (_stored(DEVS, 3), DEVS[:1], 0, 4),
        (_stored(DEVS, 3), LENT, 9, 10),
        (_stored([], 2), [], 0, 2),
    ],
    ids=[
        "first",
        "recreated-goes-on",
        "same-devices-same-generation",
        "tag-changed",
        "device-withdrawn",
        "above-what-we-wrote",
        "still-empty",
    ],
)
def test_the_pool_generation_moves_only_when_the_devices_change(
    stored: dict[str, Any] | None, devices: list[dict[str, Any]], floor: int, want: int
) -> None:
    assert deviceattributes.next_generation(stored, devices, floor) == want


# --- the mirror, against a fake API server ---


class FakeApi:
    """GET, POST, PUT, DELETE and list_watch over objects by path, as the API server answers:
    resourceVersions checked on PUT and DELETE preconditions, 409 for a name taken, 404 for a
    missing object. ``fail[method]``: errors the next calls of that method raise first."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.fail: dict[str, list[Exception]] = {}
        self._versions = itertools.count(1)
        self._uids = itertools.count(1)
        self._watchers: list[tuple[str, str, asyncio.Queue[tuple[str, dict[str, Any]]]]] = []

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` at ``path`` (a new resourceVersion) and tell the watchers."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        event = "MODIFIED" if path in self.objects else "ADDED"
        if event == "ADDED":
            meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[path] = obj
        self._tell(path, event, obj)
        return copy.deepcopy(obj)

    def remove(self, path: str) -> None:
        obj = self.objects.pop(path)
        self._tell(path, "DELETED", obj)

    def _tell(self, path: str, event: str, obj: dict[str, Any]) -> None:
        for collection, name, queue in self._watchers:
            if path == f"{collection}/{name}":
                queue.put_nowait((event, copy.deepcopy(obj)))

    async def json(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if self.fail.get(method):
            raise self.fail[method].pop(0)
        stored = self.objects.get(path)
        if method == "GET":
            if stored is None:
                raise NotFound(f"GET {path}")
            return copy.deepcopy(stored)
        self.writes.append((method, path))
        if method == "POST":
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                raise Conflict(f"POST {target}: exists")
            assert "resourceVersion" not in body["metadata"]
            return self.put(target, body)
        if stored is None:
            raise NotFound(f"{method} {path}")
        if method == "PUT":
            if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                raise Conflict(f"PUT {path}: stale resourceVersion")
            assert body["metadata"]["uid"] == stored["metadata"]["uid"]
            return self.put(path, body)
        assert method == "DELETE", method
        for key, value in (body or {}).get("preconditions", {}).items():
            if stored["metadata"].get(key) != value:
                raise Conflict(f"DELETE {path}: precondition {key} failed")
        self.remove(path)
        return {"kind": "Status", "status": "Success"}

    async def list_watch(
        self, path: str, query: dict[str, Any] | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        selector = (query or {}).get("fieldSelector", "")
        assert selector.startswith("metadata.name="), selector
        name = selector.removeprefix("metadata.name=")
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        entry = (path, name, queue)
        self._watchers.append(entry)
        try:
            current = self.objects.get(f"{path}/{name}")
            if current is not None:
                yield "ADDED", copy.deepcopy(current)
            yield "SYNCED", {}
            while True:
                yield await queue.get()
        finally:
            self._watchers.remove(entry)

    # --- the objects of this test's node ---
    @property
    def slice(self) -> dict[str, Any] | None:
        return self.objects.get(
            f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(NODE)}"
        )

    def set_gpu_node(self, obj: dict[str, Any]) -> None:
        self.put(f"{GPU_NODES}/{NODE}", obj)


@pytest.fixture
def api() -> FakeApi:
    api = FakeApi()
    api.put(f"{NODES}/{NODE}", {"metadata": {"name": NODE, "uid": "node-uid"}})
    return api


def client(api: FakeApi) -> KubeClient:
    return cast(KubeClient, api)


def slice_names(obj: dict[str, Any] | None) -> list[str]:
    return [d["name"] for d in (obj or {}).get("spec", {}).get("devices", [])]


def generation_of(obj: dict[str, Any] | None) -> int:
    return int((obj or {})["spec"]["pool"]["generation"])


async def test_the_first_pass_creates_the_slice_owned_by_the_node(api: FakeApi) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 4, tier=Tier.MA)))
    written = await sync_once(client(api), NODE)
    assert written == api.slice
    assert api.writes == [("POST", deviceattributes.SLICES_PATH)]
    want = deviceattributes.resource_slice(
        NODE, "node-uid", gpu_node(b.devices(NODE, 4, tier=Tier.MA)), 1
    )
    assert written["spec"] == want["spec"]
    assert written["metadata"]["ownerReferences"] == want["metadata"]["ownerReferences"]
    assert written["metadata"]["labels"] == deviceattributes.SLICE_LABELS


async def test_a_pass_writes_nothing_while_the_slice_matches(api: FakeApi) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    first = await sync_once(client(api), NODE)
    # What the GpuNode holds besides devices (the cache, conditions) is not the slice's concern.
    obj = gpu_node(b.devices(NODE, 2))
    obj["status"]["cache"]["images"] = ["registry.example/a:v1"]
    api.set_gpu_node(obj)
    again = await sync_once(client(api), NODE)
    assert again == first
    assert api.writes == [("POST", deviceattributes.SLICES_PATH)]


@pytest.mark.parametrize(
    ("changed", "want_devices", "want_lent"),
    [
        (gpu_node(b.devices(NODE, 2, owner="job-b")), ["gpu-0", "gpu-1"], "default/job-b"),
        (gpu_node(b.devices(NODE, 2), unhealthy={1: "Unhealthy"}), ["gpu-0"], ""),
        (gpu_node(b.devices(NODE, 3)), ["gpu-0", "gpu-1", "gpu-2"], ""),
    ],
    ids=["lent", "one-unhealthy", "one-more"],
)
async def test_a_change_of_the_devices_updates_the_slice_at_the_next_generation(
    api: FakeApi, changed: dict[str, Any], want_devices: list[str], want_lent: str
) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    mirror = SliceMirror(client(api), NODE)
    first = await mirror.sync()
    api.set_gpu_node(changed)
    second = await mirror.sync()
    assert api.writes[-1] == (
        "PUT",
        f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(NODE)}",
    )
    assert slice_names(second) == want_devices
    assert generation_of(second) == generation_of(first) + 1
    assert attrs(second["spec"]["devices"][0])["lentBy"] == want_lent
    assert second["metadata"]["uid"] == first["metadata"]["uid"]  # updated, not re-created


async def test_a_node_with_every_device_withdrawn_keeps_an_empty_slice(api: FakeApi) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    await sync_once(client(api), NODE)
    api.set_gpu_node(gpu_node(b.devices(NODE, 2), unhealthy={0: "Unhealthy", 1: "Unknown"}))
    empty = await sync_once(client(api), NODE)
    assert api.slice is not None
    assert slice_names(api.slice) == []
    assert generation_of(empty) == 2
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    back = await sync_once(client(api), NODE)
    assert slice_names(back) == ["gpu-0", "gpu-1"]
    assert generation_of(back) == 3


def _no_devices(obj: dict[str, Any]) -> None:
    obj["status"]["devices"] = []


def _bad_tier(obj: dict[str, Any]) -> None:
    obj["status"]["devices"][0]["tier"] = "XA"


@pytest.mark.parametrize("change", [_no_devices, _bad_tier], ids=["no-devices", "does-not-parse"])
async def test_the_slice_is_deleted_when_the_gpu_node_offers_no_devices(
    api: FakeApi, change: Any
) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    mirror = SliceMirror(client(api), NODE)
    await mirror.sync()
    obj = gpu_node(b.devices(NODE, 2))
    change(obj)
    api.set_gpu_node(obj)
    assert await mirror.sync() == {}
    assert api.slice is None
    assert api.writes[-1] == (
        "DELETE",
        f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(NODE)}",
    )
    # Back: re-created, and the pool's generation does not go back.
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    assert generation_of(await mirror.sync()) == 2


async def test_the_slice_goes_with_the_gpu_node(api: FakeApi) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    await sync_once(client(api), NODE)
    api.remove(f"{GPU_NODES}/{NODE}")
    assert await sync_once(client(api), NODE) == {}
    assert api.slice is None
    assert await sync_once(client(api), NODE) == {}  # nothing to do, nothing written
    assert [m for m, _ in api.writes] == ["POST", "DELETE"]


async def test_without_its_node_the_slice_has_no_owner(api: FakeApi) -> None:
    api.remove(f"{NODES}/{NODE}")
    api.set_gpu_node(gpu_node(b.devices(NODE, 1)))
    written = await sync_once(client(api), NODE)
    assert "ownerReferences" not in written["metadata"]
    assert slice_names(written) == ["gpu-0"]


async def test_an_update_keeps_what_others_wrote_in_the_metadata(api: FakeApi) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    first = await sync_once(client(api), NODE)
    edited = copy.deepcopy(first)
    edited["metadata"]["labels"]["team"] = "ml"
    edited["metadata"]["annotations"] = {"note": "kept"}
    edited["metadata"]["ownerReferences"].append(
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm-uid"}
    )
    api.put(f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(NODE)}", edited)
    api.set_gpu_node(gpu_node(b.devices(NODE, 2, tier=Tier.LA)))
    updated = await sync_once(client(api), NODE)
    meta = updated["metadata"]
    assert meta["labels"] == {**deviceattributes.SLICE_LABELS, "team": "ml"}
    assert meta["annotations"] == {"note": "kept"}
    assert [r["kind"] for r in meta["ownerReferences"]] == ["ConfigMap", "Node"]


async def test_an_edited_spec_is_put_back(api: FakeApi) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    first = await sync_once(client(api), NODE)
    edited = copy.deepcopy(first)
    edited["spec"]["devices"][0]["attributes"]["tidelease.io/standby"] = {"bool": True}
    api.put(f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(NODE)}", edited)
    fixed = await sync_once(client(api), NODE)
    assert fixed["spec"]["devices"] == first["spec"]["devices"]
    assert generation_of(fixed) == generation_of(first) + 1


async def test_a_slice_of_that_name_for_another_driver_is_replaced(api: FakeApi) -> None:
    path = f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(NODE)}"
    foreign = deviceattributes.resource_slice(NODE, None, gpu_node(b.devices(NODE, 1)), 5)
    foreign["spec"]["driver"] = "gpu.example.com"
    old_uid = api.put(path, foreign)["metadata"]["uid"]
    api.set_gpu_node(gpu_node(b.devices(NODE, 1)))
    written = await sync_once(client(api), NODE)
    assert [m for m, _ in api.writes] == ["DELETE", "POST"]
    assert written["spec"]["driver"] == deviceattributes.DRIVER
    assert written["metadata"]["uid"] != old_uid


async def test_a_conflicting_write_raises_for_the_loop_to_retry(api: FakeApi) -> None:
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    await sync_once(client(api), NODE)
    api.set_gpu_node(gpu_node(b.devices(NODE, 2, tier=Tier.MA)))
    api.fail["PUT"] = [Conflict("PUT: stale resourceVersion")]
    with pytest.raises(Conflict):
        await sync_once(client(api), NODE)
    assert generation_of(api.slice) == 1


FAST = ReconcileSettings(resync_s=60.0, retry_base_s=0.01, retry_cap_s=0.05, conflict_retry_s=0)


@pytest.fixture
async def running(api: FakeApi) -> AsyncIterator[tuple[SliceMirror, asyncio.Event]]:
    """A mirror of NODE running in the background over ``api``, and its readiness."""
    mirror = SliceMirror(client(api), NODE, settings=FAST)
    ready = asyncio.Event()
    task = asyncio.create_task(mirror.run(ready=ready))
    yield mirror, ready
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_the_running_mirror_follows_the_gpu_node_through_failures(
    api: FakeApi, running: tuple[SliceMirror, asyncio.Event]
) -> None:
    mirror, ready = running
    api.set_gpu_node(gpu_node(b.devices(NODE, 2)))
    await asyncio.wait_for(ready.wait(), 5)

    async def devices_are(names: list[str]) -> bool:
        return slice_names(api.slice) == names

    await eventually(lambda: devices_are(["gpu-0", "gpu-1"]), within_s=5, every_s=0.01)
    # A change while the API server fails twice and then loses a race: retried until written.
    api.fail["PUT"] = [Unavailable("HTTP 503"), Unavailable("HTTP 503"), Conflict("409")]
    api.set_gpu_node(gpu_node(b.devices(NODE, 2), unhealthy={0: "Unhealthy"}))
    await eventually(lambda: devices_are(["gpu-1"]), within_s=5, every_s=0.01)
    assert not api.fail["PUT"]
    assert generation_of(api.slice) == 2
    # Deleted by someone else: put back from the slice's own watch.
    api.remove(f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(NODE)}")
    await eventually(lambda: devices_are(["gpu-1"]), within_s=5, every_s=0.01)
    assert generation_of(api.slice) == 3  # re-created above what it wrote before
    assert mirror.generation == 3
    # The GpuNode goes: so does the slice.
    api.remove(f"{GPU_NODES}/{NODE}")

    async def gone() -> bool:
        return api.slice is None

    await eventually(gone, within_s=5, every_s=0.01)


async def test_run_slice_mirror_publishes_and_counts_its_reconciles(api: FakeApi) -> None:
    registry = CollectorRegistry()
    ready = asyncio.Event()
    api.set_gpu_node(gpu_node(b.devices(NODE, 1)))
    task = asyncio.create_task(
        run_slice_mirror(client=client(api), node=NODE, registry=registry, ready=ready)
    )
    try:
        await asyncio.wait_for(ready.wait(), 5)
        assert slice_names(api.slice) == ["gpu-0"]
        count = registry.get_sample_value(
            "tidelease_controller_reconcile_duration_seconds_count", {"controller": "dra-slices"}
        )
        assert count is not None
        assert count >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_mirror_stops_loudly_when_a_watch_ends(api: FakeApi) -> None:
    class Ending(FakeApi):
        async def list_watch(
            self, path: str, query: dict[str, Any] | None = None
        ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
            yield "SYNCED", {}

    mirror = SliceMirror(client(Ending()), NODE, settings=FAST)
    with pytest.raises(RuntimeError, match="the watch ended"):
        await asyncio.wait_for(mirror.run(), 10)


def test_the_watched_paths_are_the_api_servers() -> None:
    assert f"/apis/{contract.GROUP}/{contract.VERSION}/gpunodes" == GPU_NODES
    assert deviceattributes.SLICES_PATH == "/apis/resource.k8s.io/v1/resourceslices"
