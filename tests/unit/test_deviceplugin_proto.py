"""The deviceplugin v1beta1, CRI runtime.v1, DRA v1 and plugin registration protos: committed
generated code is current, and it is the kubelet's and the runtime's.

Field numbers and names below are those of k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1,
k8s.io/cri-api/pkg/apis/runtime/v1 (the subset tidelease uses), k8s.io/kubelet/pkg/apis/dra/v1
and k8s.io/kubelet/pkg/apis/pluginregistration/v1; a change to any of them breaks the wire
format against a real kubelet or container runtime.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodeagent.cri import api_pb2 as cri_pb2
from nodeagent.deviceplugin import api_pb2
from nodeagent.dradriver import api_pb2 as dra_pb2
from nodeagent.dradriver import registration_pb2

ROOT = Path(__file__).resolve().parents[2]
# Every proto hack/gen-proto.sh compiles, and the modules it writes for each.
PROTOS = [
    Path("nodeagent/deviceplugin/api.proto"),
    Path("nodeagent/cri/api.proto"),
    Path("nodeagent/dradriver/api.proto"),
    Path("nodeagent/dradriver/registration.proto"),
]
GENERATED = ["_pb2.py", "_pb2.pyi", "_pb2_grpc.py"]


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
    modules = [proto.with_name(proto.stem + suffix) for proto in PROTOS for suffix in GENERATED]
    stale = [
        str(module)
        for module in modules
        if (tmp_path / module).read_bytes() != (ROOT / module).read_bytes()
    ]
    assert not stale, f"{stale} out of date with their protos: run hack/gen-proto.sh"
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    assert written == set(modules), "hack/gen-proto.sh compiles other protos than PROTOS lists"


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


# --- CRI runtime.v1: the messages and fields tidelease uses, with upstream's numbers ---

CRI_FIELDS = {
    "VersionResponse": {
        "version": 1,
        "runtime_name": 2,
        "runtime_version": 3,
        "runtime_api_version": 4,
    },
    "Mount": {
        "container_path": 1,
        "host_path": 2,
        "readonly": 3,
        "selinux_relabel": 4,
        "propagation": 5,
        "uidMappings": 6,
        "gidMappings": 7,
        "recursive_read_only": 8,
        "image": 9,
        "image_sub_path": 10,
    },
    "NamespaceOption": {"network": 1, "pid": 2, "ipc": 3, "target_id": 4, "userns_options": 5},
    "LinuxPodSandboxConfig": {
        "cgroup_parent": 1,
        "security_context": 2,
        "sysctls": 3,
        "overhead": 4,
        "resources": 5,
    },
    "PodSandboxMetadata": {"name": 1, "uid": 2, "namespace": 3, "attempt": 4},
    "PodSandboxConfig": {
        "metadata": 1,
        "hostname": 2,
        "log_directory": 3,
        "dns_config": 4,
        "port_mappings": 5,
        "labels": 6,
        "annotations": 7,
        "linux": 8,
    },
    "RunPodSandboxRequest": {"config": 1, "runtime_handler": 2},
    "PodSandboxStatusRequest": {"pod_sandbox_id": 1, "verbose": 2},
    "PodSandboxStatus": {
        "id": 1,
        "metadata": 2,
        "state": 3,
        "created_at": 4,
        "network": 5,
        "linux": 6,
        "labels": 7,
        "annotations": 8,
        "runtime_handler": 9,
    },
    "PodSandboxStatusResponse": {
        "status": 1,
        "info": 2,
        "containers_statuses": 3,
        "timestamp": 4,
    },
    "ImageSpec": {
        "image": 1,
        "annotations": 2,
        "user_specified_image": 18,
        "runtime_handler": 19,
        "image_ref": 20,
    },
    "LinuxContainerSecurityContext": {
        "capabilities": 1,
        "privileged": 2,
        "namespace_options": 3,
        "selinux_options": 4,
        "run_as_user": 5,
        "run_as_group": 12,
        "run_as_username": 6,
        "readonly_rootfs": 7,
        "supplemental_groups": 8,
        "supplemental_groups_policy": 17,
        "no_new_privs": 11,
        "masked_paths": 13,
        "readonly_paths": 14,
        "seccomp": 15,
        "apparmor": 16,
        "apparmor_profile": 9,
        "seccomp_profile_path": 10,
    },
    "ContainerConfig": {
        "metadata": 1,
        "image": 2,
        "command": 3,
        "args": 4,
        "working_dir": 5,
        "envs": 6,
        "mounts": 7,
        "devices": 8,
        "labels": 9,
        "annotations": 10,
        "log_path": 11,
        "stdin": 12,
        "stdin_once": 13,
        "tty": 14,
        "linux": 15,
        "CDI_devices": 17,
    },
    "CreateContainerRequest": {"pod_sandbox_id": 1, "config": 2, "sandbox_config": 3},
    "StopContainerRequest": {"container_id": 1, "timeout": 2},
    "ContainerFilter": {"id": 1, "state": 2, "pod_sandbox_id": 3, "label_selector": 4},
    "Container": {
        "id": 1,
        "pod_sandbox_id": 2,
        "metadata": 3,
        "image": 4,
        "image_ref": 5,
        "state": 6,
        "created_at": 7,
        "labels": 8,
        "annotations": 9,
        "image_id": 10,
    },
    "ContainerStatus": {
        "id": 1,
        "metadata": 2,
        "state": 3,
        "created_at": 4,
        "started_at": 5,
        "finished_at": 6,
        "exit_code": 7,
        "image": 8,
        "image_ref": 9,
        "reason": 10,
        "message": 11,
        "labels": 12,
        "annotations": 13,
        "mounts": 14,
        "log_path": 15,
        "resources": 16,
        "image_id": 17,
    },
    "ContainerStatusResponse": {"status": 1, "info": 2},
    "Image": {
        "id": 1,
        "repo_tags": 2,
        "repo_digests": 3,
        "size": 4,
        "uid": 5,
        "username": 6,
        "spec": 7,
        "pinned": 8,
    },
    "PullImageRequest": {"image": 1, "auth": 2, "sandbox_config": 3},
    "PullImageResponse": {"image_ref": 1},
}


@pytest.mark.parametrize("message", sorted(CRI_FIELDS))
def test_cri_message_fields_are_upstreams(message: str) -> None:
    descriptor = cri_pb2.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.full_name == f"runtime.v1.{message}"
    assert {f.name: f.number for f in descriptor.fields} == CRI_FIELDS[message]


def test_cri_enums_are_upstreams() -> None:
    assert dict(cri_pb2.ContainerState.items()) == {
        "CONTAINER_CREATED": 0,
        "CONTAINER_RUNNING": 1,
        "CONTAINER_EXITED": 2,
        "CONTAINER_UNKNOWN": 3,
    }
    assert dict(cri_pb2.PodSandboxState.items()) == {"SANDBOX_READY": 0, "SANDBOX_NOTREADY": 1}
    assert dict(cri_pb2.NamespaceMode.items()) == {"POD": 0, "CONTAINER": 1, "NODE": 2, "TARGET": 3}


@pytest.mark.parametrize(
    ("service", "methods"),
    [
        pytest.param(
            "RuntimeService",
            [
                "Version",
                "RunPodSandbox",
                "StopPodSandbox",
                "RemovePodSandbox",
                "PodSandboxStatus",
                "ListPodSandbox",
                "CreateContainer",
                "StartContainer",
                "StopContainer",
                "RemoveContainer",
                "ListContainers",
                "ContainerStatus",
            ],
            id="runtime",
        ),
        pytest.param("ImageService", ["ListImages", "ImageStatus", "PullImage"], id="image"),
    ],
)
def test_cri_services_are_upstreams(service: str, methods: list[str]) -> None:
    descriptor = cri_pb2.DESCRIPTOR.services_by_name[service]
    assert descriptor.full_name == f"runtime.v1.{service}"
    got = {m.name: (m.input_type.name, m.output_type.name) for m in descriptor.methods}
    assert got == {m: (f"{m}Request", f"{m}Response") for m in methods}
    assert not any(m.server_streaming for m in descriptor.methods)


# --- DRA v1 (the DRA kubelet plugin) and pluginregistration (its registration) ---

DRA_FIELDS = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "Device": {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    },
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourcesResponse": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}

REGISTRATION_FIELDS = {
    "PluginInfo": {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4},
    "RegistrationStatus": {"plugin_registered": 1, "error": 2},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}


@pytest.mark.parametrize(
    ("module", "package", "message", "fields"),
    [
        *(
            pytest.param(dra_pb2, "k8s.io.kubelet.pkg.apis.dra.v1", m, f, id=f"dra-{m}")
            for m, f in DRA_FIELDS.items()
        ),
        *(
            pytest.param(registration_pb2, "pluginregistration", m, f, id=f"registration-{m}")
            for m, f in REGISTRATION_FIELDS.items()
        ),
    ],
)
def test_dra_message_fields_are_upstreams(
    module: Any, package: str, message: str, fields: dict[str, int]
) -> None:
    descriptor = module.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.full_name == f"{package}.{message}"
    assert {f.name: f.number for f in descriptor.fields} == fields
    assert set(module.DESCRIPTOR.message_types_by_name) == set(
        DRA_FIELDS if module is dra_pb2 else REGISTRATION_FIELDS
    )


def test_dra_maps_and_optional_fields_are_upstreams() -> None:
    prepare = dra_pb2.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"]
    assert prepare.message_type.GetOptions().map_entry
    assert prepare.message_type.fields_by_name["value"].message_type.name == (
        "NodePrepareResourceResponse"
    )
    unprepare = dra_pb2.NodeUnprepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"]
    assert unprepare.message_type.fields_by_name["value"].message_type.name == (
        "NodeUnprepareResourceResponse"
    )
    assert dra_pb2.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        pytest.param(
            dra_pb2,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
            {
                "NodePrepareResources": (
                    "NodePrepareResourcesRequest",
                    "NodePrepareResourcesResponse",
                ),
                "NodeUnprepareResources": (
                    "NodeUnprepareResourcesRequest",
                    "NodeUnprepareResourcesResponse",
                ),
            },
            id="dra",
        ),
        pytest.param(
            registration_pb2,
            "pluginregistration.Registration",
            {
                "GetInfo": ("InfoRequest", "PluginInfo"),
                "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse"),
            },
            id="registration",
        ),
    ],
)
def test_dra_services_are_upstreams(
    module: Any, service: str, methods: dict[str, tuple[str, str]]
) -> None:
    (descriptor,) = module.DESCRIPTOR.services_by_name.values()
    assert descriptor.full_name == service
    got = {m.name: (m.input_type.name, m.output_type.name) for m in descriptor.methods}
    assert got == methods
    assert not any(m.server_streaming or m.client_streaming for m in descriptor.methods)
