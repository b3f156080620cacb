"""A GpuLease's conditions: one per phase, True for the phase it is in, transition times kept."""

from __future__ import annotations

from common.model import GpuUuid
from common.timefmt import rfc3339
from extender.rightofreturn.lease import LeaseStatus, LentGroup, lease_conditions


def by_type(conditions: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {c["type"]: c for c in conditions}


def test_one_condition_per_phase_true_for_the_current_one() -> None:
    lent = (LentGroup("recsys-2", (GpuUuid("GPU-a"), GpuUuid("GPU-b"))),)
    lending = LeaseStatus(phase="Lending", target_replicas=2, groups=lent)
    got = by_type(lease_conditions(lending, None, 4, 100))
    assert {t: c["status"] for t, c in got.items()} == {
        "Steady": "False",
        "Lending": "True",
        "Reclaiming": "False",
        "Degraded": "False",
    }
    assert got["Lending"]["reason"] == "ScalingDown"
    assert got["Lending"]["message"] == "scaling down to 2 replica(s); 2 GPU(s) lent"
    assert got["Steady"]["reason"] == "Lending"
    assert all(c["observedGeneration"] == 4 for c in got.values())

    steady = by_type(lease_conditions(LeaseStatus(groups=lent), list(got.values()), 4, 200))
    assert steady["Steady"]["status"] == "True"
    assert steady["Steady"]["lastTransitionTime"] == rfc3339(200)
    # Reclaiming was False and stays False: its transition time is kept.
    assert steady["Reclaiming"]["lastTransitionTime"] == rfc3339(100)


def test_a_reclaim_names_its_groups_and_deadline() -> None:
    status = LeaseStatus(
        phase="Reclaiming", reclaiming=("recsys-2",), reclaim_started=0, reclaim_deadline=45
    )
    got = by_type(lease_conditions(status, "not a list", None, 10))
    assert got["Reclaiming"]["reason"] == "TakingBack"
    assert got["Reclaiming"]["message"].startswith("taking back recsys-2; borrowers' notice ends ")
    assert "observedGeneration" not in got["Reclaiming"]
