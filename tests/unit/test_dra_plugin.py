"""The DRA kubelet plugin over its real gRPC sockets, called as the v1.35 kubelet calls it.

Both servers run on unix sockets in a temporary dir; the kubelet's side is the generated stubs.
ResourceClaims come from :class:`FakeClaimApi`, which stands in for
:class:`common.kubeclient.KubeClient` and answers GETs of ResourceClaims as the API server does:
objects shaped like resource.k8s.io/v1's, 404s as KubeClient raises them, and bodies that are not
JSON as KubeClient fails on them. What a container gets is checked the way the runtime applies a
CDI spec: the CDI ids the kubelet passes for a container's request, resolved in the spec file.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import shutil
import stat
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from common.errors import Unavailable
from common.kubeclient import api_error
from nodeagent.deviceplugin.devices import InMemoryDeviceSource
from nodeagent.deviceplugin.testing import NODE, gpu, lost_gpu, uuids
from nodeagent.dradriver import api_pb2 as pb
from nodeagent.dradriver import api_pb2_grpc, registration_pb2, registration_pb2_grpc
from nodeagent.dradriver.claims import JsonApi, KubeClaimReader, claim_path
from nodeagent.dradriver.kubeletplugin import run_kubelet_plugin
from nodeagent.dradriver.settings import DRIVER, DraPluginSettings

KIND = "tidelease.io/gpu"
U = uuids(0, 1, 2, 3)
# What the v1.35 kubelet accepts in PluginInfo.supported_versions, most recent first
# (pkg/kubelet/cm/dra/plugin: servicesSupportedByKubelet).
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


# --- ResourceClaims as the API server returns them -----------------------------------------------


def resource_claim(
    name: str,
    results: Sequence[tuple[str, str]] | None,
    *,
    namespace: str = "default",
    uid: str | None = None,
    driver: str = DRIVER,
    pool: str = NODE,
) -> dict[str, Any]:
    """A ResourceClaim (resource.k8s.io/v1); ``results`` (request, device) are its allocation in
    ``pool`` of ``driver``, ``None`` an unallocated claim."""
    requests = dict.fromkeys(r.split("/")[0] for r, _ in results or [("gpus", "")])
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{namespace}/{name}")),
            "resourceVersion": "1234",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": r,
                        "exactly": {
                            "deviceClassName": "gpu.tidelease.io",
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                    for r in requests
                ]
            }
        },
        "status": {},
    }
    if results is not None:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": driver, "pool": pool, "device": d}
                        for r, d in results
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
        }
    return obj


def uid_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


class FakeClaimApi:
    """KubeClient's ``json`` for ResourceClaim GETs: stored objects (copies out), 404 for others,
    a stored body that is not JSON fails as KubeClient.json does, and set errors are raised."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.bodies: dict[str, bytes] = {}  # raw replies, parsed as KubeClient parses them
        self.errors: dict[str, Exception] = {}
        self.hang: set[str] = set()
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        for obj in objects:
            self.put(obj)

    def put(self, obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        path = claim_path(meta["namespace"], meta["name"])
        self.objects[path] = copy.deepcopy(obj)
        return path

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((method, path, kwargs))
        assert method == "GET"
        if path in self.hang:
            await asyncio.Event().wait()
        if path in self.errors:
            raise self.errors[path]
        if path in self.bodies:
            value = json.loads(self.bodies[path])  # a JSONDecodeError, as from KubeClient
            if not isinstance(value, dict):
                raise Unavailable(f"{method} {path}: reply is not an object")
            return value
        if path not in self.objects:
            raise api_error(404, f"{method} {path}", b'{"message": "not found"}')
        return copy.deepcopy(self.objects[path])


# --- the plugin, running ------------------------------------------------------------------------


@pytest.fixture
def root() -> Iterator[Path]:
    """A short temporary dir: unix socket paths hold 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def settings_in(root: Path, **changes: Any) -> DraPluginSettings:
    return replace(
        DraPluginSettings(
            node_name=NODE,
            registry_dir=root / "plugins_registry",
            plugins_dir=root / "plugins",
            cdi_dir=root / "cdi",
            host_device_root="/host",
            stop_grace_s=0,
        ),
        **changes,
    )


def node_gpus() -> list[Any]:
    return [gpu(0), gpu(1), gpu(2), lost_gpu(3)]


@dataclass
class Kubelet:
    """The kubelet's side: stubs on both sockets."""

    settings: DraPluginSettings
    dra: api_pb2_grpc.DRAPluginStub
    registration: registration_pb2_grpc.RegistrationStub
    registered: asyncio.Event

    async def prepare(self, *claims: dict[str, Any]) -> pb.NodePrepareResourcesResponse:
        return await self.dra.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[claim_message(c) for c in claims]), timeout=10
        )

    async def unprepare(self, *claims: dict[str, Any]) -> pb.NodeUnprepareResourcesResponse:
        return await self.dra.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[claim_message(c) for c in claims]), timeout=10
        )

    def spec_file(self, claim: dict[str, Any]) -> Path:
        return self.settings.cdi_dir / f"tidelease.io-gpu_{uid_of(claim)}.json"

    def spec(self, claim: dict[str, Any]) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.spec_file(claim).read_text())
        return value

    def spec_files(self) -> set[str]:
        cdi = self.settings.cdi_dir
        return {p.name for p in cdi.iterdir()} if cdi.exists() else set()


