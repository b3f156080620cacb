"""The chart's ValidatingAdmissionPolicies, written from the rules they enforce. Pure.

Three policies, all under the chart's ``admissionPolicy.enabled``, each with a binding that
denies:

* ``tidelease-pod-annotations``: the pod-annotation rules (:mod:`common.annotationrules`). The
  API server refuses a pod whose tidelease annotations are invalid, with the message the
  extender's filter would give (the filter keeps its check, for clusters without the policy):
  at creation, and on an update that sets or changes one of them (other updates of a pod whose
  annotations were valid under older rules still pass).
* ``tidelease-online-jobs``: privileges come from the admin (:mod:`common.tenancy`). In a
  namespace without the label ``tidelease.io/online: "true"``, a pod with
  ``tidelease.io/priority: high`` or the online PriorityClass, and a GpuLease, are refused,
  with :func:`common.tenancy.online_refusal`'s message, the one the extender gives.
* ``tidelease-written-annotations``: what tidelease writes on pods (:data:`WRITTEN_BY_TIDELEASE`)
  is set, changed or removed only by tidelease's own ServiceAccounts, never at a pod's
  creation; the queues' scheduling gate is removed only by the controllers' (the queues
  controller).

The CEL is generated, never written by hand:

    python -m common.admissionpolicy

writes the chart's templates (:data:`TEMPLATES`), and a test fails while the chart's copies
differ from what this module writes. Other tests have the real API server judge the policies:
a table of annotation values against the filter's messages, and a tenant's attempts at each
privilege.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from common import contract, tenancy
from common.annotationrules import RULES, Choice, Pattern, Rule

POLICY_NAME: Final = "tidelease-pod-annotations"
ONLINE_POLICY_NAME: Final = "tidelease-online-jobs"
WRITTEN_POLICY_NAME: Final = "tidelease-written-annotations"
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


def _new_or_changed(key: str) -> str:
    """CEL that is true when the annotation ``key`` (a CEL expression) of ``object`` is new:
    the request creates the object, or the old one lacks it or has another value."""
    old = "oldObject.metadata.?annotations.orValue({})"
    return (
        f'(request.operation != "UPDATE" || !({key} in {old}) || '
        f"{old}[{key}] != object.metadata.annotations[{key}])"
    )


def _pods(*resources: str) -> dict[str, Any]:
    """The resource rule of pods (and ``resources`` of them) at creation and update."""
    return {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": list(resources),
    }


def policy_spec() -> dict[str, Any]:
    """The policy's spec: one variable per rule (a list of its problem, or empty), their sum,
    and one validation that it is empty, its message the problems joined as the filter joins
    them."""
    checks = [(f"rule{i}", _check(rule)) for i, rule in enumerate(RULES)]
    keys = ", ".join(cel_string(r.key) for r in RULES)
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                _pods("pods"),
            ]
        },
        "matchConditions": [
            {
                # Set at creation, or set or changed by an update.
                "name": "sets-tidelease-annotations",
                "expression": (
                    "has(object.metadata.annotations) && "
                    f"object.metadata.annotations.exists(k, k in [{keys}] && "
                    f"{_new_or_changed('k')})"
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


# --- privileges come from the admin (common.tenancy) ---

# What a namespace without the grant may not have: the words of tenancy.online_refusal.
WHAT_PRIORITY: Final = f"{contract.ANN_PRIORITY}: high"
WHAT_LEASE: Final = f"a {contract.KIND_GPU_LEASE}"


def what_class(name: str) -> str:
    return f"priorityClassName {name}"


def _message(text: str, holes: Mapping[str, str]) -> str:
    """CEL that builds ``text``, each hole in it (a marker) replaced by its CEL expression."""
    parts = re.split("(" + "|".join(re.escape(h) for h in holes) + ")", text)
    return " + ".join(holes[p] if p in holes else cel_string(p) for p in parts if p)


def _annotation(obj: str, key: str) -> str:
    """CEL: the annotation ``key`` of ``obj`` (a CEL expression), or ''."""
    return f"{obj}.metadata.?annotations[?{cel_string(key)}].orValue('')"


def online_policy_spec(online_class: str = tenancy.DEFAULT_ONLINE_PRIORITY_CLASS) -> dict[str, Any]:
    """Refuses what needs the admin's grant in a namespace without it: on a pod, priority high
    or the PriorityClass ``online_class`` (at creation, or when an update sets it); a GpuLease
    (created, or its spec, labels or annotations changed: a finalizer's removal still passes)."""
    update = 'request.operation == "UPDATE"'
    # Pod-only fields through dyn(): the policy's CEL is type-checked against GpuLeases too.
    pod_class = "dyn({}).spec.?priorityClassName.orValue('')"
    cls = cel_string(online_class)
    lease_changed = " || ".join(
        f"object.{f}.orValue({{}}) != oldObject.{f}.orValue({{}})"
        for f in ("?spec", "metadata.?labels", "metadata.?annotations")
    )
    pod = "request.resource.resource == 'pods'"
    asks = {
        "priorityHigh": (
            f"{pod} && {_annotation('object', contract.ANN_PRIORITY)} == 'high'"
            f" && !({update} && {_annotation('oldObject', contract.ANN_PRIORITY)} == 'high')"
        ),
        "onlineClass": (
            f"{pod} && {pod_class.format('object')} == {cls}"
            f" && !({update} && {pod_class.format('oldObject')} == {cls})"
        ),
        "lease": f"!({pod}) && !({update} && !({lease_changed}))",
    }
    # The label, in a validation: match conditions are not given namespaceObject.
    granted = (
        f"namespaceObject.metadata.?labels.orValue({{}})"
        f"[?{cel_string(tenancy.LABEL_ONLINE)}].orValue('') == "
        f"{cel_string(tenancy.ONLINE_VALUE)}"
    )
    ns, what = "\0namespace\0", "\0what\0"
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                _pods("pods"),
                {
                    "apiGroups": [contract.GROUP],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [contract.PLURAL_GPU_LEASE],
                },
            ]
        },
        "matchConditions": [
            {"name": "asks-for-online", "expression": " || ".join(f"({e})" for e in asks.values())}
        ],
        "variables": [
            *({"name": name, "expression": e} for name, e in asks.items()),
            {
                "name": "what",
                "expression": (
                    f"variables.priorityHigh ? {cel_string(WHAT_PRIORITY)} : "
                    f"variables.onlineClass ? {cel_string(what_class(online_class))} : "
                    f"variables.lease ? {cel_string(WHAT_LEASE)} : ''"
                ),
            },
        ],
        "validations": [
            {
                "expression": granted,
                "messageExpression": _message(
                    tenancy.online_refusal(ns, what),
                    {ns: "request.namespace", what: "variables.what"},
                ),
                "reason": "Invalid",
            }
        ],
    }


