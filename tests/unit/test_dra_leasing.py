"""extender.leasing.claimpinning: claims read back as holdings, and the allocation that pins a
claim."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from common import builders as b
from common import deviceattributes
from common.errors import InvalidInput
from common.model import Device, GpuUuid, Holder, NodeName, PodUid, Priority, Tier
from extender.leasing import claimpinning as pinning

NODE = NodeName("node-a")
OTHER = NodeName("node-b")


def claim(
    name: str = "job-a-1-gpu",
    *,
    requests: list[dict[str, Any]] | None = None,
    results: list[tuple[str, str, str]] | None = None,
    reserved: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim as the API server returns it; ``results``: (driver, pool, device)."""
    if requests is None:
        requests = [
            {"name": "gpu", "exactly": {"deviceClassName": deviceattributes.CLASS_HA, "count": 1}}
        ]
    devices: dict[str, Any] = {"requests": requests}
    if config is not None:
        devices["config"] = config
    obj: dict[str, Any] = {
        "apiVersion": deviceattributes.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7", **(meta or {})},
        "spec": {"devices": devices},
        "status": {},
    }
    if results is not None:
        obj["status"]["allocation"] = {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": d, "pool": p, "device": n} for d, p, n in results
                ]
            }
        }
    if reserved is not None:
        obj["status"]["reservedFor"] = reserved
    return obj


def pod_ref(name: str, uid: str, **extra: str) -> dict[str, Any]:
    return {"resource": "pods", "name": name, "uid": uid, **extra}


def holder(uid: str, name: str) -> Holder:
    return Holder(PodUid(uid), "ns", name, Priority.HIGH, 1000)


DEVICES: list[Device] = b.devices(NODE, 4, tier=Tier.HA) + b.devices(OTHER, 2, tier=Tier.MA)


def uuid(node: str, index: int) -> GpuUuid:
    return b.device_uuid(node, index)


# --- names ---


@pytest.mark.parametrize(
    ("name", "index"),
    [("gpu-0", 0), ("gpu-17", 17), ("gpu-07", None), ("gpu-", None), ("cpu-1", None)],
    ids=["zero", "two-digits", "leading-zero", "no-index", "other-prefix"],
)
def test_device_index(name: str, index: int | None) -> None:
    assert pinning.device_index(name) == index
    if index is not None:
        assert pinning.device_name(index) == name


# --- claims read back ---


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (claim(), ()),
        (claim(results=[(deviceattributes.DRIVER, NODE, "gpu-2")]), ((NODE, "gpu-2"),)),
        (
            claim(
                results=[
                    (deviceattributes.DRIVER, NODE, "gpu-3"),
                    (deviceattributes.DRIVER, NODE, "gpu-1"),
                ]
            ),
            ((NODE, "gpu-3"), (NODE, "gpu-1")),
        ),
        (
            claim(
                results=[
                    ("gpu.nvidia.com", NODE, "gpu-0"),
                    (deviceattributes.DRIVER, OTHER, "gpu-1"),
                ]
            ),
            ((OTHER, "gpu-1"),),
        ),
        ({"metadata": {"name": "x"}, "status": {"allocation": "garbage"}}, ()),
    ],
    ids=["unallocated", "one", "two-in-result-order", "other-driver-left-out", "malformed"],
)
def test_claim_devices(obj: dict[str, Any], expected: tuple[tuple[str, str], ...]) -> None:
    assert pinning.claim_devices(obj) == expected


def test_reserved_pods_keeps_core_pods_with_name_and_uid_only() -> None:
    obj = claim(
        reserved=[
            pod_ref("p0", "u0"),
            {"resource": "pods", "name": "p1"},  # no uid
            {"resource": "widgets", "apiGroup": "example.com", "name": "w", "uid": "uw"},
            pod_ref("p2", "u2", apiGroup="example.com"),  # not core pods
            pod_ref("p3", "u3"),
        ]
    )
    assert pinning.reserved_pods(obj) == (
        pinning.ReservedPod("ns", "p0", PodUid("u0")),
        pinning.ReservedPod("ns", "p3", PodUid("u3")),
    )