def claim_message(obj: dict[str, Any]) -> pb.Claim:
    meta = obj["metadata"]
    return pb.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


@contextlib.asynccontextmanager
async def running(
    settings: DraPluginSettings, api: JsonApi, devices: Sequence[Any] | None = None
) -> AsyncIterator[Kubelet]:
    """The plugin serving, reading claims through ``api`` (a KubeClient, or the fake)."""
    ready, registered = asyncio.Event(), asyncio.Event()
    source = InMemoryDeviceSource(node_gpus() if devices is None else devices)
    task = asyncio.create_task(
        run_kubelet_plugin(
            source=source,
            claims=KubeClaimReader(api, timeout_s=settings.api_timeout_s),
            settings=settings,
            ready=ready,
            registered=registered,
        )
    )
    try:
        waiting = asyncio.ensure_future(ready.wait())
        await asyncio.wait((task, waiting), timeout=10, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if task.done():
            task.result()  # raises what stopped it
        assert ready.is_set(), "the plugin did not serve within 10 s"
        async with (
            grpc.aio.insecure_channel(f"unix://{settings.dra_socket_path}") as dra,
            grpc.aio.insecure_channel(f"unix://{settings.registration_socket_path}") as reg,
        ):
            yield Kubelet(
                settings,
                api_pb2_grpc.DRAPluginStub(dra),  # type: ignore[no-untyped-call]
                registration_pb2_grpc.RegistrationStub(reg),  # type: ignore[no-untyped-call]
                registered,
            )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- what a container gets: the runtime's view of the CDI ids the kubelet passes --------------


@dataclass(frozen=True)
class Container:
    env: dict[str, str]
    nodes: dict[str, tuple[str, str]]  # container path -> (host path, permissions)

    @property
    def visible(self) -> list[str]:
        return self.env["NVIDIA_VISIBLE_DEVICES"].split(",")


def container(
    kubelet: Kubelet, answer: pb.NodePrepareResourceResponse, request: str | None
) -> Container:
    """What a container naming ``request`` of the claim (None: the whole claim) gets: the CDI
    ids of the matching devices, as the kubelet lists them, applied from the spec files in order
    (a repeated id once, a later env edit of a key replacing an earlier one)."""
    ids = [
        i
        for d in answer.devices
        if request is None or request in d.request_names
        for i in d.cdi_device_ids
    ]
    specs = [json.loads(p.read_text()) for p in sorted(kubelet.settings.cdi_dir.glob("*.json"))]
    defined = {f"{s['kind']}={d['name']}": (s, d) for s in specs for d in s["devices"]}
    env: dict[str, str] = {}
    nodes: dict[str, tuple[str, str]] = {}
    applied: set[int] = set()

    def apply(edits: dict[str, Any]) -> None:
        for entry in edits.get("env", []):
            key, _, value = entry.partition("=")
            env[key] = value
        for node in edits.get("deviceNodes", []):
            nodes[node["path"]] = (node.get("hostPath", node["path"]), node["permissions"])

    for cdi_id in dict.fromkeys(ids):
        spec, device = defined[cdi_id]  # KeyError: the runtime could not resolve it
        if id(spec) not in applied:
            applied.add(id(spec))
            apply(spec.get("containerEdits", {}))
        apply(device["containerEdits"])
    return Container(env, nodes)


def devices_of(answer: pb.NodePrepareResourceResponse) -> list[tuple[list[str], str, str]]:
    return [(list(d.request_names), d.pool_name, d.device_name) for d in answer.devices]


def nvidia(*indexes: int) -> dict[str, tuple[str, str]]:
    return {f"/dev/nvidia{i}": (f"/host/dev/nvidia{i}", "rw") for i in indexes}


# --- registration -------------------------------------------------------------------------------


async def test_registration_tells_the_kubelet_driver_endpoint_and_v1_service(root: Path) -> None:
    settings = settings_in(root)
    async with running(settings, FakeClaimApi()) as kubelet:
        info = await kubelet.registration.GetInfo(registration_pb2.InfoRequest(), timeout=1)
        assert info.type == "DRAPlugin"
        assert info.name == "gpu.tidelease.io"
        assert info.endpoint == str(root / "plugins" / "gpu.tidelease.io" / "dra.sock")
        # The kubelet takes the first of the plugin's versions it knows: v1, which is served.
        chosen = next(v for v in info.supported_versions if v in KUBELET_SERVICES)
        assert chosen == "v1.DRAPlugin"
        registry = root / "plugins_registry"
        assert settings.registration_socket_path == registry / "gpu.tidelease.io-reg.sock"
        for path in (settings.registration_socket_path, settings.dra_socket_path):
            assert stat.S_ISSOCK(path.stat().st_mode)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600

        await kubelet.registration.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=False, error="no handler")
        )
        assert not kubelet.registered.is_set()
        await kubelet.registration.NotifyRegistrationStatus(
            registration_pb2.RegistrationStatus(plugin_registered=True)
        )
        assert kubelet.registered.is_set()
    assert not settings.registration_socket_path.exists(), "stopping deregisters"
    assert not settings.dra_socket_path.exists()


