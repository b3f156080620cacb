"""Tenant-supplied PromQL scoped to the tenant's own namespace. Pure.

Tenants write PromQL that tidelease's controllers run against the cluster's Prometheus: a pod's
``tidelease.io/throughput-query`` (the queues' ramp-up profiler) and a GpuLease's
``tidelease.io/planner-*-query`` annotations (the live planner). Run as written, such a query
could read any other tenant's series. :func:`scope_query` rewrites it so that every vector and
matrix selector carries the matcher ``namespace="<the object's namespace>"`` (the label is a
setting): wherever it stands, in a function's argument, an aggregation, either side of a binary
operator, a subquery, with ``offset`` or ``@``. What cannot be scoped is refused
(:class:`~common.errors.InvalidInput`, a message for the query's author):

* a query the parser cannot read (or a function it does not know);
* a selector that already matches the label otherwise than ``="<namespace>"``: another
  namespace, ``!=``, ``=~`` or ``!~`` (even a regex that would match the namespace: a query
  reads its own namespace, by name);
* ``or`` between a selector's matchers (each alternative would need the matcher);
* ``info()``, which reads ``target_info`` series of its own choosing;
* a subquery without a resolution step (``[1h:]``), and anything else the rewrite could not
  print back with the same meaning.

The parser is the ``promql-parser`` package (a port of Prometheus 2.45's). It parses, walks and
rebuilds the syntax tree and prints it back; its printer writes label values and strings as
they are, unescaped, so the rewrite gives it nodes whose values hold the escaped text. Every
rewrite is then proven before it is returned: the printed query, parsed again, must be the
tree meant (the original with the matcher added, node for node), and every selector in it must
carry the matcher and no other on the label. A query that fails the proof is refused, never
run altered.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import promql_parser as pp

from common.errors import InvalidInput

DEFAULT_LABEL: Final = "namespace"
# Prometheus label names; "__"-prefixed ones are reserved (__name__ is the metric's name).
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Functions that read series other than their arguments' selectors.
UNSCOPABLE_FUNCTIONS: Final = frozenset({"info"})
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def valid_label(label: str) -> bool:
    """Whether ``label`` can name the scoping label: a label name, not a reserved one."""
    return _LABEL_NAME.fullmatch(label) is not None and not label.startswith("__")


def scope_query(query: str, namespace: str, label: str = DEFAULT_LABEL) -> str:
    """``query`` with ``label="<namespace>"`` on every vector and matrix selector; InvalidInput
    with the reason when it cannot be scoped (see the module's docstring)."""
    if not namespace:
        raise InvalidInput("no namespace to scope the query to")
    if not valid_label(label):
        raise InvalidInput(f"{label!r} cannot be the scoping label: want a label name")
    try:
        original = pp.parse(query)
    except (ValueError, RuntimeError) as e:
        raise InvalidInput(f"not PromQL tidelease can read: {e}") from e
    _check(original, namespace, label)
    # Two rewrites of one shape: `meant` holds the true values (the tree to run), `printable`
    # values escaped once more, so that the printer (which writes them as they are) writes
    # PromQL literals of the true values.
    meant = _rewrite(original, namespace, label, escapes=1)
    text = str(_rewrite(original, namespace, label, escapes=2))
    _prove(text, meant, namespace, label)
    return text


def _check(expr: pp.Expr, namespace: str, label: str) -> None:
    problems: list[str] = []

    def visit(node: pp.Expr) -> None:
        if isinstance(node, pp.VectorSelector):
            problems.extend(_selector_problems(node, namespace, label))
        elif isinstance(node, pp.Call) and node.func.name in UNSCOPABLE_FUNCTIONS:
            problems.append(
                f"{node.func.name}() reads series beyond its selectors, which tidelease "
                "cannot scope to the namespace"
            )
        elif isinstance(node, pp.SubqueryExpr) and node.step is None:
            problems.append(
                f"a subquery [{_duration(node)}:] has no resolution step: "
                "give it one (e.g. [1h:1m])"
            )

    pp.walk(expr, pre_visit=visit)
    if problems:
        raise InvalidInput(problems)


def _selector_problems(vs: pp.VectorSelector, namespace: str, label: str) -> list[str]:
    out = []
    if vs.matchers.or_matchers:
        out.append(f"selector {_short(vs)}: 'or' between matchers cannot be scoped")
    for m in vs.matchers.matchers:
        if m.name != label or (m.op == pp.MatchOp.Equal and m.value == namespace):
            continue
        out.append(
            f"selector {_short(vs)} matches {m.name}{_op(m.op)}{_quoted(m.value)}: a query "
            f'reads its own namespace only, {label}="{namespace}"'
        )
    return out


def _rewrite(expr: pp.Expr, namespace: str, label: str, *, escapes: int) -> pp.Expr:
    """The tree with the matcher on every selector, values escaped ``escapes - 1`` times (the
    selectors and strings rebuilt by parsing their printed form with values escaped
    ``escapes`` times: the one way this parser builds a node)."""

    def esc(value: str) -> str:
        for _ in range(escapes):
            value = _escaped(value)
        return value

    def visit(node: pp.Expr) -> pp.Expr | None:
        if isinstance(node, pp.VectorSelector):
            before = _facts(node)
            matchers = [m for m in node.matchers.matchers if m.name != label]
            matchers.append(pp.Matcher(pp.MatchOp.Equal, label, namespace))
            rebuilt = _reparsed(_selector_text(node, matchers, esc))
            if escapes == 1:  # the tree meant: exactly the original plus the matcher
                want = (*before[:3], tuple(m for m in before[3] if m[1] != label))
                if not isinstance(rebuilt, pp.VectorSelector):
                    raise _unfaithful(node)
                got = _facts(rebuilt)
                if got[:3] != want[:3] or got[3] != (*want[3], ("=", label, namespace)):
                    raise _unfaithful(node)
            return rebuilt
        if isinstance(node, pp.StringLiteral):
            rebuilt = _reparsed(f'"{esc(node.val)}"')
            if escapes == 1 and (
                not isinstance(rebuilt, pp.StringLiteral) or rebuilt.val != node.val
            ):
                raise _unfaithful(node)
            return rebuilt
        return None

    try:
        return pp.transform(expr, pre_visit=visit)
    except (ValueError, RuntimeError) as e:
        raise InvalidInput(f"the query cannot be rewritten with the same meaning: {e}") from e


def _selector_text(
    vs: pp.VectorSelector, matchers: list[pp.Matcher], esc: Callable[[str], str]
) -> str:
    vs.matchers = pp.Matchers([pp.Matcher(m.op, m.name, esc(m.value)) for m in matchers])
    return str(vs)  # name{matchers} and its @ and offset modifiers


def _reparsed(text: str) -> pp.Expr:
    try:
        return pp.parse(text)
    except (ValueError, RuntimeError) as e:
        raise InvalidInput(f"the query cannot be rewritten with the same meaning: {e}") from e


def _prove(text: str, meant: pp.Expr, namespace: str, label: str) -> None:
    """The printed query means the tree meant, and every selector in it is scoped."""
    try:
        printed = pp.parse(text)
    except (ValueError, RuntimeError) as e:
        raise InvalidInput(f"the query cannot be rewritten with the same meaning: {e}") from e
    if repr(printed) != repr(meant):
        raise InvalidInput(
            "the query cannot be rewritten with the same meaning (a construct tidelease's "
            "PromQL printer does not keep, e.g. a duration under a second): simplify it"
        )
    unscoped: list[str] = []

    def visit(node: pp.Expr) -> None:
        if isinstance(node, pp.VectorSelector):
            own = [m for m in node.matchers.matchers if m.name == label]
            if node.matchers.or_matchers or [(m.op, m.value) for m in own] != [
                (pp.MatchOp.Equal, namespace)
            ]:
                unscoped.append(_short(node))

    pp.walk(printed, pre_visit=visit)
    if unscoped:  # cannot happen when the printer is faithful; never run such a query
        raise InvalidInput(f"the query cannot be scoped: selector(s) {', '.join(unscoped)}")


Facts = tuple[str | None, object, object, tuple[tuple[str, str, str], ...]]


def _facts(vs: pp.VectorSelector) -> Facts:
    at = None if vs.at is None else (str(vs.at.type), vs.at.at)
    matchers = tuple((_op(m.op), m.name, m.value) for m in vs.matchers.matchers)
    return vs.name, vs.offset, at, matchers


def _duration(node: pp.SubqueryExpr) -> str:
    return "" if node.range is None else pp.display_duration(node.range)


def _unfaithful(node: pp.Expr) -> InvalidInput:
    return InvalidInput(
        f"the query cannot be rewritten with the same meaning at {_short(node)}: simplify it"
    )


# (op, text) pairs: MatchOp values are not hashable.
_OPS: Final = (
    (pp.MatchOp.Equal, "="),
    (pp.MatchOp.NotEqual, "!="),
    (pp.MatchOp.Re, "=~"),
    (pp.MatchOp.NotRe, "!~"),
)


def _op(op: pp.MatchOp) -> str:
    return next((text for o, text in _OPS if o == op), str(op))


def _escaped(value: str) -> str:
    """A double-quoted PromQL string's contents for ``value`` (Go's escapes)."""
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    out = out.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", out)


def _quoted(value: str) -> str:
    return f'"{_escaped(value)}"'


def _short(node: pp.Expr, limit: int = 80) -> str:
    text = str(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refusal(annotation: str, namespace: str, label: str, error: InvalidInput) -> str:
    """The one message the controllers give (Event and log) for a query they refuse."""
    return (
        f"{annotation} is not run: it must read only its own namespace's series "
        f'(tidelease adds {label}="{namespace}" to every selector) and cannot be scoped: {error}'
    )