# --- what tidelease writes on pods ---

# The chart's ServiceAccounts (templates/*-rbac.yaml, controllers.yaml, orchestrator.yaml).
EXTENDER_ACCOUNT: Final = "tidelease-extender"
CONTROLLERS_ACCOUNT: Final = "tidelease-controllers"  # the queues controller among them
AGENT_ACCOUNT: Final = "tidelease-agent"  # the device plugin, hot restart on the node
ORCHESTRATOR_ACCOUNT: Final = "tidelease-orchestrator"
ACCOUNTS: Final = (EXTENDER_ACCOUNT, CONTROLLERS_ACCOUNT, AGENT_ACCOUNT, ORCHESTRATOR_ACCOUNT)

# Pod annotations tidelease writes on running pods, and its components trust.
WRITTEN_BY_TIDELEASE: Final = (
    contract.ANN_DEVICES,
    contract.ANN_DEVICE_NODE,
    contract.ANN_DEVICES_ASSIGNED,
    contract.ANN_RECLAIM_NOTICE,
    contract.ANN_QUEUE,
    contract.ANN_QUEUE_REASON,
    contract.ANN_QUEUE_RELEASED,
    contract.ANN_HOT_RESTART_REQUEST,
    contract.ANN_HOT_RESTART_STATUS,
    contract.ANN_ORCHESTRATION_RECORDS,
)


def service_account(namespace: str, name: str) -> str:
    """The user name the API server gives the ServiceAccount's tokens."""
    return f"system:serviceaccount:{namespace}:{name}"


def written_refusal(key: str, user: str) -> str:
    """Why ``user`` may not set, change or remove the annotation ``key`` on a pod."""
    return (
        f"annotation {key} is written by tidelease only (its own ServiceAccounts, on pods "
        f"already created): {user} may not set, change or remove it"
    )


