"""Dependency files: parsing, every problem with its place, cycles, roles, the shipped files."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import InvalidInput
from extender.orchestration.depfile import ReadyCondition, Retry, Target, parse
from extender.orchestration.graph import build, find_cycle, load
from extender.orchestration.jobs import parse_replicas

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "manifests" / "orchestration" / "frameworks").glob("*.yaml"))

HEAD = """\
apiVersion: tidelease.io/v1alpha1
kind: Dependencies
framework: ray
roles:
  head: {replicas: 1}
  worker: {}
"""

RAY = (
    HEAD
    + """\
commands:
  - name: head-start
    role: head
    run: [ray, start, --head]
  - name: worker-join
    role: worker
    target: each
    after: [head-start]
    run: [ray, start, "--address={{address:head}}:6379"]
  - name: submit
    role: head
    after: [worker-join]
    when: [{role: worker, ready: 2}]
    run: [ray, job, submit]
    timeoutSeconds: 30
    retry: {attempts: 3, initialSeconds: 0.5, maxSeconds: 4}
"""
)


def problems(text: str) -> list[str]:
    with pytest.raises(InvalidInput) as e:
        load(text)
    return e.value.problems


def test_a_valid_file_becomes_a_dag_in_dependency_order() -> None:
    dag = load(RAY)
    assert [c.name for c in dag.order] == ["head-start", "worker-join", "submit"]
    assert dag.dependents == {
        "head-start": ("worker-join",),
        "worker-join": ("submit",),
        "submit": (),
    }
    submit = dag.command("submit")
    assert submit.when == (ReadyCondition("worker", 2),)
    assert submit.retry == Retry(3, 0.5, 4.0)
    assert submit.timeout_s == 30.0
    assert dag.command("worker-join").target is Target.EACH
    assert dag.roles == {"head": 1, "worker": None}


def test_the_file_order_is_kept_among_independent_commands() -> None:
    text = (
        HEAD
        + """\
commands:
  - {name: c, role: head, run: [x], after: [a, b]}
  - {name: b, role: head, run: [x]}
  - {name: a, role: head, run: [x]}
"""
    )
    assert [c.name for c in load(text).order] == ["b", "a", "c"]


@pytest.mark.parametrize(
    ("commands", "expected"),
    [
        pytest.param(
            """\
  - {name: ray-head-start, role: head, run: [x]}
  - {name: b, role: worker, run: [x]}
  - {name: c, role: worker, run: [x], after: [ray-head]}
