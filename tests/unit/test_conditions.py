"""Conditions keep the time their status last changed, and each other."""

from __future__ import annotations

from common.conditions import set_condition
from common.timefmt import rfc3339


def test_a_condition_changes_its_transition_time_only_with_its_status() -> None:
    one = set_condition(None, "Ready", "True", "Fine", "all good", 100, observed_generation=3)
    assert one == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Fine",
            "message": "all good",
            "lastTransitionTime": rfc3339(100),
            "observedGeneration": 3,
        }
    ]
    same = set_condition(one, "Ready", "True", "Fine", "still good", 200)
    assert same[0]["lastTransitionTime"] == rfc3339(100)
    assert same[0]["message"] == "still good"
    changed = set_condition(same, "Ready", "False", "Broken", "no", 300)
    assert changed[0]["lastTransitionTime"] == rfc3339(300)


def test_other_conditions_are_kept_in_place() -> None:
    both = set_condition(set_condition(None, "A", "True", "R", "", 1), "B", "False", "R", "", 2)
    again = set_condition(both, "A", "False", "R", "", 3)
    assert [(c["type"], c["status"]) for c in again] == [("A", "False"), ("B", "False")]
