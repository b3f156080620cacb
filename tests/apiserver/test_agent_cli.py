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


async def test_agent_process_publishes_and_stops_cleanly(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    kube = await KubeClient.connect(apiserver.kubeconfig)
    with contextlib.suppress(Conflict):
        await kube.json(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": "tidelease-system"}}
        )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "common.cli",
        "agent",
        "--node",
        node,
        "--backend",
        "fake",
        "--fake-gpus",
        "2",
        "--kubeconfig",
        str(apiserver.kubeconfig),
        "--cycle",
        "0.5",
        "--device-plugin-dir",
        str(tmp_path),
        stderr=asyncio.subprocess.DEVNULL,
    )
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
