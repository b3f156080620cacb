"""The ledger's confirmation of a pod's recorded devices: a table of pods and ledgers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from common import contract
from common.errors import InvalidInput
from nodeagent.deviceplugin.confirming import NodeLedger, confirm, parse_node_ledger
from nodeagent.deviceplugin.matching import parse_node_pod
from nodeagent.deviceplugin.testing import NODE, gpu_allocation, ledger_entry, placed_pod, uuids

U = uuids(0, 1, 2, 3)
POD = placed_pod("train-0", [U[0], U[1]], namespace="team-a", uid="uid-pod")
OTHER = placed_pod("infer-0", [U[2]], namespace="team-b", uid="uid-other")


def ledger(*entries: tuple[dict[str, Any], Sequence[str]]) -> NodeLedger:
    return parse_node_ledger(gpu_allocation(NODE, [ledger_entry(p, d) for p, d in entries]))


@pytest.mark.parametrize(
    ("annotated", "book", "outcome", "devices", "reason"),
    [
        pytest.param(
            [U[0], U[1]],
            ledger((POD, [U[0], U[1]]), (OTHER, [U[2]])),
            "confirmed",
            (U[0], U[1]),
            "confirmed by the node's allocation ledger",
            id="agrees",
        ),
        pytest.param(
            [U[1], U[0]],
            ledger((POD, [U[0], U[1]])),
            "confirmed",
            (U[0], U[1]),
            "confirmed",
            id="agrees-in-another-order-ledger-order-wins",
        ),
        pytest.param(
            [U[0], U[3]],
            ledger((POD, [U[0], U[1]])),
            "mismatch",
            (),
            f"names {U[0]},{U[3]} but the node's allocation ledger gives it {U[0]},{U[1]}",
            id="disagrees",
        ),
        pytest.param(
            [U[0], U[2]],
            ledger((POD, [U[0], U[1]]), (OTHER, [U[2]])),
            "mismatch",
            (),
            f"gives it {U[0]},{U[1]} ({U[2]} is pod team-b/infer-0's)",
            id="a-device-of-another-pod",
        ),
        pytest.param(
            [U[0], U[1], U[3]],
            ledger((POD, [U[0], U[1]])),
            "mismatch",
            (),
            f"gives it {U[0]},{U[1]}",
            id="an-extra-device",
        ),
        pytest.param(
            [U[0]],
            ledger((POD, [U[0], U[1]])),
            "mismatch",
            (),
            f"names {U[0]} but",
            id="a-device-short",
        ),
        pytest.param(
            [U[2]],
            ledger((OTHER, [U[2]])),
            "no-entry",
            (),
            f"has no entry for its UID uid-pod ({U[2]} is pod team-b/infer-0's)",
            id="missing-entry",
        ),
        pytest.param(
            [U[0], U[1]],
            NodeLedger(NODE, exists=False),
            "no-entry",
            (),
            "the node has no allocation ledger",
            id="no-ledger",
        ),
        pytest.param(
            [U[0], U[1]],
            ledger((placed_pod("train-0", [U[0], U[1]], namespace="team-a", uid="old"), U[:2])),
            "no-entry",
            (),
            f"has no entry for its UID uid-pod ({U[0]} is pod team-a/train-0's",
            id="an-entry-of-a-deleted-pod-of-that-name",
        ),
    ],
)
def test_confirm(
    annotated: list[str],
    book: NodeLedger,
    outcome: str,
    devices: tuple[str, ...],
    reason: str,
) -> None:
    pod = parse_node_pod(
        placed_pod("train-0", annotated, namespace="team-a", uid="uid-pod"),
    )
    got = confirm(pod, book)
    assert (got.outcome, got.devices) == (outcome, devices)
    assert reason in got.reason
    assert got.confirmed == (outcome == "confirmed")
    assert got.may_catch_up == (outcome == "no-entry")
    if not got.confirmed:
        assert f"its {contract.ANN_DEVICES} names {','.join(annotated)}" in got.reason


def test_a_malformed_ledger_is_refused_as_a_whole() -> None:
    obj = gpu_allocation(NODE, [ledger_entry(POD), {"podUID": "x", "devices": []}])
    with pytest.raises(InvalidInput, match="needs podUID, namespace and name"):
        parse_node_ledger(obj)
