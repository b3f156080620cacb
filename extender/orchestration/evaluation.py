"""Which commands to issue now, checking before each that what it depends on is done and its
conditions hold: the DAG, the readiness snapshot and the records in, the issues and the reasons
for waiting out. Pure, and cheap enough to run on every pod status change
(benchmarks/bench_orchestrator.py: a 1,000-pod job well under 10 ms).

A command is issued into a pod when
- every command in its ``after`` is done (an ``on: each`` command counts as done once it is
  done in as many pods of its role as the role's expected replicas: at once for 0 replicas),
- every ``when`` condition holds on the snapshot,
- the pod is a ready pod of the command's role (``one``: the first such pod by name),
- its record allows an attempt (not done, not given up, not in flight, not backing off).

Reference: weflex 3.4, its "DAG query" (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

from extender.orchestration.depfile import Command, Target
from extender.orchestration.graph import Dag
from extender.orchestration.jobreadiness import PodState, Snapshot
from extender.orchestration.records import (
    Record,
    Records,
    State,
    abandoned,
    claimable,
    issue_key,
    record_of,
)


@dataclass(frozen=True)
class Issue:
    command: Command
    pod: PodState
    key: str
    attempt: int  # the number this issue will carry (1: first)


@dataclass(frozen=True)
class Waiting:
    command: str
    reason: str


@dataclass(frozen=True)
class Evaluation:
    issues: tuple[Issue, ...]
    waiting: tuple[Waiting, ...]
    wake_at: float | None  # the earliest retry or takeover time, if any
    complete: bool  # every command done
    # issue keys whose last attempt a controller that is gone left RUNNING, timed out: to be
    # recorded as given up (records.give_up_abandoned)
    abandoned: tuple[str, ...] = ()


def _done(r: Record | None) -> bool:
    return r is not None and r.state is State.DONE


def _blocked_by(r: Record | None, command: Command, now: float) -> tuple[str, float | None]:
    """Why a record that is not claimable holds the command back, and until when."""
    assert r is not None
    if r.state is State.GAVE_UP:
        return f"gave up after {r.attempts} attempt(s): {r.error}", None
    if r.state is State.FAILED:
        if r.attempts >= command.retry.attempts:
            return f"gave up after {r.attempts} attempt(s): {r.error}", None
        return f"attempt {r.attempts} failed ({r.error}); retry at {r.retry_at:.3f}", r.retry_at
    takeover = r.at + command.timeout_s
    if now >= takeover and r.attempts >= command.retry.attempts:
        # Left RUNNING by a controller that is gone, timed out, and no attempt is left: no
        # takeover will come (a wake time in the past would re-evaluate the job in a hot loop).
        return (
            f"gave up after {r.attempts} attempt(s): the last one, left running by "
            f"{r.holder or 'a former controller'}, timed out",
            None,
        )
    return f"attempt {r.attempts} running in {r.pod}", takeover


def evaluate(
    dag: Dag,
    replicas: Mapping[str, int],
    snapshot: Snapshot,
    records: Records,
    *,
    in_flight: Container[str],
    now: float,
) -> Evaluation:
    issues: list[Issue] = []
    waiting: list[Waiting] = []
    gone: list[str] = []
    wake: float | None = None
    satisfied: dict[str, bool] = {}

    def later(t: float | None) -> None:
        nonlocal wake
        if t is not None and (wake is None or t < wake):
            wake = t

    for command in dag.order:
        if command.target is Target.ONE:
            done = _done(records.get(command.name))
        else:
            count = sum(
                1
                for p in snapshot.ready(command.role)
                if _done(record_of(issue_key(command, p.name), records, command, p.uid))
            )
            # Done in as many pods as the role expects: at once for a role of 0 replicas (an
            # elastic role scaled to nothing holds no one back; pods that join later still
            # get the command).
            expected = replicas.get(command.role)
            done = expected is not None and count >= expected
        satisfied[command.name] = done
        if done and command.target is Target.ONE:
            continue
        missing = [d for d in command.after if not satisfied[d]]
        if missing:
            waiting.append(Waiting(command.name, f"waits for {', '.join(missing)}"))
            continue
        unmet = [
            c
            for c in command.when
            if snapshot.ready_count(c.role)
            < (replicas.get(c.role, 0) if c.count is None else c.count)
        ]
        if unmet:
            why = "; ".join(
                f"{c.describe()} ({snapshot.ready_count(c.role)}/"
                f"{replicas.get(c.role, 0) if c.count is None else c.count})"
                for c in unmet
            )
            waiting.append(Waiting(command.name, f"waits for {why}"))
            continue
        ready = snapshot.ready(command.role)
        if not ready:
            if not done:
                waiting.append(Waiting(command.name, f"waits for a ready {command.role} pod"))
            continue
        targets = ready[:1] if command.target is Target.ONE else ready
        for pod in targets:
            key = issue_key(command, pod.name)
            if key in in_flight:
                continue
            r = record_of(key, records, command, pod.uid)
            if claimable(r, command, now):
                attempt = (r.attempts if r is not None else 0) + 1
                if attempt <= command.retry.attempts:
                    issues.append(Issue(command, pod, key, attempt))
                    continue
            if r is not None and r.state is not State.DONE:
                reason, until = _blocked_by(r, command, now)
                waiting.append(Waiting(key, reason))
                later(until)
                if abandoned(r, command, now):
                    gone.append(key)
    return Evaluation(tuple(issues), tuple(waiting), wake, all(satisfied.values()), tuple(gone))
