"""Tenant-supplied PromQL scoped to its namespace (common/queryscope.py): every vector and matrix
selector of the result, parsed again, carries exactly the namespace matcher, whatever the
query's shape; the result means the query asked (the same tree, the matcher added); what
cannot be scoped is refused with a reason."""

from __future__ import annotations

import promql_parser as pp
import pytest

from common.errors import InvalidInput
from common.queryscope import scope_query, valid_label

NS = "team-a"


def selectors(query: str) -> list[pp.VectorSelector]:
    out: list[pp.VectorSelector] = []

    def visit(node: pp.Expr) -> None:
        if isinstance(node, pp.VectorSelector):
            out.append(node)

    pp.walk(pp.parse(query), pre_visit=visit)
    return out


def matchers(vs: pp.VectorSelector) -> list[tuple[str, str, str]]:
    return [(str(m.op), m.name, m.value) for m in vs.matchers.matchers]


def unscoped(vs: pp.VectorSelector, label: str) -> list[tuple[str, str, str]]:
    """The selector's matchers but the scoping one: what the tenant wrote."""
    return [m for m in matchers(vs) if m[1] != label]


SCOPED = [
    pytest.param("foo", 1, id="bare-metric"),
    pytest.param("foo{}", 1, id="empty-braces"),
    pytest.param('{__name__="trainer_samples_total"}', 1, id="name-only-matcher"),
    pytest.param('{__name__=~"trainer_.+"}', 1, id="name-regex-only"),
    pytest.param('sum(rate(trainer_samples_total{job="resnet"}[1m]))', 1, id="sum-rate"),
    pytest.param('foo{job="a", mode!="idle", path=~"/api/.*", code!~"5.."}', 1, id="all-ops"),
    pytest.param('foo{namespace="team-a"}', 1, id="already-own-namespace"),
    pytest.param('foo{namespace="team-a", namespace="team-a"}', 1, id="own-namespace-twice"),
    pytest.param("rate(foo[5m] offset 1h)", 1, id="matrix-offset"),
    pytest.param("foo offset -5m", 1, id="negative-offset"),
    pytest.param("rate(foo[5m] @ 1700000000)", 1, id="matrix-at"),
    pytest.param("foo @ start() offset 1m", 1, id="at-start-offset"),
    pytest.param("foo @ end()", 1, id="at-end"),
    pytest.param("max_over_time(rate(foo[5m])[1h:1m])", 1, id="subquery"),
    pytest.param("max_over_time(rate(foo[5m])[1h:1m] offset 1d @ 100)", 1, id="subquery-mods"),
    pytest.param("avg_over_time(max_over_time(foo[10m:1m])[1h:5m])", 1, id="nested-subqueries"),
    pytest.param("sum by (pod) (rate(foo[5m])) / on (pod) group_left count(bar)", 2, id="group"),
    pytest.param("a * ignoring(x) group_right(y) b", 2, id="group-right"),
    pytest.param("a + b * c - (d / e)", 5, id="arithmetic"),
    pytest.param("-a ^ b", 2, id="unary-power"),
    pytest.param("a > bool 1", 1, id="bool-comparison"),
    pytest.param("a and on(x) b or c unless ignoring(y) d", 4, id="set-operators"),
    pytest.param("foo or vector(0)", 1, id="or-vector"),
    pytest.param('absent(nonexistent{job="x"})', 1, id="absent"),
    pytest.param("absent_over_time(foo[5m])", 1, id="absent-over-time"),
    pytest.param('label_replace(foo, "namespace", "team-b", "", "")', 1, id="label-replace"),
    pytest.param('label_join(foo, "namespace", ",", "a", "b")', 1, id="label-join"),
    pytest.param('count_values("namespace", foo)', 1, id="count-values"),
    pytest.param("topk(3, foo) + bottomk(2, bar)", 2, id="topk-bottomk"),
    pytest.param("quantile(0.9, foo)", 1, id="quantile"),
    pytest.param("histogram_quantile(0.9, sum by (le) (rate(h_bucket[5m])))", 1, id="histogram"),
    pytest.param("scalar(foo) * vector(2)", 1, id="scalar-vector"),
    pytest.param("clamp_max(predict_linear(foo[1h], 3600), 1e3)", 1, id="function-chain"),
    pytest.param("time() - timestamp(foo)", 1, id="time-timestamp"),
    pytest.param("vector(1)", 0, id="no-selector"),
    pytest.param("1 + 2", 0, id="literals-only"),
    pytest.param("((foo))", 1, id="parentheses"),
    pytest.param('foo{a="quote\\"d", b="back\\\\slash"}', 1, id="escaped-values"),
    pytest.param('foo{path=~"/v1\\\\..*"}', 1, id="regex-backslash"),
    pytest.param("foo{a='single'} + bar{b=`raw`}", 2, id="other-quotes"),
    pytest.param('foo{a="tab\\t new\\n ünï"}', 1, id="control-and-unicode"),
    pytest.param('label_replace(foo, "d\\"st", "$1", "src", "(.*)")', 1, id="escaped-string-arg"),
    # A value that would close the braces if printed unescaped: still one selector.
    pytest.param('foo{a="x\\"} or other{namespace=\\"team-b\\"} or foo{b=\\""}', 1, id="inject"),
    pytest.param('sum(rate(x{job="j"}[5m])) by (pod) > 0.5 * count(up{job="w"} == 1)', 2, id="mix"),
]


