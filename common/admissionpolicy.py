"""The pod-annotation rules (:mod:`common.annotationrules`) as a ValidatingAdmissionPolicy. Pure.

The API server refuses a pod whose tidelease annotations are invalid when it is created, with
the message the extender's filter would give (the filter keeps its check, for clusters without
the policy). The CEL is generated from the rules, never written by hand:

    python -m common.admissionpolicy \
        > manifests/charts/tidelease/templates/pod-annotation-policy.yaml

and a test fails while the chart's copy differs from what this module writes. Another test has
the real API server judge a table of values and compares its messages with the filter's.

Only creations are checked: a pod's annotations rarely change after, tidelease itself writes
annotations on running pods, and the filter still reports what an update broke.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from common import contract
from common.annotationrules import RECLAIM_NEEDS, RULES, Choice, Pattern, Rule, rule_of

POLICY_NAME = "tidelease-pod-annotations"
_ANN = "variables.annotations"
# Used by the API server only when a message would hold a line break (a value with one).
FALLBACK_MESSAGE = (
    "invalid tidelease.io annotations (the pod-author contract: docs/reference.md); a value "
    "holds a line break"
)


def cel_string(text: str) -> str:
    """``text`` as a CEL string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _accepts(rule: Rule, value: str) -> str:
    """CEL that is true when the value (a CEL expression) passes ``rule``."""
    if isinstance(rule, Choice):
        subject = f"{value}.trim().lowerAscii()" if rule.loose else value
        return f"{subject} in [{', '.join(cel_string(v) for v in rule.values)}]"
    assert isinstance(rule, Pattern)
    return f"{value}.matches({cel_string(f'^(?:{rule.regex})$')})"


def _problem(rule: Rule, value: str) -> str:
    """CEL for :func:`common.annotationrules.problem`'s message."""
    before, after = rule.says()
    head = cel_string(f"annotation {rule.key}: {before}'")
    tail = cel_string("'" + after)
    return f"{head} + {value} + {tail}"


def _check(rule: Rule) -> str:
    value = f"{_ANN}[{cel_string(rule.key)}]"
    present = f"{cel_string(rule.key)} in {_ANN}"
    return f"{present} && !({_accepts(rule, value)}) ? [{_problem(rule, value)}] : []"


def _reclaim_check() -> str:
    def ann(key: str) -> str:
        return f"{_ANN}[{cel_string(key)}]"

    owner = contract.ANN_OWNER
    allowed = (
        f"{_ANN}{_optional(contract.ANN_PRIORITY)}.orValue('') == 'high' && "
        f"{cel_string(owner)} in {_ANN} && {_accepts(rule_of(owner), ann(owner))}"
    )
    return (
        f"{_ANN}{_optional(contract.ANN_RECLAIM)}.orValue('') == 'true' && !({allowed})"
        f" ? [{cel_string(RECLAIM_NEEDS)}] : []"
    )


def _optional(key: str) -> str:
    """CEL's optional index: the annotation, or none."""
    return f"[?{cel_string(key)}]"


def policy_spec() -> dict[str, Any]:
    """The policy's spec: one variable per rule (a list of its problem, or empty), their sum,
    and one validation that it is empty, its message the problems joined as the filter joins
    them."""
    checks = [(f"rule{i}", _check(rule)) for i, rule in enumerate(RULES)]
    checks.append(("reclaim", _reclaim_check()))
    keys = ", ".join(cel_string(r.key) for r in RULES)
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                }
            ]
        },
        "matchConditions": [
            {
                "name": "has-tidelease-annotations",
                "expression": (
                    "has(object.metadata.annotations) && "
                    f"object.metadata.annotations.exists(k, k in [{keys}])"
                ),
            }
        ],
        "variables": [
            {"name": "annotations", "expression": "object.metadata.?annotations.orValue({})"},
            *({"name": name, "expression": expr} for name, expr in checks),
            {
                "name": "problems",
                "expression": " + ".join(f"variables.{name}" for name, _ in checks),
            },
        ],
        "validations": [
            {
                "expression": "size(variables.problems) == 0",
                "messageExpression": 'variables.problems.join("; ")',
                "message": FALLBACK_MESSAGE,
                "reason": "Invalid",
            }
        ],
    }


def binding_spec() -> dict[str, Any]:
    return {"policyName": POLICY_NAME, "validationActions": ["Deny"]}


def objects() -> list[dict[str, Any]]:
    """The policy and its binding, as applied to a cluster."""
    meta = {"name": POLICY_NAME}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": meta,
            "spec": policy_spec(),
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": meta,
            "spec": binding_spec(),
        },
    ]


def _block(obj: dict[str, Any], indent: int) -> str:
    text = yaml.safe_dump(obj, sort_keys=False, width=1_000_000, allow_unicode=False)
    pad = " " * indent
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def chart_template() -> str:
    """The chart's template of the policy and its binding (``admissionPolicy.enabled``)."""
    labels = '{{- include "tidelease.labels" (dict "ctx" $ "component" "admission") | nindent 4 }}'
    parts = []
    for kind, spec in (
        ("ValidatingAdmissionPolicy", policy_spec()),
        ("ValidatingAdmissionPolicyBinding", binding_spec()),
    ):
        parts.append(
            "apiVersion: admissionregistration.k8s.io/v1\n"
            f"kind: {kind}\n"
            "metadata:\n"
            f"  name: {POLICY_NAME}\n"
            f"  labels: {labels}\n"
            "spec:\n" + _block(spec, 2)
        )
    body = "---\n".join(parts)
    if "{{" in _block(policy_spec(), 0):
        raise AssertionError("the generated CEL would be read as a Helm template")
    return (
        "{{- /* Generated by `python -m common.admissionpolicy` from common/annotationrules.py:"
        " do not edit. */}}\n"
        # On unless set off: `helm upgrade --reuse-values` from a release before this value.
        '{{- if dig "enabled" true (.Values.admissionPolicy | default dict) }}\n'
        "# Pods with invalid tidelease.io annotations are refused at creation, with the "
        "message the\n# extender's filter gives (docs/reference.md).\n"
        f"{body}"
        "{{- end }}\n"
    )


if __name__ == "__main__":
    sys.stdout.write(chart_template())
