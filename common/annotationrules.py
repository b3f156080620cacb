"""The rules of the pod-author annotations, declared once. Pure.

Two checkers read this table: the extender's filter, in Python (:func:`annotation_problems`,
called by :func:`common.podrequest.parse_pod`), and the API server at admission, in CEL
(:mod:`common.admissionpolicy` turns the table into a ValidatingAdmissionPolicy). So a rule is
written in the subset both agree on: a whole value is one of some choices (after trimming
white space and lower-casing ASCII, where the rule says so), or it matches a regular
expression using only what Python's ``re`` and RE2 (CEL's ``matches``) read alike: character
classes with explicit ranges, ``(...)``, ``?``, ``{m,n}``, ``|``; no ``\\s``, ``\\d``, ``\\w``,
no anchors (the checkers anchor the whole value). A message quotes the value as written,
between single quotes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from common import contract
from common.topology import REQUIREMENTS

# Unicode's White_Space: what CEL's trim() removes (Go's unicode.IsSpace), so that Python's
# strip() with these characters trims the same.
WHITE_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def loose(value: str) -> str:
    """``value`` trimmed of white space and lower-cased in ASCII (CEL: trim().lowerAscii())."""
    return value.strip(WHITE_SPACE).translate(_ASCII_LOWER)


@dataclass(frozen=True, slots=True)
class Choice:
    """The annotation is one of ``values``; compared after :func:`loose` when ``loose``."""

    key: str
    values: tuple[str, ...]
    loose: bool = False

    def accepts(self, value: str) -> bool:
        return (loose(value) if self.loose else value) in self.values

    def says(self) -> tuple[str, str]:
        return "invalid value ", f" (want {' or '.join(sorted(self.values))})"


@dataclass(frozen=True, slots=True)
class Pattern:
    """The annotation matches ``regex`` as a whole; a problem reads ``before'VALUE'after``."""

    key: str
    regex: str
    before: str
    after: str

    def accepts(self, value: str) -> bool:
        return re.fullmatch(self.regex, value) is not None

    def says(self) -> tuple[str, str]:
        return self.before, self.after


Rule = Choice | Pattern

# samples/s: a non-negative decimal number, its exponent bounded so that it is finite.
_NUMBER = "[ ]*([0-9]{1,15}([.][0-9]{0,15})?|[.][0-9]{1,15})([eE][-+]?[0-9]{1,2})?[ ]*"

# In the order the filter reports them.
RULES: tuple[Rule, ...] = (
    Choice(contract.ANN_PRIORITY, ("high", "low")),
    Choice(contract.ANN_RELIABILITY, ("HA", "MA", "LA")),
    Choice(contract.ANN_RECLAIM, ("true", "false")),
    Choice(contract.ANN_JOB_CLASS, ("interactive", "batch"), loose=True),
    Choice(contract.ANN_ELASTIC, ("true", "false"), loose=True),
    Choice(contract.ANN_LENT_ONLY, ("true", "false")),
    Choice(contract.ANN_GPU_TOPOLOGY, tuple(REQUIREMENTS)),
    Pattern(
        contract.ANN_THROUGHPUT,
        f"{_NUMBER}(,{_NUMBER})*",
        "invalid value ",
        " (want samples/s at 1, 2, ... GPUs: non-negative numbers separated by commas)",
    ),
    Pattern(
        contract.ANN_OWNER,
        "[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?",
        "invalid job name ",
        " (want a DNS-1123 subdomain: lower-case letters, digits, '-' and '.')",
    ),
    Pattern(
        contract.ANN_GPU_TYPE,
        "[A-Za-z0-9][-A-Za-z0-9_.]{0,62}",
        "invalid GPU type ",
        " (want letters, digits, '-', '_' or '.', at most 63)",
    ),
    # An elastic batch job's workload and its ceiling (extender.queues.growth).
    Pattern(
        contract.ANN_WORKLOAD,
        "(Deployment|StatefulSet)/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?",
        "invalid value ",
        " (want Deployment/NAME or StatefulSet/NAME)",
    ),
    Pattern(
        contract.ANN_MAX_REPLICAS,
        "[1-9][0-9]{0,3}|10000",
        "invalid value ",
        " (want 1 to 10000)",
    ),
    # Gangs (common.gangs): a pod group of the pod's namespace, and its last checkpoint.
    Pattern(
        contract.ANN_POD_GROUP,
        "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
        "invalid pod group ",
        " (want a DNS label: lower-case letters, digits and '-', at most 63)",
    ),
    Pattern(
        contract.ANN_CHECKPOINTED_AT,
        "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
        "([.][0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])",
        "invalid time ",
        " (want RFC 3339, e.g. 2026-11-29T04:00:00Z)",
    ),
    # Empty means none. The id names the entry in the nodes' caches; the pin, when there is
    # one, is what a node checks the bytes against (common.checkpointref).
    Pattern(
        contract.ANN_CHECKPOINT,
        "([^@]+(@sha256:[0-9a-fA-F]{64})?)?",
        "",
        " is not ID or ID@sha256:<64 hex digits>",
    ),
)


def rule_of(key: str) -> Rule:
    return next(r for r in RULES if r.key == key)


def problem(rule: Rule, value: str) -> str:
    """What the checkers say of ``value``, which ``rule`` refused."""
    before, after = rule.says()
    return f"annotation {rule.key}: {before}'{value}'{after}"


def annotation_problems(annotations: Mapping[str, str]) -> list[str]:
    """Every problem with a pod's tidelease annotations, in :data:`RULES` order. (None grants
    anything: whether a pod may reclaim or run online is the admin's, common.tenancy.)"""
    return [
        problem(rule, annotations[rule.key])
        for rule in RULES
        if rule.key in annotations and not rule.accepts(annotations[rule.key])
    ]
