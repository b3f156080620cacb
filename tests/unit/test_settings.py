from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import InvalidInput
from extender.scheduler.settings import load_settings


def test_defaults() -> None:
    s = load_settings(env={})
    assert (s.port, s.gpu_resource, s.weights.total) == (8888, "nvidia.com/gpu", 10.0)


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("port: 7000\nreserve_ttl_s: 5\nweights: {cache: 1}\n")
    env = {"TIDELEASE_EXTENDER_PORT": "7100", "TIDELEASE_EXTENDER_RESERVE_TTL_S": "6"}
    s = load_settings(file=f, env=env, overrides={"port": 7200})
    assert s.port == 7200
    assert s.reserve_ttl_s == 6.0
    assert s.weights.cache == 1.0
    assert s.weights.ownership == 3.0


def test_every_problem_at_once(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("port: 99999\nbogus: 1\nweights: {cache: x, nope: 1}\n")
    with pytest.raises(InvalidInput) as err:
        load_settings(file=f, env={"TIDELEASE_EXTENDER_BIND_ATTEMPTS": "many"})
    text = str(err.value)
    for fragment in ("bogus", "weight cache", "nope", "bind_attempts"):
        assert fragment in text


def test_validation(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings(
            env={},
            overrides={"port": 70000, "gpu_resource": "gpu", "snapshot": tmp_path / "missing.yaml"},
        )
    assert len(err.value.problems) == 3


def test_the_test_grace_is_off_unless_set() -> None:
    assert load_settings(env={}).leasing_test_grace_s is None
    env = {"TIDELEASE_EXTENDER_LEASING_TEST_GRACE_S": "2"}
    assert load_settings(env=env).leasing_test_grace_s == 2
    assert (
        load_settings(env={"TIDELEASE_EXTENDER_LEASING_TEST_GRACE_S": ""}).leasing_test_grace_s
        is None
    )
    with pytest.raises(InvalidInput, match="leasing_test_grace_s must not be negative"):
        load_settings(env={"TIDELEASE_EXTENDER_LEASING_TEST_GRACE_S": "-1"})


@pytest.mark.parametrize(
    ("yaml_text", "complaint"),
    [
        ("bind_attempts: 2.9", "bind_attempts: want a whole number, got 2.9"),
        ("port: true", "port: want a whole number, got True"),
        ("reserve_ttl_s: .nan", "reserve_ttl_s: want a finite number"),
        ("agent_timeout_s: .inf", "agent_timeout_s: want a finite number"),
        ("missing_grace_s: '1e400'", "missing_grace_s: want a finite number"),
        ("leasing_controller: 1", "leasing_controller: want true or false, got 1"),
        ("planner: maybe", "planner: want true or false"),
        ("host: 8080", "host: want text, got 8080"),
        ("scheduler_names: [a, 3]", "scheduler_names: want a list of names"),
        ("weights: {cache: .nan}", "weight cache must be a number"),
    ],
    ids=lambda v: v.split(":")[0] if isinstance(v, str) and ":" in v else None,
)
def test_values_are_read_strictly(tmp_path: Path, yaml_text: str, complaint: str) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(yaml_text + "\n")
    with pytest.raises(InvalidInput) as err:
        load_settings(file=f, env={})
    assert complaint in str(err.value)


def test_a_file_with_five_problems_reports_five(tmp_path: Path) -> None:
    """What cannot be read and what is out of range, together (it used to stop at the first
    kind and report two)."""
    f = tmp_path / "s.yaml"
    f.write_text("port: 99999\nbind_attempts: 0\nreserve_ttl_s: .nan\nbogus: 1\nplanner: 2\n")
    with pytest.raises(InvalidInput) as err:
        load_settings(file=f, env={})
    assert len(err.value.problems) == 5, err.value.problems


def test_scheduler_names_from_the_file_or_a_variable(tmp_path: Path) -> None:
    assert load_settings(env={}).scheduler_names == ("default-scheduler", "tidelease-scheduler")
    f = tmp_path / "s.yaml"
    f.write_text("scheduler_names: [tidelease-scheduler]\n")
    assert load_settings(file=f, env={}).scheduler_names == ("tidelease-scheduler",)
    env = {"TIDELEASE_EXTENDER_SCHEDULER_NAMES": "a, b"}
    assert load_settings(env=env).scheduler_names == ("a", "b")
