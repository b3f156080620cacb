"""DAG evaluation over snapshots and records, backoff, records, placeholders, discover_hosts."""

from __future__ import annotations

import pytest

from common.errors import InvalidInput
from extender.orchestration.backoff import backoff_s
from extender.orchestration.evaluation import Evaluation, evaluate
from extender.orchestration.graph import load
from extender.orchestration.jobreadiness import PodState, Snapshot, natural_key, pod_state
from extender.orchestration.records import (
    ANN_RECORDS,
    Record,
    State,
    claim,
    dump_records,
    finish,
    merge,
    parse_records,
)
from extender.orchestration.rendering import (
    Context,
    detached,
    discover_hosts_script,
    hosts_lines,
    render,
)
from extender.orchestration.testing import pod

MPI = """\
apiVersion: tidelease.io/v1alpha1
kind: Dependencies
framework: mpi
roles: {launcher: {replicas: 1}, worker: {}}
commands:
  - name: mpirun
    role: launcher
    run: [mpirun, -H, "{{hosts:worker}}"]
    when: [{role: worker, ready: all}]
    retry: {attempts: 3, initialSeconds: 2, maxSeconds: 10}
"""
RAY = """\
apiVersion: tidelease.io/v1alpha1
kind: Dependencies
roles: {head: {replicas: 1}, worker: {}}
commands:
  - {name: head-start, role: head, run: [ray, start, --head]}
  - name: worker-join
    role: worker
    target: each
    after: [head-start]
    run: [ray, start, "--address={{address:head}}:6379"]
  - {name: submit, role: head, after: [worker-join], run: [ray, job, submit]}
"""


def ps(name: str, role: str, ready: bool = True, uid: str | None = None) -> PodState:
    return PodState(name, uid or f"uid-{name}", role, ready, f"10.0.0.{name[-1]}", 1)


def done(pod: str, uid: str | None = None) -> Record:
    return Record(State.DONE, 1, pod, uid or f"uid-{pod}", 0.0)


def run(
    text: str,
    replicas: dict[str, int],
    pods: list[PodState],
    records: dict[str, Record] | None = None,
    in_flight: frozenset[str] = frozenset(),
    now: float = 100.0,
) -> Evaluation:
    return evaluate(
        load(text), replicas, Snapshot(pods), records or {}, in_flight=in_flight, now=now
    )


def issued(ev: Evaluation) -> list[tuple[str, str]]:
    return [(i.key, i.pod.name) for i in ev.issues]


R3 = {"launcher": 1, "worker": 3}
LAUNCHER = ps("l-0", "launcher")
W = [ps(f"w-{i}", "worker") for i in range(3)]


@pytest.mark.parametrize(
    ("pods", "expected", "reason"),
    [
        pytest.param([], [], "waits for all worker ready (0/3)", id="nothing"),
        pytest.param([LAUNCHER, *W[:2]], [], "waits for all worker ready (2/3)", id="two-of-three"),
        pytest.param(
            [LAUNCHER, *W[:2], ps("w-2", "worker", ready=False)],
            [],
            "waits for all worker ready (2/3)",
            id="third-not-ready",
        ),
        pytest.param(W, [], "waits for a ready launcher pod", id="no-launcher"),
        pytest.param(
            [ps("l-0", "launcher", ready=False), *W],
            [],
            "waits for a ready launcher pod",
            id="launcher-not-ready",
        ),
        pytest.param([LAUNCHER, *W], [("mpirun", "l-0")], None, id="all-ready"),
    ],
)
def test_mpirun_waits_for_every_worker(
    pods: list[PodState], expected: list[tuple[str, str]], reason: str | None
) -> None:
    ev = run(MPI, R3, pods)
    assert issued(ev) == expected
    assert [w.reason for w in ev.waiting] == ([reason] if reason else [])
    assert not ev.complete


