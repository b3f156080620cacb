"""Which pod a kubelet request serves, and what its container gets: tables over pure functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import contract
from common.errors import InvalidInput
from common.model import GpuUuid, PodUid
from nodeagent.deviceplugin.granting import DeviceNode, container_grant
from nodeagent.deviceplugin.matching import (
    NodePod,
    candidates,
    match_allocation,
    parse_node_pod,
    prefer,
)
from nodeagent.deviceplugin.testing import NODE, gpus, node_pod, placed_pod, uuids
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, layout

U = uuids(0, 1, 2, 3, 4, 5, 6, 7)
ALL = list(U)


def _with_annotations(annotations: dict[str, Any], **meta: Any) -> dict[str, Any]:
    obj = placed_pod("p", None)
    obj["metadata"]["annotations"] = annotations
    obj["metadata"].update(meta)
    return obj


# --- parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "devices", "devices_node", "assigned", "problem"),
    [
        pytest.param(_with_annotations({}), (), "", False, "", id="no-choice"),
        pytest.param(
            _with_annotations({contract.ANN_DEVICES: "a,b", contract.ANN_DEVICE_NODE: NODE}),
            ("a", "b"),
            NODE,
            False,
            "",
            id="choice",
        ),
        pytest.param(
            _with_annotations({contract.ANN_DEVICES: " a , b ,", contract.ANN_DEVICE_NODE: NODE}),
            ("a", "b"),
            NODE,
            False,
            "",
            id="spaces-and-trailing-comma",
        ),
        pytest.param(
            _with_annotations({contract.ANN_DEVICES: " , "}),
            (),
            "",
            False,
            "names no device",
            id="empty-list",
        ),
        pytest.param(
            _with_annotations({contract.ANN_DEVICES: "a,a"}),
            ("a", "a"),
            "",
            False,
            "twice",
            id="duplicate",
        ),
        pytest.param(
            _with_annotations({contract.ANN_DEVICES: 7}),
            (),
            "",
            False,
            "names no device",
            id="not-a-string",
        ),
        pytest.param(
            _with_annotations({contract.ANN_DEVICES: "a", contract.ANN_DEVICES_ASSIGNED: "true"}),
            ("a",),
            "",
            True,
            "",
            id="assigned",
        ),
        pytest.param(
            _with_annotations({contract.ANN_DEVICES_ASSIGNED: "yes"}),
            (),
            "",
            False,
            "",
            id="assigned-must-be-true",
        ),
    ],
)
def test_parse_node_pod(
    obj: dict[str, Any],
    devices: tuple[str, ...],
    devices_node: str,
    assigned: bool,
    problem: str,
) -> None:
    pod = parse_node_pod(obj)
    assert pod.devices == devices
    assert pod.devices_node == devices_node
    assert pod.assigned is assigned
    assert (problem in pod.problem) if problem else pod.problem == ""


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({}, id="empty"),
        pytest.param({"metadata": None, "status": "x"}, id="nulls"),
        pytest.param({"metadata": {"annotations": ["x"]}}, id="annotations-a-list"),
    ],
)
def test_parse_node_pod_never_raises(obj: dict[str, Any]) -> None:
    pod = parse_node_pod(obj)
    assert pod.devices == ()
    assert candidates([pod], NODE) == []


def test_parse_node_pod_reads_identity_and_state() -> None:
    obj = placed_pod("w", ["a"], namespace="ns", uid="u-1", created="2025-02-03T04:05:06Z")
    obj["metadata"]["deletionTimestamp"] = "2025-02-03T04:06:00Z"
    obj["status"]["phase"] = "Running"
    pod = parse_node_pod(obj)
    assert (pod.key, pod.uid, pod.created, pod.phase, pod.deleting) == (
        "ns/w",
        "u-1",
        "2025-02-03T04:05:06Z",
        "Running",
        True,
    )


# --- candidates ----------------------------------------------------------------------------------


def test_candidates_are_waiting_pods_of_this_node_oldest_first() -> None:
    pods = [
        node_pod("newer", U[:1], created="2025-01-02T00:00:00Z"),
        node_pod("undated", U[1:2], created=""),
        node_pod("older", U[2:3], created="2025-01-01T00:00:00Z"),
        node_pod("b-tie", U[3:4], created="2025-01-01T00:00:00Z"),
        node_pod("running", U[4:5], phase="Running"),
        node_pod("done", U[5:6], assigned=True),
        node_pod("elsewhere", U[6:7], devices_node="node-b"),
        node_pod("plain", None),
        NodePod(
            "default", "deleting", PodUid("u"), devices=U[7:8], devices_node=NODE, deleting=True
        ),
        NodePod(
            "default", "bad", PodUid("u"), devices=(U[0], U[0]), devices_node=NODE, problem="twice"
        ),
    ]
    assert [p.name for p in candidates(pods, NODE)] == ["b-tie", "older", "newer", "undated"]


# --- GetPreferredAllocation ----------------------------------------------------------------------

OLD = "2025-01-01T00:00:00Z"
NEW = "2025-01-02T00:00:00Z"


@pytest.mark.parametrize(
    ("pods", "available", "must", "size", "want", "from_pod"),
    [
        pytest.param(
            [node_pod("a", [U[5], U[2]])], ALL, [], 2, [U[5], U[2]], "a", id="recorded-choice"
        ),
        pytest.param(
            [node_pod("new", U[4:6], created=NEW), node_pod("old", U[0:2], created=OLD)],
            ALL,
            [],
            2,
            list(U[0:2]),
            "old",
            id="oldest-first",
        ),
        pytest.param(
            [node_pod("one", U[0:1], created=OLD), node_pod("two", U[2:4], created=NEW)],
            ALL,
            [],
            2,
            list(U[2:4]),
            "two",
            id="size-must-match",
        ),
        pytest.param(
            [node_pod("taken", U[0:2], created=OLD), node_pod("free", U[4:6], created=NEW)],
            list(U[1:]),
            [],
            2,
            list(U[4:6]),
            "free",
            id="all-recorded-devices-available",
        ),
        pytest.param(
            [node_pod("a", U[0:2], assigned=True)],
            ALL,
            [],
            2,
            list(U[0:2]),
            None,
            id="assigned-pod-skipped",
        ),
        pytest.param(
            [node_pod("a", U[2:4], devices_node="node-b")],
            ALL,
            [],
            2,
            list(U[0:2]),
            None,
            id="choice-for-another-node",
        ),
        pytest.param(
            [node_pod("a", U[2:4], phase="Running")],
            ALL,
            [],
            2,
            list(U[0:2]),
            None,
            id="running-pod-skipped",
        ),
        pytest.param(
            [node_pod("a", U[2:4])],
            ALL,
            [U[6]],
            2,
            [U[6], U[0]],
            None,
            id="must-include-outside-choice",
        ),
        pytest.param(
            [node_pod("a", U[2:4])],
            ALL,
            [U[3]],
            2,
            list(U[2:4]),
            "a",
            id="must-include-inside-choice",
        ),
        pytest.param(
            [node_pod("waiting", U[0:2])],
            ALL,
            [],
            3,
            [U[2], U[3], U[4]],
            None,
            id="fallback-avoids-devices-others-wait-for",
        ),
        pytest.param(
            [node_pod("waiting", U[0:2])],
            list(U[0:3]),
            [],
            3,
            [U[2], U[0], U[1]],
            None,
            id="fallback-takes-reserved-when-short",
        ),
        pytest.param([], list(U[3:6]), [], 2, list(U[3:5]), None, id="no-pods"),
        pytest.param([node_pod("a", U[0:1])], ALL, [], 0, [], None, id="size-zero"),
        pytest.param([], list(U[0:1]), [], 2, list(U[0:1]), None, id="fewer-available-than-size"),
    ],
)
def test_prefer(
    pods: list[NodePod],
    available: list[str],
    must: list[str],
    size: int,
    want: list[str],
    from_pod: str | None,
) -> None:
    choice = prefer(pods, NODE, available, must, size)
    assert list(choice.devices) == want
    assert (choice.pod.name if choice.pod else None) == from_pod
    assert choice.reason


def test_a_pod_placed_without_the_extender_gets_the_tightest_free_group() -> None:
    """The node's topology (the NVML fake's 2-socket layout: GPUs 0-1, 2-3, 4-5, 6-7 each
    behind one PCIe switch): with GPU 0 taken, two GPUs are the pair 2-3, not 1 and 2; devices
    a waiting pod records stay out while others suffice; what the kubelet must include, or a
    node without topology, keeps the first available."""
    reading = NvmlReader(FakeNvml(layout("pcie-2socket-8"))).topology()
    assert reading.topology is not None
    kw: dict[str, Any] = {"topology": reading.topology, "index_of": {u: i for i, u in enumerate(U)}}
    choice = prefer([], NODE, ALL[1:], [], 2, **kw)
    assert list(choice.devices) == [U[2], U[3]]
    assert choice.pod is None
    assert "tightest group" in choice.reason
    assert list(prefer([], NODE, ALL[1:], [], 2).devices) == [U[1], U[2]]  # no topology
    assert list(prefer([], NODE, ALL[1:], [], 4, **kw).devices) == [U[4], U[5], U[6], U[7]]
    waiting = [node_pod("waiting", U[2:5])]  # 3 recorded: not this request's match
    assert list(prefer(waiting, NODE, ALL[1:], [], 2, **kw).devices) == [U[6], U[7]]
    assert list(prefer([], NODE, ALL[1:], [U[1]], 2, **kw).devices) == [U[1], U[2]]


@st.composite
def _preferred_cases(draw: st.DrawFn) -> tuple[list[NodePod], list[GpuUuid], list[GpuUuid], int]:
    subsets = st.lists(st.sampled_from(U), min_size=1, max_size=4, unique=True)
    pods = [
        node_pod(f"p{i}", devices, created=f"2025-01-0{draw(st.integers(1, 9))}T00:00:00Z")
        for i, devices in enumerate(draw(st.lists(subsets, max_size=5)))
    ]
    available = draw(st.lists(st.sampled_from(U), unique=True))
    must = draw(st.lists(st.sampled_from(available), unique=True)) if available else []
    size = draw(st.integers(len(must), len(U)))
    return pods, available, must, size


@given(_preferred_cases())
def test_prefer_always_answers_a_usable_allocation(
    case: tuple[list[NodePod], list[GpuUuid], list[GpuUuid], int],
) -> None:
    pods, available, must, size = case
    choice = prefer(pods, NODE, available, must, size)
    assert len(set(choice.devices)) == len(choice.devices)
    assert set(choice.devices) <= set(available)
    assert set(must) <= set(choice.devices)
    assert len(choice.devices) == min(size, len(available))
    if choice.pod is not None:
        assert choice.pod.devices == choice.devices


# --- Allocate ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "requested", "want", "from_pod", "reason"),
    [
        pytest.param(
            [node_pod("a", [U[3], U[1]])],
            [U[1], U[3]],
            [U[3], U[1]],
            "a",
            "recorded on pod default/a",
            id="same-set-in-recorded-order",
        ),
        pytest.param(
            [node_pod("new", U[0:1], created=NEW), node_pod("old", U[0:1], created=OLD)],
            [U[0]],
            [U[0]],
            "old",
            "default/old",
            id="oldest-first",
        ),
        pytest.param(
            [node_pod("a", U[0:2])],
            list(U[2:4]),
            list(U[2:4]),
            None,
            "default/a record other devices",
            id="kubelet-chose-others",
        ),
        pytest.param(
            [node_pod("a", U[0:2])],
            [U[0]],
            [U[0]],
            None,
            "no pending pod records 1",
            id="subset-is-no-match",
        ),
        pytest.param(
            [node_pod("a", U[0:1], assigned=True)],
            [U[0]],
            [U[0]],
            None,
            "no pending pod with recorded devices",
            id="already-assigned",
        ),
        pytest.param(
            [node_pod("plain", None)],
            [U[5]],
            [U[5]],
            None,
            "no pending pod with recorded devices",
            id="placed-without-extender",
        ),
    ],
)
def test_match_allocation(
    pods: list[NodePod], requested: list[str], want: list[str], from_pod: str | None, reason: str
) -> None:
    match = match_allocation(pods, NODE, requested)
    assert list(match.devices) == want
    assert (match.pod.name if match.pod else None) == from_pod
    assert reason in match.reason


# --- the container's grant -----------------------------------------------------------------------

KNOWN = {d.uuid: d for d in gpus(4)}


@pytest.mark.parametrize(
    ("ids", "control", "paths"),
    [
        pytest.param(U[2:3], (), ["/dev/nvidia2"], id="one"),
        pytest.param((U[3], U[0]), (), ["/dev/nvidia3", "/dev/nvidia0"], id="order-kept"),
        pytest.param(
            U[1:2],
            ("/dev/nvidiactl", "/dev/nvidia-uvm"),
            ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"],
            id="control-devices",
        ),
        pytest.param(U[1:2], ("/dev/nvidia1",), ["/dev/nvidia1"], id="control-device-not-repeated"),
    ],
)
def test_container_grant(ids: tuple[str, ...], control: tuple[str, ...], paths: list[str]) -> None:
    grant = container_grant(ids, KNOWN, control_devices=control)  # type: ignore[arg-type]
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}
    assert grant.devices == tuple(DeviceNode(p, p, "rw") for p in paths)
    assert grant.annotations == {contract.ANN_DEVICES: ",".join(ids)}


@pytest.mark.parametrize("root", ["/srv/node/fakedev", "/srv/node/fakedev/"])
def test_container_grant_looks_device_nodes_up_under_the_host_root(root: str) -> None:
    grant = container_grant((U[1],), KNOWN, control_devices=("/dev/nvidiactl",), host_root=root)
    assert grant.devices == (
        DeviceNode("/dev/nvidia1", "/srv/node/fakedev/dev/nvidia1", "rw"),
        DeviceNode("/dev/nvidiactl", "/srv/node/fakedev/dev/nvidiactl", "rw"),
    )


def test_container_grant_refuses_unknown_devices() -> None:
    with pytest.raises(InvalidInput, match="GPU-x"):
        container_grant([U[0], "GPU-x"], KNOWN)  # type: ignore[list-item]


# --- layers --------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
# The plugin's adapters; devices.py is allowed for the PluginDevice dataclass.
