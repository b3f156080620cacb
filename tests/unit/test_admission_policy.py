"""The admission policies come from the rules they enforce: the chart's templates are what
common.admissionpolicy writes now, and the rules agree with the filter on what they accept.
(The real API server judges the policies in tests/apiserver/test_admission_policy.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from common import admissionpolicy, contract
from common.annotationrules import RULES, annotation_problems, loose

TEMPLATES = Path(__file__).resolve().parents[2] / "manifests/charts/tidelease/templates"


@pytest.mark.parametrize("file", sorted(admissionpolicy.TEMPLATES))
def test_the_chart_templates_are_generated_from_the_rules(file: str) -> None:
    assert (TEMPLATES / file).read_text() == admissionpolicy.TEMPLATES[file](), (
        "regenerate: python -m common.admissionpolicy"
    )


def test_every_pod_author_annotation_the_filter_reads_has_a_rule() -> None:
    keys = {r.key for r in RULES}
    assert keys == {
        contract.ANN_PRIORITY,
        contract.ANN_RELIABILITY,
        contract.ANN_RECLAIM,
        contract.ANN_JOB_CLASS,
        contract.ANN_ELASTIC,
        contract.ANN_LENT_ONLY,
        contract.ANN_GPU_TOPOLOGY,
        contract.ANN_THROUGHPUT,
        contract.ANN_OWNER,
        contract.ANN_GPU_TYPE,
        contract.ANN_CHECKPOINT,
        contract.ANN_WORKLOAD,
        contract.ANN_MAX_REPLICAS,
        contract.ANN_POD_GROUP,
        contract.ANN_CHECKPOINTED_AT,
    }


@pytest.mark.parametrize(
    ("text", "want"),
    [(" Batch\t", "batch"), ("\u3000INTERACTIVE\u2029", "interactive"), ("\x1cx", "\x1cx")],
)
def test_loose_trims_unicode_white_space_and_lowers_ascii_only(text: str, want: str) -> None:
    assert loose(text) == want


def test_a_cel_string_survives_quotes_and_backslashes() -> None:
    assert admissionpolicy.cel_string('a "b" \\c\n') == '"a \\"b\\" \\\\c\\n"'


def test_problems_come_in_rule_order() -> None:
    got = annotation_problems(
        {contract.ANN_RECLAIM: "maybe", contract.ANN_OWNER: "X", contract.ANN_PRIORITY: "y"}
    )
    assert [p.split(":")[0] for p in got] == [
        f"annotation {contract.ANN_PRIORITY}",
        f"annotation {contract.ANN_RECLAIM}",
        f"annotation {contract.ANN_OWNER}",
    ]


def test_reclaim_is_a_plain_true_or_false_that_needs_nothing_else() -> None:
    """tidelease derives reclaims (common.tenancy): the annotation grants nothing, so it no
    longer needs priority high and an owner."""
    assert annotation_problems({contract.ANN_RECLAIM: "true"}) == []


def test_every_annotation_tidelease_writes_on_pods_is_protected() -> None:
    """Each annotation common/contract.py lists as written by tidelease (its section, and those
    its comments say tidelease's components write) is protected, and no pod author's is."""
    import inspect

    source = inspect.getsource(contract)
    section = source.split("# --- pod annotations written by tidelease ---")[1].split("# ---")[0]
    listed = {getattr(contract, n) for n in re.findall(r"^(ANN_[A-Z_]+): Final", section, re.M)}
    by_components = {
        getattr(contract, name)
        for name, comment in re.findall(r"^(ANN_[A-Z_]+): Final = .*#(.*)$", source, re.M)
        if re.search(r"by the (operator|node agent|controller|queues controller)\b", comment)
        and name not in ("ANN_THROUGHPUT_MEASURED",)  # on workloads, not pods
    }
    assert listed, "the contract's section moved"
    assert listed | by_components <= set(admissionpolicy.WRITTEN_BY_TIDELEASE)
    # None of them is a pod author's.
    assert not set(admissionpolicy.WRITTEN_BY_TIDELEASE) & {r.key for r in RULES}


def test_the_chart_templates_use_the_releases_namespace_and_online_class() -> None:
    """The placeholders the CEL is written with become Helm's values, and nothing else does."""
    text = admissionpolicy.tenancy_template()
    assert "placeholder" not in text
    assert "system:serviceaccount:{{ .Release.Namespace }}:tidelease-controllers" in text
    assert '"priorityClassName {{ $onlineClass }}"' in text
