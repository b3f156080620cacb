"""What has been issued, kept in the API server so a restarted controller repeats nothing.
Pure: the records, their JSON form, and the two transitions the issuer makes (claim before
issuing, finish after).

One record per issue key: the command's name for ``on: one`` commands, ``command@pod`` for
``on: each`` commands (a pod re-created under the same name has another uid, so its record no
longer counts and the command runs in the new pod).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final

from common import contract
from common.coercion import number, real, whole
from common.errors import InvalidInput
from extender.orchestration.backoff import backoff_s
from extender.orchestration.depfile import Command, Target

ANN_RECORDS: Final = contract.ANN_ORCHESTRATION_RECORDS


class State(StrEnum):
    RUNNING = "running"  # claimed by ``holder``, outcome not yet known
    DONE = "done"  # never issued again
    FAILED = "failed"  # retried at ``retry_at``
    GAVE_UP = "gave-up"  # every attempt failed; a person has to look


@dataclass(frozen=True)
class Record:
    state: State
    attempts: int
    pod: str
    uid: str
    at: float  # when the record last changed (epoch seconds)
    holder: str = ""  # the controller incarnation that claimed a running attempt
    retry_at: float = 0.0
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "state": self.state.value,
            "attempts": self.attempts,
            "pod": self.pod,
            "uid": self.uid,
            "at": round(self.at, 3),
        }
        if self.holder:
            out["holder"] = self.holder
        if self.retry_at:
            out["retryAt"] = round(self.retry_at, 3)
        if self.error:
            out["error"] = self.error
        return out


Records = Mapping[str, Record]


def issue_key(command: Command, pod: str) -> str:
    return command.name if command.target is Target.ONE else f"{command.name}@{pod}"


def record_of(key: str, records: Records, command: Command, uid: str) -> Record | None:
    """The record that counts for issuing ``command`` into the pod ``uid``."""
    r = records.get(key)
    if r is None:
        return None
    if command.target is Target.EACH and r.uid != uid:
        return None  # a former pod of the same name
    return r


def _attempts(value: object) -> int:
    """A record is written at its first attempt: a count of at least 1 (fewer would let a
    command run more often than its retry.attempts)."""
    if not whole(value) or value < 1:
        raise ValueError(f"attempts: want a whole number of at least 1, got {value!r:.40}")
    return value


def _time(value: object, key: str) -> float:
    """Epoch seconds: a finite number (NaN or Infinity would make a record never or always
    due)."""
    if not number(value):
        raise ValueError(f"{key}: want a number of seconds, got {value!r:.40}")
    seconds = real(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{key}: want a finite number of seconds")
    return seconds


def parse_records(text: str | None) -> dict[str, Record]:
    if not text:
        return {}
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        return {
            str(k): Record(
                state=State(v["state"]),
                attempts=_attempts(v["attempts"]),
                pod=str(v.get("pod", "")),
                uid=str(v.get("uid", "")),
                at=_time(v.get("at", 0.0), "at"),
                holder=str(v.get("holder", "")),
                retry_at=_time(v.get("retryAt", 0.0), "retryAt"),
                error=str(v.get("error", "")),
            )
            for k, v in raw.items()
        }
    except RecursionError:
        raise InvalidInput(f"annotation {ANN_RECORDS}: nested too deeply") from None
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidInput(f"annotation {ANN_RECORDS}: {e}") from None


def dump_records(records: Records) -> str:
    return json.dumps({k: records[k].to_json() for k in sorted(records)}, separators=(",", ":"))


def claimable(r: Record | None, command: Command, now: float) -> bool:
    """Whether an attempt may start now, given the record that counts."""
    if r is None:
        return True
    if r.state in (State.DONE, State.GAVE_UP):
        return False
    if r.state is State.FAILED:
        return r.retry_at <= now and r.attempts < command.retry.attempts
    # RUNNING and not in flight here: the incarnation that claimed it died or lost its lease,
    # and the command may still run: wait out its timeout so two copies never overlap.
    return now >= r.at + command.timeout_s


def claim(
    records: Records, command: Command, pod: str, uid: str, holder: str, now: float
) -> Record | None:
    """The RUNNING record to write before issuing, or None when the command must not be
    issued (done, given up, in flight, backing off). Decided on the freshly read records: this
    is the compare in the compare-and-swap that keeps a command from running twice."""
    key = issue_key(command, pod)
    r = record_of(key, records, command, uid)
    if not claimable(r, command, now):
        return None
    attempts = (r.attempts if r is not None else 0) + 1
    if attempts > command.retry.attempts:
        return None
    return Record(State.RUNNING, attempts, pod, uid, now, holder=holder)


def finish(
    claimed: Record,
    command: Command,
    *,
    error: str | None,
    now: float,
    rand: Callable[[], float],
) -> Record:
    """The record after the attempt: done, failed (retried after a backoff) or given up."""
    if error is None:
        return replace(claimed, state=State.DONE, at=now, holder="", error="")
    short = error if len(error) <= 300 else error[:297] + "..."
    if claimed.attempts >= command.retry.attempts:
        return replace(claimed, state=State.GAVE_UP, at=now, holder="", error=short)
    wait = backoff_s(claimed.attempts, command.retry.initial_s, command.retry.max_s, rand)
    return replace(claimed, state=State.FAILED, at=now, holder="", retry_at=now + wait, error=short)


def abandoned(r: Record | None, command: Command, now: float) -> bool:
    """Whether ``r`` is the last attempt, left RUNNING by a controller that is gone (the caller
    knows it is not its own), and timed out: no takeover will come, so it has given up."""
    return (
        r is not None
        and r.state is State.RUNNING
        and r.attempts >= command.retry.attempts
        and now >= r.at + command.timeout_s
    )


def give_up_abandoned(r: Record, now: float) -> Record:
    """The GAVE_UP record that replaces an :func:`abandoned` one."""
    return replace(
        r,
        state=State.GAVE_UP,
        at=now,
        holder="",
        error=f"the last attempt, left running by {r.holder or 'a former controller'}, timed out",
    )


def _rank(r: Record) -> tuple[int, int]:
    return (r.attempts, 0 if r.state is State.RUNNING else 1)


def merge(known: Records, incoming: Records) -> dict[str, Record]:
    """The most advanced record of each key: a record only moves forward (more attempts;
    RUNNING to an outcome), so a late watch event cannot take the cache back. (A hint for the
    cache only: whether to issue is decided on the API server's own records.)"""
    out = dict(known)
    for key, new in incoming.items():
        old = out.get(key)
        if old is None or old.uid != new.uid or _rank(new) >= _rank(old):
            out[key] = new
    return out


def same_attempt(a: Record | None, b: Record) -> bool:
    """Whether ``a`` is still attempt ``b`` as claimed (times are rounded on the wire)."""
    return (
        a is not None
        and a.state is State.RUNNING
        and (a.attempts, a.holder, a.uid) == (b.attempts, b.holder, b.uid)
    )
