"""The DeviceClasses come from common.deviceattributes: the chart's template is what it writes now,
each class's CEL asks what its rule says, and the chart's values switch them (off by default).

The CEL itself is evaluated by the real kube-scheduler in tests/e2e/test_dra.py, which checks
which devices each class selects."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from common import deviceattributes
from common.model import Tier

CHART = Path(__file__).resolve().parents[2] / "manifests/charts/tidelease"
TEMPLATE = CHART / "templates/dra-deviceclasses.yaml"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
BY_NAME = {rule.name: rule for rule in deviceattributes.CLASSES}


def test_the_chart_template_is_generated_from_the_classes() -> None:
    assert TEMPLATE.read_text() == deviceattributes.chart_template(), (
        "regenerate: python -m common.deviceattributes > "
        + str(TEMPLATE.relative_to(CHART.parents[1]))
    )


def test_the_template_holds_the_classes_behind_the_dra_switch() -> None:
    """Without its Helm lines (the guard, the labels' include), the template is the classes."""
    lines = TEMPLATE.read_text().splitlines()
    assert lines[1] == '{{- if dig "enabled" false (.Values.dra | default dict) }}'
    assert lines[-1] == "{{- end }}"
    plain = "\n".join(
        line for line in lines if "{{" not in line or line.lstrip().startswith("expression")
    )
    docs = [d for d in yaml.safe_load_all(plain) if d]
    assert docs == deviceattributes.device_classes()


def test_the_classes_and_their_names() -> None:
    classes = deviceattributes.device_classes()
    assert [c["metadata"]["name"] for c in classes] == [
        "tidelease-ha",
        "tidelease-ma",
        "tidelease-la",
        "tidelease-borrow",
    ]
    for obj in classes:
        assert obj["apiVersion"] == "resource.k8s.io/v1"
        assert obj["kind"] == "DeviceClass"
        assert DNS_SUBDOMAIN.match(obj["metadata"]["name"])
        ((selector,),) = [obj["spec"]["selectors"]]
        assert set(selector) == {"cel"}
        assert len(selector["cel"]["expression"]) <= 10 * 1024


@pytest.mark.parametrize(
    ("name", "rank", "lent_too"),
    [
        ("tidelease-ha", 3, False),
        ("tidelease-ma", 2, False),
        ("tidelease-la", 1, False),
        ("tidelease-borrow", 1, True),
    ],
    ids=["ha", "ma", "la", "borrow"],
)
def test_each_selector_asks_for_the_driver_a_tier_and_no_standby(
    name: str, rank: int, lent_too: bool
) -> None:
    rule = BY_NAME[name]
    assert int(rule.min_tier) == rank
    assert rule.lent_too is lent_too
    want = (
        'device.driver == "gpu.tidelease.io" && '
        'cel.bind(t, device.attributes["tidelease.io"], '
        f"has(t.tierRank) && t.tierRank >= {rank} && "
        + (
            "(!has(t.reclaiming) || !t.reclaiming) && "
            if lent_too
            else 'has(t.lentBy) && t.lentBy == "" && '
        )
        + "has(t.standby) && !t.standby)"
    )
    assert deviceattributes.selector(rule) == want


def test_the_tiers_the_classes_ask_for_are_the_tiers_devices_publish() -> None:
    assert sorted(int(r.min_tier) for r in deviceattributes.CLASSES if not r.lent_too) == sorted(
        int(t) for t in Tier
    )
    assert {t.name: int(t) for t in Tier} == {"HA": 3, "MA": 2, "LA": 1}


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def test_the_classes_are_off_by_default_and_the_schema_knows_the_switch() -> None:
    values = _values()
    assert values["dra"] == {"enabled": False}
    schema = _schema()
    # The schema names draft-07 (as Helm reads it), whose URL the library does not know.
    validator = jsonschema.Draft7Validator(schema)
    validator.validate(values)
    assert schema["properties"]["dra"]["properties"]["enabled"]["description"]
    validator.validate({**values, "dra": {"enabled": True}})
    for bad in ({"enabled": "yes"}, {"enabled": True, "classes": []}):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate({**values, "dra": bad})