@pytest.mark.parametrize(
    ("record", "now", "issues", "wake", "complete"),
    [
        pytest.param(done("l-0"), 100.0, [], None, True, id="done-never-again"),
        pytest.param(
            Record(State.FAILED, 1, "l-0", "u", 90.0, retry_at=103.0, error="x"),
            100.0,
            [],
            103.0,
            False,
            id="backing-off",
        ),
        pytest.param(
            Record(State.FAILED, 1, "l-0", "u", 90.0, retry_at=103.0, error="x"),
            103.0,
            [("mpirun", "l-0")],
            None,
            False,
            id="retry-due",
        ),
        pytest.param(
            Record(State.FAILED, 3, "l-0", "u", 90.0, retry_at=91.0, error="x"),
            100.0,
            [],
            None,
            False,
            id="attempts-spent",
        ),
        pytest.param(
            Record(State.GAVE_UP, 3, "l-0", "u", 90.0, error="x"),
            100.0,
            [],
            None,
            False,
            id="gave-up",
        ),
        pytest.param(
            Record(State.RUNNING, 1, "l-0", "u", 90.0, holder="dead"),
            100.0,
            [],
            390.0,
            False,
            id="left-running-by-a-dead-controller-waits-out-its-timeout",
        ),
        pytest.param(
            Record(State.RUNNING, 1, "l-0", "u", 90.0, holder="dead"),
            390.0,
            [("mpirun", "l-0")],
            None,
            False,
            id="then-is-retried",
        ),
        pytest.param(
            Record(State.RUNNING, 3, "l-0", "u", 90.0, holder="dead"),
            390.0,
            [],
            None,
            False,
            id="last-attempt-left-running-and-timed-out-gives-up-without-a-past-wake",
        ),
    ],
)
def test_records_decide_reissues(
    record: Record,
    now: float,
    issues: list[tuple[str, str]],
    wake: float | None,
    complete: bool,
) -> None:
    ev = run(MPI, R3, [LAUNCHER, *W], {"mpirun": record}, now=now)
    assert issued(ev) == issues
    assert ev.wake_at == wake
    assert ev.complete is complete
    if issues:
        assert ev.issues[0].attempt == record.attempts + 1


def test_a_timed_out_last_attempt_of_a_dead_controller_counts_as_given_up() -> None:
    """Its attempts are spent: nothing may be issued, so there is nothing to wake up for (a
    wake time in the past made the controller re-evaluate the job in a hot loop)."""
    left = Record(State.RUNNING, 3, "l-0", "u", 90.0, holder="dead")
    ev = run(MPI, R3, [LAUNCHER, *W], {"mpirun": left}, now=400.0)
    assert (issued(ev), ev.wake_at) == ([], None)
    (waiting,) = ev.waiting
    assert waiting.reason.startswith("gave up after 3 attempt(s): the last one, left running by")


@pytest.mark.parametrize(
    ("attempts", "now", "in_flight", "expected"),
    [
        pytest.param(3, 400.0, frozenset(), ("mpirun",), id="last-attempt-timed-out"),
        pytest.param(3, 90.0 + 59.0, frozenset(), (), id="not-timed-out-yet"),
        pytest.param(2, 400.0, frozenset(), (), id="an-attempt-left: taken over instead"),
        pytest.param(3, 400.0, frozenset({"mpirun"}), (), id="in-flight-here"),
    ],
)
def test_abandoned_last_attempts_are_named_for_giving_up(
    attempts: int, now: float, in_flight: frozenset[str], expected: tuple[str, ...]
) -> None:
    text = MPI.replace("retry: {", "timeoutSeconds: 60\n    retry: {")
    left = Record(State.RUNNING, attempts, "l-0", "u", 90.0, holder="dead")
    ev = run(text, R3, [LAUNCHER, *W], {"mpirun": left}, in_flight=in_flight, now=now)
    assert ev.abandoned == expected


def test_a_command_in_flight_is_not_issued_twice() -> None:
    assert issued(run(MPI, R3, [LAUNCHER, *W], in_flight=frozenset({"mpirun"}))) == []


def test_at_least_n_ready() -> None:
    text = MPI.replace("ready: all", "ready: 2")
    assert issued(run(text, R3, [LAUNCHER, W[0]])) == []
    assert issued(run(text, R3, [LAUNCHER, *W[:2]])) == [("mpirun", "l-0")]


def test_one_target_is_the_first_ready_pod_by_ordinal() -> None:
    pods = [ps("l-10", "launcher"), ps("l-9", "launcher"), ps("l-2", "launcher", ready=False)]
    assert issued(run(MPI, {"launcher": 3, "worker": 0}, pods)) == [("mpirun", "l-9")]


R2 = {"head": 1, "worker": 2}
HEAD = ps("h-0", "head")
RW = [ps("w-0", "worker"), ps("w-1", "worker")]