@pytest.mark.parametrize(("query", "count"), SCOPED)
def test_every_selector_carries_exactly_the_namespace_matcher(query: str, count: int) -> None:
    got = scope_query(query, NS)
    found = selectors(got)
    assert len(found) == count
    for vs in found:
        own = [m for m in matchers(vs) if m[1] == "namespace"]
        assert own == [("MatchOp.Equal", "namespace", NS)], got
    # The same query otherwise: the tree of the original, each selector's own matchers kept.
    original = selectors(query)
    assert [unscoped(v, "namespace") for v in found] == [unscoped(v, "namespace") for v in original]
    assert [(v.name, v.offset) for v in found] == [(v.name, v.offset) for v in original]
    assert type(pp.parse(got)) is type(pp.parse(query))
    assert scope_query(got, NS) == got  # scoping is idempotent


def test_another_label_is_a_setting() -> None:
    got = scope_query('rate(foo{namespace="x"}[5m])', NS, label="k8s_namespace")
    [vs] = selectors(got)
    assert matchers(vs) == [
        ("MatchOp.Equal", "namespace", "x"),  # an ordinary label when it is not the scope's
        ("MatchOp.Equal", "k8s_namespace", NS),
    ]


def test_the_text_is_promql_a_reader_expects() -> None:
    assert (
        scope_query('sum(rate(trainer_samples_total{job="resnet"}[1m]))', NS)
        == 'sum(rate(trainer_samples_total{job="resnet",namespace="team-a"}[1m]))'
    )


REFUSED = [
    pytest.param("rate(", "not PromQL", id="unparsable"),
    pytest.param("", "not PromQL", id="empty"),
    pytest.param("holt_winters(foo[1h], 0.5, 0.5)", "unknown function", id="unknown-function"),
    pytest.param('foo{namespace="team-b"}', 'namespace="team-b"', id="other-namespace"),
    pytest.param('foo + bar{namespace="team-b"}', "bar", id="other-namespace-on-one-side"),
    pytest.param('foo{namespace!="team-a"}', 'namespace!="team-a"', id="not-equal"),
    pytest.param('foo{namespace=~"team-.*"}', 'namespace=~"team-.*"', id="regex"),
    pytest.param('foo{namespace=~"team-a"}', 'namespace=~"team-a"', id="regex-of-own"),
    pytest.param('foo{namespace!~"x"}', 'namespace!~"x"', id="not-regex"),
    pytest.param('foo{namespace=""}', 'namespace=""', id="empty-namespace"),
    pytest.param('rate(foo{namespace="team-b"}[5m])', "team-b", id="other-in-matrix"),
    pytest.param('max_over_time(foo{namespace="b"}[1h:1m])', 'namespace="b"', id="in-subquery"),
    pytest.param('absent(foo{namespace="team-b"})', "team-b", id="absent-other"),
    pytest.param('{__name__="x", namespace="team-b"}', "team-b", id="name-only-other"),
    pytest.param('foo{a="1" or b="2"}', "'or' between matchers", id="or-matchers"),
    pytest.param("info(foo)", "info()", id="info"),
    pytest.param("max_over_time(foo[1h:])", "resolution step", id="subquery-without-step"),
    pytest.param("rate(foo[1s500ms])", "same meaning", id="unprintable-duration"),
]


@pytest.mark.parametrize(("query", "reason"), REFUSED)
def test_what_cannot_be_scoped_is_refused(query: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        scope_query(query, NS)
    assert reason in str(caught.value)


def test_every_problem_is_told_at_once() -> None:
    with pytest.raises(InvalidInput) as caught:
        scope_query('foo{namespace="b"} + bar{namespace!="c"} + info(baz)', NS)
    assert len(caught.value.problems) == 3


@pytest.mark.parametrize(
    ("namespace", "label"),
    [
        pytest.param("", "namespace", id="no-namespace"),
        pytest.param(NS, "", id="no-label"),
        pytest.param(NS, "__name__", id="reserved-label"),
        pytest.param(NS, "a-b", id="not-a-label-name"),
    ],
)
def test_a_scope_must_be_given(namespace: str, label: str) -> None:
    with pytest.raises(InvalidInput):
        scope_query("foo", namespace, label)


@pytest.mark.parametrize(
    ("label", "valid"),
    [("namespace", True), ("k8s_namespace_name", True), ("__name__", False), ("1x", False)],
)
def test_valid_label(label: str, valid: bool) -> None:
    assert valid_label(label) is valid