# The scheduling gates only tidelease's controllers lift: the queues' (the queues release the
# pod) and DRA mode's reclaim gate (the leasing controller pinned the returning replica's claim).
CONTROLLER_GATES: Final = (contract.SCHEDULING_GATE, contract.RECLAIM_GATE)


def gate_refusal(user: str) -> str:
    """Why ``user`` may not remove one of :data:`CONTROLLER_GATES`."""
    return (
        f"the scheduling gates {' and '.join(CONTROLLER_GATES)} are removed by tidelease's "
        "controllers only (when the shared queues release the pod, when a returning replica's "
        f"claim is pinned): {user} may not remove them"
    )


def written_policy_spec(
    namespace: str = contract.DEFAULT_AGENT_NAMESPACE, trusted: str = "[]"
) -> dict[str, Any]:
    """Refuses a pod created with an annotation of :data:`WRITTEN_BY_TIDELEASE`, an update
    that sets, changes or removes one by anyone but the ServiceAccounts of tidelease (installed
    in ``namespace``), and the removal of the queues' gate by anyone but the controllers'.
    ``trusted``: a CEL list of further user names that run tidelease's components (the chart's
    ``admissionPolicy.trustedUsers``: components run outside the cluster under other
    identities). pods/status is matched too: its updates may change annotations."""
    keys = ", ".join(cel_string(k) for k in WRITTEN_BY_TIDELEASE)
    new = "object.metadata.?annotations.orValue({})"
    old = "(oldObject == null ? {} : oldObject.metadata.?annotations.orValue({}))"
    # Present on one side only, or with two values.
    changed = (
        f"[{keys}].filter(k, (k in {new}) != (k in {old}) || "
        f"{new}[?k].orValue('') != {old}[?k].orValue(''))"
    )
    gates = "[" + ", ".join(cel_string(g) for g in CONTROLLER_GATES) + "]"
    ungated = (
        'request.operation == "UPDATE" && '
        f"oldObject.spec.?schedulingGates.orValue([]).exists(g, g.name in {gates} && "
        "!object.spec.?schedulingGates.orValue([]).exists(h, h.name == g.name))"
    )
    accounts = ", ".join(cel_string(service_account(namespace, a)) for a in ACCOUNTS)
    queues = cel_string(service_account(namespace, CONTROLLERS_ACCOUNT))
    key, user = "\0key\0", "\0user\0"
    holes = {key: "variables.refused", user: "request.userInfo.username"}
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                _pods("pods", "pods/status"),
            ]
        },
        "matchConditions": [
            # Only what touches them: the kubelet's and the garbage collector's updates pass.
            {
                "name": "touches-what-tidelease-writes",
                "expression": f"size({changed}) > 0 || {ungated}",
            }
        ],
        "variables": [
            {"name": "changed", "expression": changed},
            {
                "name": "refused",
                "expression": (
                    'size(variables.changed) > 0 && !(request.operation == "UPDATE" && '
                    f"request.userInfo.username in [{accounts}] + {trusted}) "
                    "? variables.changed[0] : ''"
                ),
            },
            {
                "name": "ungated",
                "expression": (
                    f"{ungated} && !(request.userInfo.username in [{queues}] + {trusted})"
                ),
            },
        ],
        "validations": [
            {
                "expression": "variables.refused == '' && !variables.ungated",
                "messageExpression": (
                    f"variables.refused != '' ? {_message(written_refusal(key, user), holes)}"
                    f" : {_message(gate_refusal(user), holes)}"
                ),
                "reason": "Forbidden",
            }
        ],
    }


# --- the objects and the chart's templates ---


def binding_spec(name: str = POLICY_NAME) -> dict[str, Any]:
    return {"policyName": name, "validationActions": ["Deny"]}


def _policies(
    namespace: str, online_class: str, trusted: str = "[]"
) -> list[tuple[str, dict[str, Any]]]:
    return [
        (POLICY_NAME, policy_spec()),
        (ONLINE_POLICY_NAME, online_policy_spec(online_class)),
        (WRITTEN_POLICY_NAME, written_policy_spec(namespace, trusted)),
    ]