def test_claim_holdings_maps_each_device_to_its_uuid_and_the_reserved_pods() -> None:
    held = claim(
        "held",
        results=[
            (deviceattributes.DRIVER, NODE, "gpu-3"),
            (deviceattributes.DRIVER, NODE, "gpu-1"),
        ],
        reserved=[pod_ref("job-a-1", "u1")],
    )
    unused = claim("unused", results=[(deviceattributes.DRIVER, OTHER, "gpu-0")])
    foreign = claim("foreign", results=[("gpu.nvidia.com", NODE, "gpu-0")])
    gone = claim(
        "gone",
        results=[
            (deviceattributes.DRIVER, NODE, "gpu-9"),
            (deviceattributes.DRIVER, NODE, "gpu-0"),
        ],
    )
    holdings = pinning.claim_holdings([held, unused, claim("pending"), foreign, gone], DEVICES)
    assert holdings == (
        pinning.ClaimHolding(
            "ns",
            "held",
            NODE,
            (uuid(NODE, 3), uuid(NODE, 1)),
            (pinning.ReservedPod("ns", "job-a-1", PodUid("u1")),),
        ),
        pinning.ClaimHolding("ns", "unused", OTHER, (uuid(OTHER, 0),), ()),
        pinning.ClaimHolding("ns", "gone", NODE, (uuid(NODE, 0),), (), ((NODE, "gpu-9"),)),
    )


def test_an_index_two_devices_claim_is_unknown() -> None:
    (first,) = b.devices(NODE, 1)
    twice = [first, Device(NODE, 0, b.device_uuid("elsewhere", 0), first.cls)]
    (holding,) = pinning.claim_holdings(
        [claim(results=[(deviceattributes.DRIVER, NODE, "gpu-0")])], twice
    )
    assert holding.devices == ()
    assert holding.node == ""
    assert holding.unknown == ((NODE, "gpu-0"),)


def test_pod_devices_and_holders() -> None:
    one = claim(
        "one", results=[(deviceattributes.DRIVER, NODE, "gpu-0")], reserved=[pod_ref("a", "ua")]
    )
    two = claim(
        "two", results=[(deviceattributes.DRIVER, NODE, "gpu-2")], reserved=[pod_ref("a", "ua")]
    )
    shared = claim(
        "shared",
        results=[(deviceattributes.DRIVER, OTHER, "gpu-1")],
        reserved=[pod_ref("unknown", "ux"), pod_ref("b", "ub"), pod_ref("c", "uc")],
    )
    nobody = claim(
        "nobody", results=[(deviceattributes.DRIVER, OTHER, "gpu-0")], reserved=[pod_ref("z", "uz")]
    )
    holdings = pinning.claim_holdings([one, two, shared, nobody], DEVICES)
    assert pinning.pod_devices(holdings) == {
        "ua": (NODE, (uuid(NODE, 0), uuid(NODE, 2))),
        "ux": (OTHER, (uuid(OTHER, 1),)),
        "ub": (OTHER, (uuid(OTHER, 1),)),
        "uc": (OTHER, (uuid(OTHER, 1),)),
        "uz": (OTHER, (uuid(OTHER, 0),)),
    }
    pods = {PodUid(u): holder(u, n) for u, n in [("ua", "a"), ("ub", "b"), ("uc", "c")]}
    assert pinning.device_holders(holdings, pods) == {
        uuid(NODE, 0): pods[PodUid("ua")],
        uuid(NODE, 2): pods[PodUid("ua")],
        # the first reserved pod that is known
        uuid(OTHER, 1): pods[PodUid("ub")],
    }


# --- pinning ---


def selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def test_pinned_allocation_names_exactly_the_devices_in_order() -> None:
    obj = claim(
        requests=[
            {"name": "gpus", "exactly": {"deviceClassName": deviceattributes.CLASS_HA, "count": 2}}
        ]
    )
    before = copy.deepcopy(obj)
    status = pinning.pinned_allocation(obj, [DEVICES[3], DEVICES[1]])
    assert status == {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpus",
                        "driver": deviceattributes.DRIVER,
                        "pool": NODE,
                        "device": "gpu-3",
                    },
                    {
                        "request": "gpus",
                        "driver": deviceattributes.DRIVER,
                        "pool": NODE,
                        "device": "gpu-1",
                    },
                ]
            },
            "nodeSelector": selector(NODE),
        }
    }
    assert obj == before
    # Read back, it is what was pinned.
    written = {**obj, "status": status}
    assert pinning.claim_devices(written) == ((NODE, "gpu-3"), (NODE, "gpu-1"))
    (holding,) = pinning.claim_holdings([written], DEVICES)
    assert holding.devices == (DEVICES[3].uuid, DEVICES[1].uuid)


