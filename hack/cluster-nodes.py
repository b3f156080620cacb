#!/usr/bin/env python3
"""Create kwok-managed fake GPU nodes and their GpuNode objects, concurrently.

usage: cluster-nodes.py --server URL --token TOKEN --ca FILE --count N [--prefix P] [--gpus 8]
                        [--gpu-type H20] [--start 0] [--concurrency 16] [--topology LAYOUT]

Node ``<prefix>-<i>`` is annotated ``kwok.x-k8s.io/node: fake`` (kwok manages it) and labelled
``type: kwok`` and ``nvidia.com/gpu.product: <gpu-type>``; its capacity and allocatable hold
``nvidia.com/gpu: <gpus>`` besides cpu, memory and pods. Its GpuNode (same name) lists ``gpus``
healthy HA devices of that type, untagged (common.builders.gpu_node); with ``--topology``, its
``status.topology`` as the node agent reads it from the NVML fake's layout of that name
(nodeagent/nvmlfake.py; ``--gpus`` must match it). Objects that exist already are left as they
are, so a second run is harmless. Run with the project's .venv Python.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from typing import Any

import aiohttp

from common import builders, contract
from common.topology import to_json as topology_json

GPUNODES = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL_GPU_NODE}"


def kwok_node(
    name: str,
    *,
    gpus: int,
    gpu_type: str,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node object that kwok manages, as it is created (status included)."""
    resources = {
        "cpu": "96",
        "memory": "1024Gi",
        "pods": "110",
        contract.DEFAULT_GPU_RESOURCE: str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.product": gpu_type,
                **(labels or {}),
            },
        },
        "spec": {"taints": taints or []},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
                "containerRuntimeVersion": "fake",
                "kernelVersion": "",
                "osImage": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "phase": "Running",
        },
    }


class Api:
    def __init__(self, session: aiohttp.ClientSession, server: str, token: str) -> None:
        self.session = session
        self.server = server
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    async def send(
        self, method: str, path: str, body: Any, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        for attempt in range(8):
            try:
                async with self.session.request(
                    method,
                    self.server + path,
                    data=json.dumps(body),
                    headers={**self.headers, "Content-Type": content_type},
                ) as resp:
                    data = await resp.json(content_type=None)
                    if resp.status in (429, 500, 503, 504) and attempt < 7:
                        await asyncio.sleep(0.2 * 2**attempt)
                        continue
                    return resp.status, data
            except (aiohttp.ClientError, TimeoutError):
                if attempt == 7:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    async def create(self, path: str, obj: dict[str, Any]) -> None:
        status, data = await self.send("POST", path, obj)
        if status not in (201, 409):
            raise RuntimeError(f"POST {path} {obj['metadata']['name']}: HTTP {status}: {data}")

    async def patch_status(self, path: str, status_obj: dict[str, Any]) -> None:
        status, data = await self.send(
            "PATCH", path + "/status", {"status": status_obj}, "application/merge-patch+json"
        )
        if status != 200:
            raise RuntimeError(f"PATCH {path}/status: HTTP {status}: {data}")


def layout_topology(name: str, gpus: int) -> dict[str, Any]:
    """``status.topology`` of a node whose GPUs are laid out as the NVML fake's ``name``, read
    by the agent's own reader."""
    from nodeagent.nvml import NvmlReader
    from nodeagent.nvmlfake import FakeNvml, layout

    laid = layout(name)
    if len(laid) != gpus:
        raise SystemExit(f"--topology {name} has {len(laid)} GPUs, --gpus says {gpus}")
    topology = NvmlReader(FakeNvml(laid)).topology().topology
    if topology is None:
        raise SystemExit(f"--topology {name}: the reader found no topology")
    return topology_json(topology)


async def create_one(
    api: Api, name: str, args: argparse.Namespace, topology: dict[str, Any] | None
) -> None:
    await api.create("/api/v1/nodes", kwok_node(name, gpus=args.gpus, gpu_type=args.gpu_type))
    gpu_node = builders.gpu_node(name, builders.devices(name, args.gpus, gpu_type=args.gpu_type))
    status = gpu_node.pop("status")
    if topology is not None:
        status["topology"] = topology
    await api.create(GPUNODES, gpu_node)
    await api.patch_status(f"{GPUNODES}/{name}", status)


async def main(args: argparse.Namespace) -> None:
    ctx = ssl.create_default_context(cafile=args.ca)
    names = [f"{args.prefix}-{i}" for i in range(args.start, args.start + args.count)]
    topology = layout_topology(args.topology, args.gpus) if args.topology else None
    start = time.monotonic()
    connector = aiohttp.TCPConnector(ssl=ctx, limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        api = Api(session, args.server, args.token)
        queue: asyncio.Queue[str] = asyncio.Queue()
        for name in names:
            queue.put_nowait(name)

        async def worker() -> None:
            while not queue.empty():
                await create_one(api, queue.get_nowait(), args, topology)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    print(
        f"created {len(names)} kwok GPU nodes ({args.prefix}-{args.start}..) with GpuNodes in "
        f"{time.monotonic() - start:.1f} s",
        file=sys.stderr,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--prefix", default="kwok-gpu")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--gpu-type", default="H20")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--topology", default="", help="an NVML fake layout, e.g. pcie-2socket-8")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