def objects(
    namespace: str = contract.DEFAULT_AGENT_NAMESPACE,
    online_class: str = tenancy.DEFAULT_ONLINE_PRIORITY_CLASS,
    trusted_users: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Each policy and its binding, as applied to a cluster by the chart installed in
    ``namespace`` with the online PriorityClass ``online_class`` (and
    ``admissionPolicy.trustedUsers``)."""
    out = []
    trusted = "[" + ",".join(cel_string(u) for u in trusted_users) + "]"  # as Helm's toJson
    for name, spec in _policies(namespace, online_class, trusted):
        for kind, body in (
            ("ValidatingAdmissionPolicy", spec),
            ("ValidatingAdmissionPolicyBinding", binding_spec(name)),
        ):
            out.append(
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": kind,
                    "metadata": {"name": name},
                    "spec": body,
                }
            )
    return out


def _block(obj: dict[str, Any], indent: int) -> str:
    text = yaml.safe_dump(obj, sort_keys=False, width=1_000_000, allow_unicode=False)
    pad = " " * indent
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


# Stand-ins for the release's values while the CEL is written, then made Helm's: names no
# namespace or PriorityClass is given by chance, and that YAML writes unquoted.
_RELEASE_NAMESPACE = "tidelease-release-namespace-placeholder"
_ONLINE_CLASS = "tidelease-online-class-placeholder"
_TRUSTED = "tidelease_trusted_users_placeholder"
_HELM = {
    _RELEASE_NAMESPACE: "{{ .Release.Namespace }}",
    _ONLINE_CLASS: "{{ $onlineClass }}",
    _TRUSTED: '{{ dig "trustedUsers" list (.Values.admissionPolicy | default dict) | toJson }}',
}


def _template(names: tuple[str, ...], comment: str) -> str:
    """The chart's template of the named policies and their bindings."""
    labels = '{{- include "tidelease.labels" (dict "ctx" $ "component" "admission") | nindent 4 }}'
    parts = []
    for name, spec in _policies(_RELEASE_NAMESPACE, _ONLINE_CLASS, _TRUSTED):
        if name not in names:
            continue
        if "{{" in _block(spec, 0):
            raise AssertionError("the generated CEL would be read as a Helm template")
        for kind, content in (
            ("ValidatingAdmissionPolicy", spec),
            ("ValidatingAdmissionPolicyBinding", binding_spec(name)),
        ):
            parts.append(
                "apiVersion: admissionregistration.k8s.io/v1\n"
                f"kind: {kind}\n"
                "metadata:\n"
                f"  name: {name}\n"
                f"  labels: {labels}\n"
                "spec:\n" + _block(content, 2)
            )
    body = "---\n".join(parts)
    for placeholder, helm in _HELM.items():
        body = body.replace(placeholder, helm)
    online_class = (
        '{{- $onlineClass := dig "online" "name" '
        f"{cel_string(tenancy.DEFAULT_ONLINE_PRIORITY_CLASS)} "
        "(.Values.priorityClasses | default dict) }}\n"
        if "$onlineClass" in body
        else ""
    )
    return (
        "{{- /* Generated by `python -m common.admissionpolicy`: do not edit. */}}\n"
        # On unless set off: `helm upgrade --reuse-values` from a release before this value.
        '{{- if dig "enabled" true (.Values.admissionPolicy | default dict) }}\n'
        f"{online_class}"
        f"{comment}"
        f"{body}"
        "{{- end }}\n"
    )


def chart_template() -> str:
    """The template of the pod-annotation policy (``admissionPolicy.enabled``)."""
    return _template(
        (POLICY_NAME,),
        "# Pods with invalid tidelease.io annotations are refused at creation, and updates that "
        "set\n# or change one, with the message the extender's filter gives "
        "(docs/reference.md).\n",
    )


def tenancy_template() -> str:
    """The template of the tenancy policies (``admissionPolicy.enabled``)."""
    return _template(
        (ONLINE_POLICY_NAME, WRITTEN_POLICY_NAME),
        "# Privileges come from the admin (docs/tenancy.md): online jobs only in namespaces "
        "labelled\n# tidelease.io/online=true, and what tidelease writes on pods only by "
        "tidelease's ServiceAccounts.\n",
    )


CHART_TEMPLATES: Final = (
    Path(__file__).resolve().parents[1] / "manifests/charts/tidelease/templates"
)
# Each generated template of the chart, by its file name there.
TEMPLATES: Final[Mapping[str, Callable[[], str]]] = {
    "pod-annotation-policy.yaml": chart_template,
    "tenancy-policies.yaml": tenancy_template,
}


if __name__ == "__main__":
    for file, write in TEMPLATES.items():
        (CHART_TEMPLATES / file).write_text(write())
        sys.stdout.write(f"wrote {CHART_TEMPLATES / file}\n")
