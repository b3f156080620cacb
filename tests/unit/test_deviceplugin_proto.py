"""The deviceplugin v1beta1 proto: committed generated code is current, and it is the kubelet's.

Field numbers and names below are those of k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1; a
change to any of them breaks the wire format against a real kubelet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.deviceplugin import api_pb2

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path("nodeagent/deviceplugin")
GENERATED = ["api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"]


def test_committed_code_is_what_gen_proto_writes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "hack/gen-proto.sh"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    stale = [
        name
        for name in GENERATED
        if (tmp_path / PACKAGE / name).read_bytes() != (ROOT / PACKAGE / name).read_bytes()
    ]
    assert not stale, f"{stale} out of date with api.proto: run hack/gen-proto.sh"


UPSTREAM_FIELDS = {
    "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
    "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
    "Empty": {},
    "ListAndWatchResponse": {"devices": 1},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "Device": {"ID": 1, "health": 2, "topology": 3},
    "PreStartContainerRequest": {"devices_ids": 1},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {"container_requests": 1},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    },
    "PreferredAllocationResponse": {"container_responses": 1},
    "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
    "AllocateRequest": {"container_requests": 1},
    "ContainerAllocateRequest": {"devices_ids": 1},
    "AllocateResponse": {"container_responses": 1},
    "ContainerAllocateResponse": {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4},
    "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
    "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
}


@pytest.mark.parametrize("message", sorted(UPSTREAM_FIELDS))
def test_message_fields_are_upstreams(message: str) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.full_name == f"v1beta1.{message}"
    assert {f.name: f.number for f in descriptor.fields} == UPSTREAM_FIELDS[message]


@pytest.mark.parametrize(
    ("service", "methods"),
    [
        pytest.param("Registration", {"Register": ("RegisterRequest", "Empty", False)}, id="reg"),
        pytest.param(
            "DevicePlugin",
            {
                "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
                "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
                "GetPreferredAllocation": (
                    "PreferredAllocationRequest",
                    "PreferredAllocationResponse",
                    False,
                ),
                "Allocate": ("AllocateRequest", "AllocateResponse", False),
                "PreStartContainer": (
                    "PreStartContainerRequest",
                    "PreStartContainerResponse",
                    False,
                ),
            },
            id="plugin",
        ),
    ],
)
def test_services_are_upstreams(service: str, methods: dict[str, tuple[str, str, bool]]) -> None:
    descriptor = api_pb2.DESCRIPTOR.services_by_name[service]
    assert descriptor.full_name == f"v1beta1.{service}"
    assert {
        m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
        for m in descriptor.methods
    } == methods
