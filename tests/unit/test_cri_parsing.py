"""CRI replies parsed into facts (containerd's verbose info), gRPC errors mapped onto
tidelease's, and the pure modules of the hot restart kept free of I/O."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import grpc.aio
import pytest

from common.errors import InvalidInput, NotFound, Unavailable
from nodeagent.cri import api_pb2 as pb
from nodeagent.cri.client import mapped, target
from nodeagent.cri.parsing import container_status, sandbox_status
from nodeagent.cri.runtime import ContainerState, RuntimeFailed

ROOT = Path(__file__).resolve().parents[2]

# Shaped as containerd 1.6 writes them (proto field names, Go encoding/json).
SANDBOX_INFO = {
    "pid": 26592,
    "config": {
        "metadata": {"name": "x", "uid": "u1", "namespace": "ns"},
        "hostname": "x",
        "linux": {"cgroup_parent": "/tl/x"},
    },
    "runtimeSpec": {
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "network", "path": "/state/netns/cni-1234"},
            ]
        }
    },
}
CONTAINER_INFO = {
    "sandboxID": "sb1",
    "pid": 4242,
    "config": {
        "metadata": {"name": "app", "attempt": 2},
        "image": {"image": "docker.io/local/app:v1"},
        "envs": [{"key": "A", "value": "b"}],
        "mounts": [{"container_path": "/data", "host_path": "/srv", "propagation": 1}],
        "linux": {"security_context": {"namespace_options": {"pid": 1}}},
        "labels": {"l": "1"},
        "stop_signal": 23,
    },
}


def test_sandbox_status_from_verbose_info() -> None:
    reply = pb.PodSandboxStatusResponse(
        status=pb.PodSandboxStatus(
            id="sb1",
            state=pb.SANDBOX_READY,
            metadata=pb.PodSandboxMetadata(name="x", uid="u1", namespace="ns"),
            network=pb.PodSandboxNetworkStatus(ip="10.1.2.3"),
        ),
        info={"info": json.dumps(SANDBOX_INFO)},
    )
    s = sandbox_status(reply)
    assert (s.id, s.ready, s.ip, s.pid, s.netns) == (
        "sb1",
        True,
        "10.1.2.3",
        26592,
        "/state/netns/cni-1234",
    )
    assert s.config is not None
    assert s.config.linux.cgroup_parent == "/tl/x"


def test_container_status_carries_its_config_and_names_unknown_keys() -> None:
    reply = pb.ContainerStatusResponse(
        status=pb.ContainerStatus(
            id="c1",
            metadata=pb.ContainerMetadata(name="app", attempt=2),
            state=pb.CONTAINER_RUNNING,
            image=pb.ImageSpec(image="docker.io/local/app:v1"),
        ),
        info={"info": json.dumps(CONTAINER_INFO)},
    )
    c = container_status(reply)
    assert (c.state, c.sandbox_id, c.pid, c.attempt) == (ContainerState.RUNNING, "sb1", 4242, 2)
    assert c.config is not None
    assert c.config.mounts[0].propagation == pb.PROPAGATION_HOST_TO_CONTAINER
    assert c.config.linux.security_context.namespace_options.pid == pb.CONTAINER
    assert c.unknown_config_keys == ("stop_signal",)


def test_container_status_without_verbose_info() -> None:
    c = container_status(pb.ContainerStatusResponse(status=pb.ContainerStatus(id="c1")))
    assert (c.config, c.pid, c.sandbox_id) == (None, None, "")


def rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "details")


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (grpc.StatusCode.NOT_FOUND, NotFound),
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, Unavailable),
        (grpc.StatusCode.CANCELLED, Unavailable),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidInput),
        (grpc.StatusCode.UNKNOWN, RuntimeFailed),
        (grpc.StatusCode.FAILED_PRECONDITION, RuntimeFailed),
    ],
    ids=lambda v: getattr(v, "name", getattr(v, "__name__", "")),
)
def test_grpc_errors_map_onto_tidelease_errors(code: grpc.StatusCode, error: type) -> None:
    assert isinstance(mapped("PullImage", rpc_error(code)), error)


@pytest.mark.parametrize(
    ("endpoint", "want"),
    [
        ("unix:///run/containerd/containerd.sock", "unix:///run/containerd/containerd.sock"),
        ("/run/containerd/containerd.sock", "unix:///run/containerd/containerd.sock"),
    ],
)
def test_target(endpoint: str, want: str) -> None:
    assert target(endpoint) == want


def test_target_rejects_tcp() -> None:
    with pytest.raises(InvalidInput):
        target("localhost:1234")