@pytest.mark.parametrize(
    ("pods", "records", "expected"),
    [
        pytest.param([*RW], {}, [], id="no-head"),
        pytest.param([HEAD, *RW], {}, [("head-start", "h-0")], id="head-first"),
        pytest.param(
            [HEAD, *RW],
            {"head-start": done("h-0")},
            [("worker-join@w-0", "w-0"), ("worker-join@w-1", "w-1")],
            id="then-every-worker",
        ),
        pytest.param(
            [HEAD, *RW],
            {"head-start": done("h-0"), "worker-join@w-0": done("w-0")},
            [("worker-join@w-1", "w-1")],
            id="only-the-missing-worker",
        ),
        pytest.param(
            [HEAD, *RW],
            {
                "head-start": done("h-0"),
                "worker-join@w-0": done("w-0"),
                "worker-join@w-1": done("w-1"),
            },
            [("submit", "h-0")],
            id="submit-once-all-joined",
        ),
        pytest.param(
            [HEAD, *RW],
            {
                "head-start": done("h-0"),
                "worker-join@w-0": done("w-0", uid="old"),
                "worker-join@w-1": done("w-1"),
            },
            [("worker-join@w-0", "w-0")],
            id="a-recreated-pod-joins-again",
        ),
        pytest.param(
            [HEAD, *RW, ps("w-2", "worker")],
            {
                "head-start": done("h-0"),
                "worker-join@w-0": done("w-0"),
                "worker-join@w-1": done("w-1"),
                "submit": done("h-0"),
            },
            [("worker-join@w-2", "w-2")],
            id="a-worker-added-later-joins",
        ),
    ],
)
def test_each_commands_follow_the_pods(
    pods: list[PodState], records: dict[str, Record], expected: list[tuple[str, str]]
) -> None:
    assert issued(run(RAY, R2, pods, records)) == expected


def test_an_each_command_over_a_role_of_no_replicas_holds_no_one_back() -> None:
    ev = run(RAY, {"head": 1, "worker": 0}, [HEAD], {"head-start": done("h-0")})
    assert issued(ev) == [("submit", "h-0")]
    assert ev.waiting == ()
    # A worker that joins later still gets its command.
    later = run(
        RAY,
        {"head": 1, "worker": 0},
        [HEAD, ps("w-0", "worker")],
        {"head-start": done("h-0"), "submit": done("h-0")},
    )
    assert issued(later) == [("worker-join@w-0", "w-0")]


def test_waiting_reasons_name_the_missing_command() -> None:
    ev = run(RAY, R2, [HEAD, *RW], {"head-start": done("h-0")}, in_flight=frozenset())
    assert [w.reason for w in ev.waiting] == ["waits for worker-join"]


def test_backoff_doubles_to_its_cap_with_jitter_in_the_upper_half() -> None:
    assert [backoff_s(a, 1.0, 8.0, lambda: 1.0) for a in range(1, 7)] == [1, 2, 4, 8, 8, 8]
    assert [backoff_s(a, 1.0, 8.0, lambda: 0.0) for a in range(1, 5)] == [0.5, 1, 2, 4]
    assert backoff_s(2000, 1.0, 8.0, lambda: 0.5) == 6.0
    with pytest.raises(ValueError, match="from 1"):
        backoff_s(0, 1.0, 8.0, lambda: 0.5)


def test_claim_then_finish_walks_the_record() -> None:
    dag = load(MPI)
    mpirun = dag.command("mpirun")
    first = claim({}, mpirun, "l-0", "u", "me", 10.0)
    assert first == Record(State.RUNNING, 1, "l-0", "u", 10.0, holder="me")
    assert claim({"mpirun": first}, mpirun, "l-0", "u", "other", 11.0) is None
    failed = finish(first, mpirun, error="exit 1", now=12.0, rand=lambda: 1.0)
    assert (failed.state, failed.retry_at) == (State.FAILED, 14.0)
    assert claim({"mpirun": failed}, mpirun, "l-0", "u", "me", 13.0) is None
    second = claim({"mpirun": failed}, mpirun, "l-0", "u", "me", 14.0)
    assert second is not None
    assert second.attempts == 2
    ok = finish(second, mpirun, error=None, now=15.0, rand=lambda: 1.0)
    assert ok.state is State.DONE
    assert not ok.error
    assert not ok.holder
    assert claim({"mpirun": ok}, mpirun, "l-0", "u", "me", 99.0) is None
    third = finish(
        Record(State.RUNNING, 3, "l-0", "u", 1.0), mpirun, error="x" * 500, now=2, rand=lambda: 0
    )
    assert third.state is State.GAVE_UP
    assert len(third.error) == 300