""",
            ['commands[2].after[0]: unknown command "ray-head"'],
            id="unknown-command",
        ),
        pytest.param(
            "  - {name: a, role: chief, run: [x]}\n",
            ['commands[0].role: unknown role "chief" (roles: "head", "worker")'],
            id="unknown-role",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], when: [{role: ps, ready: all}]}\n",
            ['commands[0].when[0].role: unknown role "ps" (roles: "head", "worker")'],
            id="unknown-role-in-condition",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], when: [{role: worker, ready: 0}]}\n",
            ['commands[0].when[0].ready: want "all" or a count of at least 1, got the number 0'],
            id="zero-ready",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x]}\n  - {name: a, role: head, run: [y]}\n",
            ['commands[1].name: duplicate command "a" (first at commands[0])'],
            id="duplicate",
        ),
        pytest.param(
            "  - {name: a, role: head, run: mpirun -np 4}\n",
            [
                "commands[0].run: want a non-empty list of arguments (argv, no shell), "
                'got the string "mpirun -np 4"'
            ],
            id="run-as-string",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x, '{{hosts:ps}}', '{{nope}}', '{{count}}']}\n",
            [
                'commands[0].run[1]: placeholder "{{hosts:ps}}": unknown role "ps"',
                'commands[0].run[2]: unknown placeholder "{{nope}}"',
                'commands[0].run[3]: placeholder "{{count}}" needs a role: {{count:ROLE}}',
            ],
            id="placeholders",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], target: all}\n",
            ['commands[0].target: want "one" or "each", got the string "all"'],
            id="target",
        ),
        pytest.param(
            "  - name: a\n    role: head\n    run: [x]\n    on: each\n",
            ['commands[0]: unknown field "on" (YAML reads it as true; use "target")'],
            id="bare-on-key",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], retry: {initialSeconds: 5, maxSeconds: 1}}\n",
            ["commands[0].retry.maxSeconds: want at least initialSeconds (5)"],
            id="retry-cap-below-initial",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], timeoutSeconds: -1, retries: 3}\n",
            [
                'commands[0]: unknown field "retries" (known: after, container, description, '
                "detach, name, retry, role, run, target, timeoutSeconds, when)",
                "commands[0].timeoutSeconds: want a positive number of seconds, got -1",
            ],
            id="every-problem-at-once",
        ),
        pytest.param(
            "  - {name: Head_Start, role: head, run: [x]}\n",
            ['commands[0].name: "Head_Start" is not a valid command name (lower-case DNS label)'],
            id="bad-name",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], detach: {settleSeconds: 400}}\n",
            ["commands[0].detach.settleSeconds: want less than timeoutSeconds (300)"],
            id="detach-longer-than-timeout",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], timeoutSeconds: .nan}\n",
            ["commands[0].timeoutSeconds: want a finite number of seconds, got the number nan"],
            id="nan-timeout",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], timeoutSeconds: 1" + "0" * 400 + "}\n",
            [
                "commands[0].timeoutSeconds: want a finite number of seconds, got the number 1"
                + "0" * 400
            ],
            id="timeout-past-the-largest-float",
        ),
        pytest.param(
            "  - {name: a, role: head, run: [x], retry: {initialSeconds: .inf}, "
            "detach: {settleSeconds: .NaN}}\n",
            [
                "commands[0].retry.initialSeconds: want a finite number of seconds, got the "
                "number inf",
                "commands[0].detach.settleSeconds: want a finite number of seconds, got the "
                "number nan",
            ],
            id="infinite-backoff-and-settle",
        ),
    ],
)
def test_bad_commands_are_named_with_their_place(commands: str, expected: list[str]) -> None:
    assert problems(HEAD + "commands:\n" + commands) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "roles:\n  worker: {}\n commands: []\n",
            ["line 3, column 2: expected <block end>, but found '<block mapping start>'"],
            id="bad-indentation",
        ),
        pytest.param(
            "commands: [a, b\n",
            ["line 2, column 1: expected ',' or ']', but got '<stream end>'"],
            id="unclosed-list",
        ),
        pytest.param("", ["the file is empty"], id="empty"),
        pytest.param(
            "roles: " + "[" * 5_000 + "]" * 5_000 + "\n",
            ["not valid YAML: nested too deeply"],
            id="deeply-nested",
        ),
        pytest.param(
            "description: 2001-02-30\n",
            ["not valid YAML: day is out of range for month"],
            id="impossible-date",
        ),
        pytest.param("- a\n- b\n", ["want a mapping, got a list"], id="not-a-mapping"),
        pytest.param(
            "apiVersion: v1\nkind: Pod\nroles: {w: {replicas: -1}}\ncommands: []\n",
            [
                'apiVersion: want "tidelease.io/v1alpha1", got the string "v1"',
                'kind: want "Dependencies", got the string "Pod"',
                "roles.w.replicas: want at least 0, got -1",
                "commands: want a non-empty list of commands, got a list",
            ],
            id="header",
        ),
        pytest.param(
            HEAD.replace("worker: {}", "worker: {count: 3}")
            + "discovery: {role: workers}\ncommands:\n  - {name: a, role: head, run: [x]}\n",
            [
                'roles.worker: unknown field "count" (known: description, replicas)',
                'discovery.role: unknown role "workers" (roles: "head", "worker")',
            ],
            id="roles-and-discovery",
        ),
    ],
)
def test_bad_files_name_the_place(text: str, expected: list[str]) -> None:
    assert problems(text) == expected


@pytest.mark.parametrize(
    ("after", "cycle"),
    [
        pytest.param({"a": ["a"]}, "cycle: a -> a", id="self"),
        pytest.param({"a": ["b"], "b": ["a"]}, "cycle: a -> b -> a", id="two"),
        pytest.param(
            {"a": [], "b": ["a", "d"], "c": ["b"], "d": ["c"]},
            "cycle: b -> d -> c -> b",
            id="three",
        ),
    ],
)
def test_cycles_are_named(after: dict[str, list[str]], cycle: str) -> None:
    lines = "".join(
        f"  - {{name: {n}, role: head, run: [x], after: [{', '.join(deps)}]}}\n"
        for n, deps in after.items()
    )
    assert problems(HEAD + "commands:\n" + lines) == [cycle]


def test_find_cycle_on_an_acyclic_graph_finds_none() -> None:
    assert find_cycle({"a": (), "b": ("a",), "c": ("a", "b")}) is None


def test_build_is_separate_from_parse() -> None:
    file = parse(RAY)
    assert build(file).file is file


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param("worker: 3\n", {"head": 1, "worker": 3}, id="default-kept"),
        pytest.param("head: 2\nworker: 0\n", {"head": 2, "worker": 0}, id="override"),
    ],
)
def test_replicas_merge_over_the_file_defaults(given: str, expected: dict[str, int]) -> None:
    assert parse_replicas(given, load(RAY).roles) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(
            "",
            ['replicas: role "worker" has no replica count (the dependency file gives none)'],
            id="missing-role",
        ),
        pytest.param(
            "worker: 2\nps: 1\n",
            ['replicas.ps: unknown role "ps"'],
            id="unknown-role",
        ),
        pytest.param(
            "worker: many\n",
            ["replicas.worker: want a count of at least 0, got 'many'"],
            id="not-a-count",
        ),
        pytest.param(
            # Aliases: 9^6 elements in a few lines; a message must not write them out.
            "a: &a [x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n"
                for p, n in zip("abcde", "bcdef", strict=True)
            )
            + "worker: *f\n",
            ['replicas.a: unknown role "a"']
            + [f'replicas.{n}: unknown role "{n}"' for n in "bcdef"]
            + ["replicas.worker: want a count of at least 0, got a list"],
            id="alias-bomb",
        ),
        pytest.param(
            "worker: {a: &x [1]}\n",
            ["replicas.worker: want a count of at least 0, got a mapping"],
            id="mapping",
        ),
        pytest.param(
            "worker: " + "[" * 5_000 + "]" * 5_000 + "\n",
            ["replicas: not valid YAML: nested too deeply"],
            id="deeply-nested",
        ),
        pytest.param(
            "worker: 2001-13-01\n",
            ["replicas: not valid YAML: month must be in 1..12"],
            id="impossible-date",
        ),
    ],
)
def test_bad_replicas_are_named(given: str, expected: list[str]) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_replicas(given, load(RAY).roles)
    assert e.value.problems == expected


def test_an_integer_too_long_to_read_is_invalid_yaml() -> None:
    """Python refuses to convert integers of more than 4300 digits (a ValueError)."""
    long = "1" + "0" * 5_000
    with pytest.raises(InvalidInput, match=r"^not valid YAML: .*4300 digits"):
        parse(HEAD + f"commands:\n  - {{name: a, role: head, run: [x], timeoutSeconds: {long}}}\n")
    with pytest.raises(InvalidInput, match=r"^replicas: not valid YAML: .*4300 digits"):
        parse_replicas(f"worker: {long}\n", load(RAY).roles)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_dependency_files_load(path: Path) -> None:
    dag = load(path.read_text())
    assert dag.order
    assert dag.file.framework == path.stem


def test_every_framework_of_table_1_is_shipped() -> None:
    assert {p.stem for p in SHIPPED} >= {"mpi", "pytorch", "ray", "tensorflow", "horovod-elastic"}
