"""The agent's and the orchestrator's settings read strictly (common/coercion.py), as the
extender's are: no NaN or infinity for a time, whole numbers whole, ports in range, and every
problem of a command line found at once. tests/integration/test_cli.py runs the real command."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from common import coercion
from common.cli import parser
from nodeagent.cache.peerserver import ServeSettings
from nodeagent.deviceplugin.settings import DevicePluginSettings
from nodeagent.main import fake_uuid, flag_problems
from nodeagent.nvmlfake import full_gpu


@pytest.mark.parametrize(
    ("read", "value", "want"),
    [
        (coercion.as_float, "2.5", 2.5),
        (coercion.as_float, 3, 3.0),
        (coercion.as_float, "nan", None),
        (coercion.as_float, "inf", None),
        (coercion.as_float, "-inf", None),
        (coercion.as_float, math.nan, None),
        (coercion.as_float, True, None),
        (coercion.as_int, "7", 7),
        (coercion.as_int, "2.9", None),
        (coercion.as_int, 2.0, None),
        (coercion.as_int, True, None),
        (coercion.as_positive, "0.5", 0.5),
        (coercion.as_positive, "0", None),
        (coercion.as_positive, "inf", None),
        (coercion.as_port, "0", 0),
        (coercion.as_port, "65535", 65535),
        (coercion.as_port, "65536", None),
        (coercion.as_port, "-1", None),
        (coercion.as_port, "80.0", None),
        (coercion.as_count, "0", 0),
        (coercion.as_count, "-1", None),
        (coercion.as_bool, "off", False),
        (coercion.as_bool, "2", None),
    ],
    ids=lambda v: repr(v) if not callable(v) else v.__name__,
)
def test_values_are_read_strictly(read: Any, value: object, want: object) -> None:
    problems: list[str] = []
    assert read("x", value, problems) == want
    assert len(problems) == (1 if want is None else 0), problems
    assert all(p.startswith("x: want ") for p in problems)


def test_the_checks_beneath_take_no_bool_for_a_number_and_no_huge_integer_for_finite() -> None:
    """The checks the dependency file's and the records' parsers share (common/coercion.py): an
    integer past the largest float is an infinite number, not an OverflowError."""
    huge = 10**400
    assert [coercion.whole(v) for v in (3, True, 3.0)] == [True, False, False]
    assert [coercion.number(v) for v in (2.5, huge, False)] == [True, True, False]
    assert (coercion.real(huge), coercion.real(-huge)) == (math.inf, -math.inf)
    assert [coercion.finite(v) for v in (huge, 7)] == [False, True]
    problems: list[str] = []
    assert coercion.as_float("x", huge, problems) is None
    assert problems == [f"x: want a finite number, got {huge!r}"]


def _agent(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["agent", *argv])


def test_the_agents_defaults_pass() -> None:
    assert flag_problems(_agent("--node", "n")) == []
    assert flag_problems(_agent("--node", "n", "--cache-dir", "/var/cache/tidelease")) == []


def test_the_fake_backends_uuids_keep_their_form_and_take_a_prefix() -> None:
    # The default is the fake backend's own UUID (nodeagent.nvmlfake.full_gpu): nothing changes
    # for nodes that give no prefix.
    assert [fake_uuid(i) for i in range(3)] == [full_gpu(i).uuid for i in range(3)]
    assert fake_uuid(2, "GPU-real-dra-0") == "GPU-real-dra-0-0002-0000-0000-000000000000"
    assert flag_problems(_agent("--node", "n", "--fake-uuid-prefix", "GPU-real-dra-0")) == []


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (("--cycle", "nan"), "--cycle: want a finite number, got 'nan'"),
        (("--cycle", "0"), "--cycle: want a positive number of seconds, got '0'"),
        (("--quiet-period", "inf"), "--quiet-period: want a finite number, got 'inf'"),
        (("--hot-restart-timeout=-inf",), "--hot-restart-timeout: want a finite number"),
        (("--hot-restart-timeout", "x"), "--hot-restart-timeout: want a finite number"),
        (("--fake-gpus", "2.5"), "--fake-gpus: want a whole number, got '2.5'"),
        (("--fake-gpus=-1",), "--fake-gpus: want a whole number of at least 0"),
        (("--fake-uuid-prefix", "GPU fake"), "--fake-uuid-prefix: want letters, digits and"),
        (("--fake-uuid-prefix", ""), "--fake-uuid-prefix: want letters, digits and dashes"),
        (("--ignored-xids", "13,x"), "--ignored-xids: want comma-separated whole numbers"),
        (("--ignored-xids=13,-1",), "--ignored-xids: want comma-separated whole numbers"),
        (("--cache-dir", "/c", "--cache-port", "70000"), "--cache-port: want a port in 0..65535"),
        (("--cache-dir", "/c", "--cache-partial-ttl", "inf"), "--cache-partial-ttl: want a finite"),
        (("--cache-dir", "/c", "--cache-partial-ttl", "nan"), "--cache-partial-ttl: want a finite"),
        (("--cache-dir", "/c", "--cache-partial-ttl=-1"), "--cache-partial-ttl: want a number"),
        (("--cache-dir", "/c", "--cache-max-bytes", "0"), "--cache-max-bytes: want a whole number"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else None,
)
def test_a_bad_agent_flag_is_one_problem(argv: tuple[str, ...], problem: str) -> None:
    problems = flag_problems(_agent("--node", "n", *argv))
    assert len(problems) == 1, problems
    assert problems[0].startswith(problem), problems


def test_every_bad_agent_flag_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    args = _agent("--cycle", "nan", "--fake-gpus", "1.5", "--cache-dir", "/c", "--cache-port=-1")
    problems = flag_problems(args)
    assert [p.split(":")[0].split()[0] for p in problems] == [
        "--node",
        "--fake-gpus",
        "--cycle",
        "--cache-port",
    ]


@pytest.mark.parametrize(
    "change",
    [
        {"api_timeout_s": math.nan},
        {"register_timeout_s": math.inf},
        {"register_backoff_s": -1.0},
        {"register_backoff_max_s": math.nan},
        {"socket_poll_s": 0.0},
        {"stop_grace_s": math.inf},
        {"stop_grace_s": math.nan},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_the_device_plugin_refuses_times_that_are_not_finite(change: dict[str, float]) -> None:
    settings = DevicePluginSettings(node_name="n", **change)
    (name,) = change
    (problem,) = settings.validate()
    assert problem.startswith(name), problem
    assert DevicePluginSettings(node_name="n").validate() == []


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (ServeSettings(port=70000), "cache port 70000 is not a TCP port"),
        (ServeSettings(port=True), "cache port True is not a whole number"),
        (ServeSettings(port=8477.0), "cache port 8477.0 is not a whole number"),  # type: ignore[arg-type]
        (ServeSettings(host=""), "cache host must not be empty"),
    ],
    ids=["range", "bool", "float", "host"],
)
def test_the_cache_server_refuses_bad_settings(settings: ServeSettings, problem: str) -> None:
    assert settings.validate() == [problem]
    assert ServeSettings(port=0).validate() == []