def test_count_defaults_to_one() -> None:
    obj = claim(
        requests=[{"name": "gpu", "exactly": {"deviceClassName": deviceattributes.CLASS_HA}}]
    )
    results = pinning.pinned_allocation(obj, [DEVICES[4]])["allocation"]["devices"]["results"]
    assert results == [
        {"request": "gpu", "driver": deviceattributes.DRIVER, "pool": OTHER, "device": "gpu-0"}
    ]


def test_the_claims_configuration_for_the_request_is_copied() -> None:
    opaque = {"opaque": {"driver": deviceattributes.DRIVER, "parameters": {"mode": "x"}}}
    obj = claim(
        config=[
            {"requests": ["gpu"], **opaque},
            {**opaque},  # for every request
            {"requests": ["other"], **opaque},
        ]
    )
    devices = pinning.pinned_allocation(obj, [DEVICES[0]])["allocation"]["devices"]
    assert devices["config"] == [
        {"source": "FromClaim", "requests": ["gpu"], **opaque},
        {"source": "FromClaim", **opaque},
    ]


def exactly(**fields: Any) -> list[dict[str, Any]]:
    return [{"name": "gpu", "exactly": {"deviceClassName": deviceattributes.CLASS_HA, **fields}}]


@pytest.mark.parametrize(
    ("obj", "devices", "message"),
    [
        (
            claim(requests=[*exactly(), {"name": "more", "exactly": {"deviceClassName": "x"}}]),
            [DEVICES[0]],
            "has 2 device requests: only a claim with one request",
        ),
        (claim(requests=[]), [DEVICES[0]], "has 0 device requests"),
        (claim(requests=exactly(count=2)), [DEVICES[0]], "asks for 2 devices, not the 1 given"),
        (claim(), DEVICES[:2], "asks for 1 devices, not the 2 given"),
        (
            claim(requests=exactly(allocationMode="All")),
            [DEVICES[0]],
            "allocationMode All, not ExactCount",
        ),
        (claim(requests=exactly(adminAccess=True)), [DEVICES[0]], "asks for admin access"),
        (
            claim(requests=[{"name": "gpu", "firstAvailable": [{"name": "a"}]}]),
            [DEVICES[0]],
            "cannot be pinned",
        ),
        (
            claim(results=[(deviceattributes.DRIVER, NODE, "gpu-0")]),
            [DEVICES[0]],
            "allocated already",
        ),
        (claim(), [], "no devices to pin"),
        (claim(requests=exactly(count=2)), [DEVICES[0], DEVICES[4]], "on several nodes"),
        (claim(requests=exactly(count=2)), [DEVICES[0], DEVICES[0]], "given twice"),
        (
            claim(requests=exactly(count=33)),
            b.devices(NODE, 33),
            "33 devices, more than 32 results",
        ),
    ],
    ids=[
        "two-requests",
        "no-request",
        "count-above",
        "count-below",
        "all-mode",
        "admin-access",
        "first-available",
        "allocated",
        "no-devices",
        "two-nodes",
        "repeated",
        "too-many",
    ],
)
def test_pinned_allocation_refuses(
    obj: dict[str, Any], devices: list[Device], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message) as refused:
        pinning.pinned_allocation(obj, devices)
    assert str(refused.value).startswith("ResourceClaim ns/job-a-1-gpu")


@pytest.mark.parametrize(
    ("finalizers", "expected"),
    [
        (None, {"metadata": {"finalizers": [pinning.FINALIZER], "resourceVersion": "7"}}),
        (
            ["other"],
            {"metadata": {"finalizers": ["other", pinning.FINALIZER], "resourceVersion": "7"}},
        ),
        ([pinning.FINALIZER], None),
    ],
    ids=["none", "beside-another", "already-set"],
)
def test_finalizer_patch(finalizers: list[str] | None, expected: dict[str, Any] | None) -> None:
    meta = {} if finalizers is None else {"finalizers": finalizers}
    assert pinning.finalizer_patch(claim(meta=meta)) == expected


@pytest.mark.parametrize(
    ("gates", "expected"),
    [
        (None, None),
        ([{"name": "other"}], None),
        ([{"name": pinning.RECLAIM_GATE}], {"spec": {"schedulingGates": None}}),
        (
            [{"name": "other"}, {"name": pinning.RECLAIM_GATE}],
            {"spec": {"schedulingGates": [{"name": "other"}]}},
        ),
    ],
    ids=["no-gates", "other-gate", "only-ours", "ours-and-another"],
)
def test_ungated(gates: list[dict[str, str]] | None, expected: dict[str, Any] | None) -> None:
    spec: dict[str, Any] = {} if gates is None else {"schedulingGates": gates}
    assert pinning.ungated({"spec": spec}) == expected