def test_records_round_trip_and_bad_annotations_are_named() -> None:
    records = {
        "a": Record(State.DONE, 1, "p", "u", 1.5),
        "b@w-1": Record(State.FAILED, 2, "w-1", "v", 2.0, retry_at=3.25, error="exit 3"),
    }
    assert parse_records(dump_records(records)) == records
    assert parse_records(None) == {}
    with pytest.raises(InvalidInput, match="orchestration-records"):
        parse_records('{"a": {"state": "maybe", "attempts": 1}}')


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("[" * 100_000, "nested too deeply", id="deep"),
        pytest.param(
            '{"a":' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply", id="deep-record"
        ),
        pytest.param(
            '{"a":{"state":"failed","attempts":-100}}',
            "attempts: want a whole number of at least 1, got -100",
            id="negative-attempts",
        ),
        pytest.param(
            '{"a":{"state":"failed","attempts":1e999}}',
            "attempts: want a whole number of at least 1, got inf",
            id="infinite-attempts",
        ),
        pytest.param(
            '{"a":{"state":"failed","attempts":true}}',
            "attempts: want a whole number of at least 1, got True",
            id="boolean-attempts",
        ),
        pytest.param(
            '{"a":{"state":"done","attempts":1,"at":1' + "0" * 400 + "}}",
            "at: want a finite number of seconds",
            id="long-integer-time",
        ),
        pytest.param(
            '{"a":{"state":"failed","attempts":1,"retryAt":NaN}}',
            "retryAt: want a finite number of seconds",
            id="nan-time",
        ),
        pytest.param(
            '{"a":{"state":"failed","attempts":1,"at":"soon"}}',
            "at: want a number of seconds, got 'soon'",
            id="text-time",
        ),
    ],
)
def test_records_that_would_break_the_issuer_are_invalid(text: str, problem: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_records(text)
    assert e.value.problems == [f"annotation {ANN_RECORDS}: {problem}"]


def test_placeholders_are_filled_from_the_snapshot() -> None:
    snap = Snapshot(
        [
            PodState("w-10", "u", "worker", True, "10.0.0.10", 2),
            PodState("w-9", "u", "worker", True, "10.0.0.9", 4),
            PodState("w-1", "u", "worker", False, "10.0.0.1", 1),
        ]
    )
    ctx = Context("ns", "job", "l-0", snap, {"worker": 3})
    assert render(
        [
            "-H",
            "{{hosts:worker}}",
            "{{ addresses:worker }}",
            "{{address:worker}}",
            "{{count:worker}}/{{replicas:worker}}",
            "{{pod}}.{{job}}.{{namespace}}",
        ],
        ctx,
    ) == (
        "-H",
        "10.0.0.9:4,10.0.0.10:2",
        "10.0.0.9,10.0.0.10",
        "10.0.0.9",
        "2/3",
        "l-0.job.ns",
    )


def test_discover_hosts_script_prints_host_slots_lines() -> None:
    hosts = hosts_lines([PodState("w-0", "u", "worker", True, "w-0.job", 8)])
    assert hosts == "w-0.job:8\n"
    script = discover_hosts_script(hosts)
    assert script.startswith("#!/bin/sh\n")
    assert "w-0.job:8\n" in script
    assert discover_hosts_script("").count("TIDELEASE_HOSTS") == 2


def test_detached_commands_start_in_the_background() -> None:
    argv = detached(["ray", "start", "--block"], 3)
    assert argv[:2] == ("sh", "-c")
    assert "sleep 3;" in argv[2]
    assert argv[3:] == ("tidelease-detach", "ray", "start", "--block")


def test_pod_state_from_the_api_object() -> None:
    assert pod_state(pod("w-1", "worker", ip="10.1.1.1", gpus=4)) == PodState(
        "w-1", "uid-w-1", "worker", True, "10.1.1.1", 4
    )
    assert not pod_state(pod("w-1", "worker", ready=False)).ready  # type: ignore[union-attr]
    assert not pod_state(pod("w-1", "worker", deleting=True)).ready  # type: ignore[union-attr]
    raw = pod("w-1", "worker")
    raw["spec"].update(hostname="w-1", subdomain="job")
    assert pod_state(raw).address == "w-1.job"  # type: ignore[union-attr]
    del raw["metadata"]["labels"]["tidelease.io/role"]
    assert pod_state(raw) is None


def test_snapshot_counts_follow_changes() -> None:
    snap = Snapshot()
    assert snap.apply(ps("w-1", "worker"))
    assert not snap.apply(ps("w-1", "worker"))
    snap.apply(ps("w-2", "worker", ready=False))
    assert (snap.ready_count("worker"), snap.pod_count("worker")) == (1, 2)
    snap.apply(ps("w-2", "worker"))
    assert [p.name for p in snap.ready("worker")] == ["w-1", "w-2"]
    assert snap.remove("w-1")
    assert not snap.remove("w-1")
    assert snap.ready_count("worker") == 1
    assert len(snap) == 1
    assert sorted(["w-10", "w-9", "a"], key=natural_key) == ["a", "w-9", "w-10"]


def test_a_late_watch_event_cannot_take_records_back() -> None:
    running = Record(State.RUNNING, 1, "p", "u", 1.0, holder="me")
    finished = Record(State.DONE, 1, "p", "u", 2.0)
    retried = Record(State.RUNNING, 2, "p", "u", 3.0, holder="me")
    assert merge({"a": finished}, {"a": running}) == {"a": finished}
    assert merge({"a": running}, {"a": finished}) == {"a": finished}
    assert merge({"a": finished}, {"a": retried}) == {"a": retried}
    new_pod = Record(State.RUNNING, 1, "p", "other-uid", 4.0)
    assert merge({"a": finished, "b": running}, {"a": new_pod}) == {"a": new_pod, "b": running}