async def test_stale_sockets_are_replaced(root: Path) -> None:
    settings = settings_in(root)
    for path in (settings.dra_socket_path, settings.registration_socket_path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("left by a killed agent")
    async with running(settings, FakeClaimApi()) as kubelet:
        info = await kubelet.registration.GetInfo(registration_pb2.InfoRequest(), timeout=1)
        assert info.name == DRIVER
        assert stat.S_ISSOCK(settings.dra_socket_path.stat().st_mode)


# --- prepare -------------------------------------------------------------------------------------


async def test_one_request_of_two_gpus(root: Path) -> None:
    claim = resource_claim("train", [("gpus", "gpu-0"), ("gpus", "gpu-2")])
    uid = uid_of(claim)
    async with running(settings_in(root), FakeClaimApi(claim)) as kubelet:
        response = await kubelet.prepare(claim)
        assert set(response.claims) == {uid}
        answer = response.claims[uid]
        assert answer.error == ""
        assert devices_of(answer) == [(["gpus"], NODE, "gpu-0"), (["gpus"], NODE, "gpu-2")]
        assert [list(d.cdi_device_ids) for d in answer.devices] == [
            [f"{KIND}={uid}_gpu-0", f"{KIND}={uid}_request_gpus"],
            [f"{KIND}={uid}_gpu-2", f"{KIND}={uid}_request_gpus"],
        ]
        assert not any(d.HasField("share_id") for d in answer.devices)
        spec = kubelet.spec(claim)
        assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", KIND)
        assert {d["name"]: d["containerEdits"] for d in spec["devices"]} == {
            f"{uid}_gpu-0": {
                "deviceNodes": [
                    {"path": "/dev/nvidia0", "hostPath": "/host/dev/nvidia0", "permissions": "rw"}
                ]
            },
            f"{uid}_gpu-2": {
                "deviceNodes": [
                    {"path": "/dev/nvidia2", "hostPath": "/host/dev/nvidia2", "permissions": "rw"}
                ]
            },
            f"{uid}_request_gpus": {"env": [f"NVIDIA_VISIBLE_DEVICES={U[0]},{U[2]}"]},
        }
        assert "containerEdits" not in spec, "no control devices configured"
        for request in ("gpus", None):
            got = container(kubelet, answer, request)
            assert got.nodes == nvidia(0, 2)
            assert got.visible == [U[0], U[2]]
        assert kubelet.spec_files() == {f"tidelease.io-gpu_{uid}.json"}
        assert stat.S_IMODE(kubelet.spec_file(claim).stat().st_mode) == 0o644


async def test_two_requests_each_see_their_own_gpus(root: Path) -> None:
    # "big/a100" is a subrequest of "big" (a prioritized list): the kubelet matches "big".
    claim = resource_claim(
        "mixed", [("small", "gpu-1"), ("big/a100", "gpu-0"), ("big/a100", "gpu-2")]
    )
    settings = settings_in(root, control_devices=("/dev/nvidiactl", "/dev/nvidia-uvm"))
    async with running(settings, FakeClaimApi(claim)) as kubelet:
        answer = (await kubelet.prepare(claim)).claims[uid_of(claim)]
        assert answer.error == ""
        assert devices_of(answer) == [
            (["small"], NODE, "gpu-1"),
            (["big"], NODE, "gpu-0"),
            (["big"], NODE, "gpu-2"),
        ]
        control = {
            "/dev/nvidiactl": ("/host/dev/nvidiactl", "rw"),
            "/dev/nvidia-uvm": ("/host/dev/nvidia-uvm", "rw"),
        }
        small = container(kubelet, answer, "small")
        assert small.nodes == {**nvidia(1), **control}
        assert small.visible == [U[1]]
        big = container(kubelet, answer, "big")
        assert big.nodes == {**nvidia(0, 2), **control}
        assert big.visible == [U[0], U[2]]
        # The whole claim: every GPU's nodes (its env is one request's, as documented).
        assert container(kubelet, answer, None).nodes == {**nvidia(0, 1, 2), **control}


async def test_other_drivers_and_pools_are_not_ours(root: Path) -> None:
    claim = resource_claim("shared", [("gpus", "gpu-0")])
    claim["status"]["allocation"]["devices"]["results"] += [
        {"request": "nic", "driver": "net.example.com", "pool": NODE, "device": "gpu-1"},
        {"request": "gpus", "driver": DRIVER, "pool": "node-b", "device": "gpu-2"},
    ]
    theirs = resource_claim("theirs", [("nic", "eth0")], driver="net.example.com")
    async with running(settings_in(root), FakeClaimApi(claim, theirs)) as kubelet:
        response = await kubelet.prepare(claim, theirs)
        answer = response.claims[uid_of(claim)]
        assert answer.error == ""
        assert devices_of(answer) == [(["gpus"], NODE, "gpu-0")]
        got = container(kubelet, answer, None)
        assert got.nodes == nvidia(0)
        assert got.visible == [U[0]]
        text = kubelet.spec_file(claim).read_text()
        assert "nvidia1" not in text
        assert "nvidia2" not in text
        nothing = response.claims[uid_of(theirs)]
        assert (nothing.error, list(nothing.devices)) == ("", [])
        assert kubelet.spec_files() == {kubelet.spec_file(claim).name}, "no spec for no device"


def _wrong_uid(api: FakeClaimApi, claim: dict[str, Any]) -> None:
    """The claim was deleted and made again: the kubelet still names the old UID."""
    claim["metadata"]["uid"] = str(uuid.uuid4())
    api.put(claim)


def _body(text: bytes) -> Any:
    def setup(api: FakeClaimApi, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        api.bodies[claim_path(meta["namespace"], meta["name"])] = text

    return setup


def _results(value: Any) -> Any:
    def setup(api: FakeClaimApi, claim: dict[str, Any]) -> None:
        claim["status"]["allocation"]["devices"]["results"] = value
        api.put(claim)

    return setup


def _absent(api: FakeClaimApi, claim: dict[str, Any]) -> None:
    meta = claim["metadata"]
    del api.objects[claim_path(meta["namespace"], meta["name"])]


def _unavailable(api: FakeClaimApi, claim: dict[str, Any]) -> None:
    meta = claim["metadata"]
    path = claim_path(meta["namespace"], meta["name"])
    api.errors[path] = api_error(503, f"GET {path}", b'{"message": "etcd is down"}')


BAD = [
    pytest.param(
        resource_claim("bad", [("gpus", "gpu-9")]), None, "gpu-9 is not a GPU", id="unknown"
    ),
    pytest.param(resource_claim("bad", [("gpus", "gpu-3")]), None, "unhealthy", id="unhealthy"),
    pytest.param(resource_claim("bad", None), None, "not allocated", id="no-allocation"),
    pytest.param(resource_claim("bad", [("gpus", "gpu-1")]), _wrong_uid, "UID", id="wrong-uid"),
    pytest.param(resource_claim("bad", [("gpus", "gpu-1")]), _absent, "not found", id="404"),
    pytest.param(resource_claim("bad", [("gpus", "gpu-1")]), _unavailable, "etcd", id="503"),
    pytest.param(
        resource_claim("bad", [("gpus", "gpu-1")]), _body(b"{not json"), "not JSON", id="not-json"
    ),
    pytest.param(
        resource_claim("bad", [("gpus", "gpu-1")]), _body(b"[1, 2]"), "not an object", id="array"
    ),
    pytest.param(
        resource_claim("bad", [("gpus", "gpu-1")]),
        _results("gpu-1"),
        "results is not a list",
        id="results-not-a-list",
    ),
    pytest.param(
        resource_claim("bad", [("gpus", "gpu-1")]),
        _results([{"request": "gpus", "driver": DRIVER, "pool": NODE}]),
        "results[0].device",
        id="result-without-device",
    ),
    pytest.param(
        resource_claim("bad", [("gpus", "gpu-1"), ("more", "gpu-1")]),
        None,
        "allocated twice",
        id="device-twice",
    ),
]


@pytest.mark.parametrize(("bad", "setup", "error"), BAD)
async def test_a_bad_claim_is_its_own_error(
    root: Path, bad: dict[str, Any], setup: Any, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = resource_claim("good", [("gpus", "gpu-0")])
    api = FakeClaimApi(good, bad)
    asked = copy.deepcopy(bad)
    if setup is not None:
        setup(api, bad)
    async with running(settings_in(root), api) as kubelet:
        with caplog.at_level(logging.WARNING, logger="nodeagent.dradriver"):
            response = await kubelet.prepare(good, asked)
        assert set(response.claims) == {uid_of(good), uid_of(asked)}
        refused = response.claims[uid_of(asked)]
        assert error in refused.error
        assert list(refused.devices) == []
        assert "default/bad" in caplog.text, "the log names the claim"
        assert response.claims[uid_of(good)].error == ""
        assert devices_of(response.claims[uid_of(good)]) == [(["gpus"], NODE, "gpu-0")]
        assert kubelet.spec_files() == {kubelet.spec_file(good).name}
        # The server goes on: the bad claim refused again, the good one answered the same.
        again = await kubelet.prepare(asked, good)
        assert error in again.claims[uid_of(asked)].error
        assert again.claims[uid_of(good)] == response.claims[uid_of(good)]


async def test_a_hanging_api_server_is_an_error_in_time(root: Path) -> None:
    slow = resource_claim("slow", [("gpus", "gpu-0")])
    good = resource_claim("good", [("gpus", "gpu-1")])
    api = FakeClaimApi(slow, good)
    api.hang.add(claim_path("default", "slow"))
    async with running(settings_in(root, api_timeout_s=0.05), api) as kubelet:
        response = await kubelet.prepare(slow, good)
        assert "took over 0.05 s" in response.claims[uid_of(slow)].error
        assert response.claims[uid_of(good)].error == ""
    assert {kw["request_timeout"] for _, _, kw in api.calls} == {0.05}


async def test_unusable_claim_names_are_refused(root: Path) -> None:
    evil = resource_claim("evil", [("gpus", "gpu-0")], uid="../../etc/passwd")
    async with running(settings_in(root), FakeClaimApi(evil)) as kubelet:
        response = await kubelet.prepare(evil)
        assert "is not a UID" in response.claims["../../etc/passwd"].error
        assert kubelet.spec_files() == set()
        assert (await kubelet.unprepare(evil)).claims["../../etc/passwd"].error == ""


async def test_too_many_claims_in_one_call_are_refused(root: Path) -> None:
    claims = [resource_claim(f"c{i}", [("gpus", "gpu-0")]) for i in range(3)]
    async with running(settings_in(root, max_claims_per_call=2), FakeClaimApi(*claims)) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet.prepare(*claims)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len((await kubelet.prepare(*claims[:2])).claims) == 2


async def test_large_messages_are_refused(root: Path) -> None:
    async with running(settings_in(root, max_message_bytes=1024), FakeClaimApi()) as kubelet:
        big = pb.Claim(namespace="default", name="x" * 2000, uid="u")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet.dra.NodePrepareResources(
                pb.NodePrepareResourcesRequest(claims=[big]), timeout=10
            )
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# --- idempotence, unprepare, restarts ------------------------------------------------------------


async def test_preparing_twice_answers_the_same(root: Path) -> None:
    claim = resource_claim("train", [("gpus", "gpu-0"), ("gpus", "gpu-1")])
    api = FakeClaimApi(claim)
    async with running(settings_in(root), api) as kubelet:
        first = await kubelet.prepare(claim)
        written = kubelet.spec_file(claim).read_bytes()
        second = await kubelet.prepare(claim, claim)
        assert second == first
        assert kubelet.spec_file(claim).read_bytes() == written
        assert len(api.calls) == 1, "a prepared claim is answered from the checkpoint"


async def test_unprepare_removes_the_spec_and_forgets_the_claim(root: Path) -> None:
    one = resource_claim("one", [("gpus", "gpu-0")])
    two = resource_claim("two", [("gpus", "gpu-1")])
    api = FakeClaimApi(one, two)
    async with running(settings_in(root), api) as kubelet:
        await kubelet.prepare(one, two)
        assert len(kubelet.spec_files()) == 2
        response = await kubelet.unprepare(one)
        assert response.claims[uid_of(one)].error == ""
        assert kubelet.spec_files() == {kubelet.spec_file(two).name}
        checkpoint = json.loads(kubelet.settings.checkpoint_path.read_text())
        assert set(checkpoint["claims"]) == {uid_of(two)}
        again = await kubelet.unprepare(one, resource_claim("never", [("gpus", "gpu-2")]))
        assert {uid: c.error for uid, c in again.claims.items()} == {
            uid_of(one): "",
            uid_of(resource_claim("never", [])): "",
        }
        calls = len(api.calls)
        await kubelet.prepare(one)  # prepared anew: read from the API server again
        assert len(api.calls) == calls + 1
        assert kubelet.spec_file(one).exists()


async def test_a_restarted_plugin_unprepares_what_it_prepared(root: Path) -> None:
    claim = resource_claim("train", [("gpus", "gpu-0"), ("gpus", "gpu-1")])
    settings = settings_in(root)
    async with running(settings, FakeClaimApi(claim)) as kubelet:
        first = await kubelet.prepare(claim)
        spec = kubelet.spec_file(claim)
        assert spec.exists()
    assert stat.S_IMODE(settings.checkpoint_path.stat().st_mode) == 0o600
    # A new agent, whose API server no longer has the claim: the checkpoint answers.
    api = FakeClaimApi()
    async with running(settings, api) as kubelet:
        assert await kubelet.prepare(claim) == first
        assert api.calls == []
        response = await kubelet.unprepare(claim)
        assert response.claims[uid_of(claim)].error == ""
        assert not spec.exists()
    async with running(settings, FakeClaimApi()) as kubelet:
        refused = await kubelet.prepare(claim)
        assert "not found" in refused.claims[uid_of(claim)].error, "forgotten for good"


async def test_a_spec_lost_while_stopped_is_written_again(root: Path) -> None:
    claim = resource_claim("train", [("gpus", "gpu-2")])
    settings = settings_in(root)
    async with running(settings, FakeClaimApi(claim)) as kubelet:
        answer = (await kubelet.prepare(claim)).claims[uid_of(claim)]
        written = kubelet.spec_file(claim).read_bytes()
    kubelet.spec_file(claim).unlink()  # /var/run is a tmpfs: a reboot empties it
    async with running(settings, FakeClaimApi()) as kubelet:
        assert kubelet.spec_file(claim).read_bytes() == written
        assert container(kubelet, answer, "gpus").visible == [U[2]]


async def test_unprepare_without_a_checkpoint_still_removes_the_spec(root: Path) -> None:
    claim = resource_claim("train", [("gpus", "gpu-0")])
    settings = settings_in(root)
    async with running(settings, FakeClaimApi(claim)) as kubelet:
        await kubelet.prepare(claim)
    settings.checkpoint_path.write_text("{torn")
    async with running(settings, FakeClaimApi()) as kubelet:
        assert kubelet.spec_file(claim).exists()
        assert (await kubelet.unprepare(claim)).claims[uid_of(claim)].error == ""
        assert kubelet.spec_files() == set()
    aside = settings.checkpoint_path.with_name("checkpoint.json.corrupt")
    assert aside.read_text() == "{torn"


async def test_a_spec_that_cannot_be_written_is_that_claims_error(root: Path) -> None:
    claim = resource_claim("train", [("gpus", "gpu-0")])
    (root / "file").write_text("not a dir")
    settings = settings_in(root, cdi_dir=root / "file" / "cdi")  # even root cannot make it
    async with running(settings, FakeClaimApi(claim)) as kubelet:
        response = await kubelet.prepare(claim)
        assert "cannot write CDI spec" in response.claims[uid_of(claim)].error
        assert not settings.checkpoint_path.exists(), "nothing was prepared"


# --- settings ------------------------------------------------------------------------------------


def test_default_settings_are_the_kubelets_paths() -> None:
    settings = DraPluginSettings(node_name=NODE)
    assert settings.validate() == []
    assert settings.dra_socket_path == Path("/var/lib/kubelet/plugins/gpu.tidelease.io/dra.sock")
    assert settings.registration_socket_path == Path(
        "/var/lib/kubelet/plugins_registry/gpu.tidelease.io-reg.sock"
    )
    assert settings.checkpoint_path.parent == Path("/var/lib/kubelet/plugins/gpu.tidelease.io")
    assert settings.cdi_dir == Path("/var/run/cdi")


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        pytest.param({"node_name": ""}, "node_name", id="no-node"),
        pytest.param({"driver": "GPU_driver"}, "DNS subdomain", id="driver"),
        pytest.param({"cdi_dir": Path("cdi")}, "cdi_dir", id="relative"),
        pytest.param({"plugins_dir": Path("/" + "p" * 120)}, "longer than", id="long-socket"),
        pytest.param({"cdi_kind": "gpu"}, "vendor/class", id="kind"),
        pytest.param({"cdi_kind": "1vendor/gpu"}, "vendor/class", id="kind-digit"),
        pytest.param({"device_permissions": "rx"}, "permissions", id="perm"),
        pytest.param({"control_devices": ("/tmp/x",)}, "/dev/", id="control"),
        pytest.param({"max_claims_per_call": 0}, "max_claims_per_call", id="claims"),
        pytest.param({"api_timeout_s": float("nan")}, "api_timeout_s", id="timeout"),
    ],
)
def test_settings_problems(changes: dict[str, Any], problem: str) -> None:
    problems = replace(DraPluginSettings(node_name=NODE), **changes).validate()
    assert len(problems) == 1
    assert problem in problems[0]
