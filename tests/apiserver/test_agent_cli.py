"""`tidelease agent` as a process: publishes the GpuNode and its heartbeat, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from common import contract
from common.errors import Conflict, NotFound
from common.kubeclient import KubeClient
from common.objects import parse_gpu_node
from tests.apiserver.conftest import ApiServer
from tests.polling import eventually

pytestmark = pytest.mark.apiserver


async def _agent(apiserver: ApiServer, node: str, *flags: str) -> asyncio.subprocess.Process:
    """`tidelease agent` with two fake GPUs, a half-second cycle and ``flags``."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "common.cli", "agent", "--node", node, "--backend", "fake",
        "--fake-gpus", "2", "--kubeconfig", str(apiserver.kubeconfig), "--cycle", "0.5", *flags,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def test_agent_process_publishes_and_stops_cleanly(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    kube = await KubeClient.connect(apiserver.kubeconfig)
    with contextlib.suppress(Conflict):
        await kube.json(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": "tidelease-system"}}
        )
    proc = await _agent(apiserver, node, "--device-plugin-dir", str(tmp_path))
    path = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}/{node}"
    lease_path = (
        "/apis/coordination.k8s.io/v1/namespaces/tidelease-system/leases/"
        f"{contract.AGENT_LEASE_PREFIX}{node}"
    )

    async def published() -> tuple[dict[str, Any], dict[str, Any]] | None:
        try:
            obj = await kube.json("GET", path)
            lease = await kube.json("GET", lease_path)
        except NotFound:
            return None
        return (obj, lease) if obj.get("status", {}).get("devices") else None

    async def socket_served() -> bool:
        return (tmp_path / "tidelease-gpu.sock").exists()

    try:
        obj, lease = await eventually(published, within_s=30)
        inv = parse_gpu_node(obj)
        assert [(d.index, d.gpu_type, d.cls.healthy) for d in inv.devices] == [
            (0, "H20", True),
            (1, "H20", True),
        ]
        assert lease["spec"]["holderIdentity"] == node
        # The device plugin serves its socket while it waits for a kubelet.
        await eventually(socket_served, within_s=10)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert not (tmp_path / "tidelease-gpu.sock").exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await kube.close()


async def test_agent_in_dra_mode_publishes_its_slice_and_registers_with_the_kubelet(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    """`tidelease agent --dra`: the node's GPUs as a ResourceSlice (from the GpuNode it
    publishes), the registration socket answering as the kubelet asks, sockets gone on SIGTERM."""
    import grpc

    from common import deviceattributes
    from nodeagent.dradriver import registration_pb2, registration_pb2_grpc

    node = f"node-{uuid.uuid4().hex[:6]}"
    registry, plugins = tmp_path / "registry", tmp_path / "plugins"
    kube = await KubeClient.connect(apiserver.kubeconfig)
    with contextlib.suppress(Conflict):
        await kube.json(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": "tidelease-system"}}
        )
    proc = await _agent(
        apiserver,
        node,
        "--no-device-plugin",
        "--dra",
        "--kubelet-registry-dir",
        str(registry),
        "--kubelet-plugins-dir",
        str(plugins),
        "--cdi-dir",
        str(tmp_path / "cdi"),
    )
    reg_socket = registry / f"{deviceattributes.DRIVER}-reg.sock"
    dra_socket = plugins / deviceattributes.DRIVER / "dra.sock"

    async def published() -> dict[str, Any] | None:
        try:
            obj = await kube.json(
                "GET", f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(node)}"
            )
        except NotFound:
            return None
        return obj if len(obj["spec"].get("devices") or []) == 2 else None

    try:
        stored = await eventually(published, within_s=30)
        gpunode = parse_gpu_node(
            await kube.json(
                "GET", f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}/{node}"
            )
        )
        assert stored["spec"]["nodeName"] == node
        assert stored["spec"]["driver"] == deviceattributes.DRIVER
        assert {
            d["name"]: d["attributes"][f"{contract.PREFIX}/uuid"]["string"]
            for d in stored["spec"]["devices"]
        } == {f"gpu-{d.index}": d.uuid for d in gpunode.devices}

        async def registered() -> bool:
            return reg_socket.exists() and dra_socket.exists()

        await eventually(registered, within_s=10)
        async with grpc.aio.insecure_channel(f"unix://{reg_socket}") as channel:
            stub = registration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = await stub.GetInfo(registration_pb2.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint) == (
            "DRAPlugin",
            deviceattributes.DRIVER,
            str(dra_socket),
        )
        assert "v1.DRAPlugin" in info.supported_versions
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert not reg_socket.exists()
        assert not dra_socket.exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        with contextlib.suppress(NotFound):
            await kube.json(
                "DELETE", f"{deviceattributes.SLICES_PATH}/{deviceattributes.slice_name(node)}"
            )
        await kube.close()


async def test_a_fake_two_socket_node_publishes_its_topology_as_the_crd_keeps_it(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    """The agent of a fake 2-socket node (``--fake-topology pcie-2socket-8``): the API server
    keeps status.topology as written (the CRD's schema prunes nothing of it), and it parses
    back to each device's NUMA node and each pair's link."""
    from common.topology import Link, link_between, link_table

    node = f"node-{uuid.uuid4().hex[:6]}"
    kube = await KubeClient.connect(apiserver.kubeconfig)
    with contextlib.suppress(Conflict):
        await kube.json(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": "tidelease-system"}}
        )
    proc = await _agent(
        apiserver, node, "--fake-gpus", "8", "--fake-topology", "pcie-2socket-8",
        "--device-plugin-dir", str(tmp_path),
    )  # fmt: skip
    path = f"/apis/{contract.API_VERSION}/{contract.PLURAL_GPU_NODE}/{node}"

    async def published() -> dict[str, Any] | None:
        try:
            obj = await kube.json("GET", path)
        except NotFound:
            return None
        return obj if obj.get("status", {}).get("topology") else None

    try:
        obj = await eventually(published, within_s=30)
        topology = parse_gpu_node(obj).topology
        assert topology is not None
        assert [topology.placement(i).numa_node for i in range(8)] == [0] * 4 + [1] * 4  # type: ignore[union-attr]
        table = link_table(topology)
        assert link_between(table, 0, 1).link is Link.SAME_PCIE_SWITCH
        assert link_between(table, 0, 2).link is Link.SAME_HOST_BRIDGE
        assert link_between(table, 3, 4).link is Link.ACROSS_SOCKETS
        assert len(obj["status"]["topology"]["links"]) == 28  # every pair of 8, none pruned
    finally:
        proc.kill()
        await proc.wait()
        await kube.close()
