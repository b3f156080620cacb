"""The admission policy comes from the annotation rules: the chart's template is what
common.admissionpolicy writes now, and the rules agree with the filter on what they accept.
(The real API server judges the policy in tests/apiserver/test_admission_policy.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from common import admissionpolicy, contract
from common.annotationrules import RULES, annotation_problems, loose

TEMPLATE = (
    Path(__file__).resolve().parents[2]
    / "manifests/charts/tidelease/templates/pod-annotation-policy.yaml"
)


def test_the_chart_template_is_generated_from_the_rules() -> None:
    assert TEMPLATE.read_text() == admissionpolicy.chart_template(), (
        "regenerate: python -m common.admissionpolicy > " + str(TEMPLATE.relative_to(Path.cwd()))
    )


def test_every_pod_author_annotation_the_filter_reads_has_a_rule() -> None:
    keys = {r.key for r in RULES}
    assert keys == {
        contract.ANN_PRIORITY,
        contract.ANN_RELIABILITY,
        contract.ANN_RECLAIM,
        contract.ANN_JOB_CLASS,
        contract.ANN_ELASTIC,
        contract.ANN_THROUGHPUT,
        contract.ANN_OWNER,
        contract.ANN_GPU_TYPE,
        contract.ANN_CHECKPOINT,
        contract.ANN_WORKLOAD,
        contract.ANN_MAX_REPLICAS,
    }


@pytest.mark.parametrize(
    ("text", "want"),
    [(" Batch\t", "batch"), ("\u3000INTERACTIVE\u2029", "interactive"), ("\x1cx", "\x1cx")],
)
def test_loose_trims_unicode_white_space_and_lowers_ascii_only(text: str, want: str) -> None:
    assert loose(text) == want


def test_a_cel_string_survives_quotes_and_backslashes() -> None:
    assert admissionpolicy.cel_string('a "b" \\c\n') == '"a \\"b\\" \\\\c\\n"'


def test_problems_come_in_rule_order_and_the_reclaim_rule_last() -> None:
    got = annotation_problems(
        {contract.ANN_RECLAIM: "true", contract.ANN_OWNER: "X", contract.ANN_PRIORITY: "y"}
    )
    assert [p.split(":")[0] for p in got] == [
        f"annotation {contract.ANN_PRIORITY}",
        f"annotation {contract.ANN_OWNER}",
        f"annotation {contract.ANN_RECLAIM}",
    ]
