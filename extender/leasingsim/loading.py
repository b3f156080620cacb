"""An admin's own cluster description and trace: formats, parsing with errors that name the
place of every problem, and writing them back (a starting point to edit).

**Cluster** (YAML or JSON)::

    seed: 7                     # optional: how groups' tiers are shuffled (default: --seed)
    nodes:                      # nodes one by one (optional)
      - name: gpu-a
        gpu_type: H20
        tiers: [HA, HA, HA, HA, MA, MA, LA, LA]     # one per GPU
        role: online            # optional: starts held by the online jobs (default shared)
      - {name: gpu-b, gpu_type: H20, gpus: 8, tier: HA}   # or: all GPUs of one tier
    groups:                     # many alike nodes (optional): <name>-0000, <name>-0001, ...
      - name: h20
        count: 500
        gpu_type: H20
        gpus_per_node: 8        # optional, default 8
        tiers: {HA: 0.7, MA: 0.2, LA: 0.1}   # shares of the group's GPUs
        role: shared
    failure_model:              # optional: failures drawn when the trace lists none
      rates_per_day: {HA: 0.002, MA: 0.01, LA: 0.08}   # failures per device-day
      repair_hours: [4, 24]     # uniform

**Trace** (YAML or JSON)::

    start: "2026-01-05T00:00:00Z"   # optional (UTC); minute 0
    step_minutes: 5                 # optional
    days: 14                        # optional (default: up to the last event)
    online_jobs:
      - name: recsys
        gpu_type: H20
        gpus_per_replica: 8         # optional, default 8
        min_tier: LA                # optional, default LA
        demand: [[0, 640], [360, 160], [600, 640]]   # [minute, GPUs]: holds until the next
        # or: schedule: [{at: "08:00", gpus: 640}, {at: "23:00", gpus: 160}]   (UTC, daily)
    borrowers:
      - {name: ft-1, arrival_minute: 0, gpus: 4, duration_minutes: 600,
         patience_minutes: 1440, gpu_type: H20, min_tier: LA}   # last three optional
    failures:                       # optional; without any, drawn from the failure model
      - {minute: 125, node: gpu-a, index: 5, repair_minutes: 480}

**Trace** (CSV): one record a row, a header naming the columns; ``kind`` says what the row is
and which columns it needs (others stay empty):

======== ================================================================================
kind     columns
======== ================================================================================
online   name, gpu_type, [gpus_per_replica], [min_tier]
demand   minute, name (an online job), gpus
schedule name (an online job), at (HH:MM UTC), gpus
borrower minute (arrival), name, gpus, duration_minutes, [patience_minutes], [gpu_type],
         [min_tier]
failure  minute, node, index, repair_minutes
======== ================================================================================
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml

from common.coercion import number
from common.errors import InvalidInput
from common.model import JobKey, NodeName, Tier
from extender.leasingsim.scenario import (
    DEFAULT_START,
    MINUTES_PER_DAY,
    BorrowerJob,
    ClusterSpec,
    DeviceFailure,
    FailureModel,
    NodeGroup,
    NodeSpec,
    OnlineJob,
    Role,
    Trace,
    check,
)
from extender.rightofreturn.rules import ScheduleEntry, parse_schedule_time

T = TypeVar("T")
_TIERS = {t.name: t for t in Tier}
_ROLES = {r.value: r for r in Role}
_MISSING: Any = object()


class _Problems:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(
            f"{self.source}: {where}: {message}" if where else f"{self.source}: {message}"
        )

    def raise_if_any(self) -> None:
        if self.items:
            raise InvalidInput(self.items)


class _Doc:
    """Typed reads of a parsed YAML/JSON mapping; every problem is recorded with its path."""

    def __init__(self, problems: _Problems) -> None:
        self.p = problems

    def mapping(self, value: object, where: str, known: Sequence[str]) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.p.add(where, f"want a mapping, got {_show(value)}")
            return None
        for key in value:
            if key not in known:
                self.p.add(where, f"unknown key {key!r} (known: {', '.join(known)})")
        return value

    def items(self, obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
        value = obj.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.p.add(_at(where, key), f"want a list, got {_show(value)}")
            return []
        return value

    def get(
        self,
        obj: Mapping[str, Any],
        key: str,
        where: str,
        conv: Callable[[object], T],
        what: str,
        default: T = _MISSING,
    ) -> T:
        value = obj.get(key)
        if value is None:
            if default is _MISSING:
                self.p.add(_at(where, key), "required")
                return default
            return default
        try:
            return conv(value)
        except (TypeError, ValueError):
            self.p.add(_at(where, key), f"want {what}, got {_show(value)}")
            return default


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- converters: raise ValueError on a bad value ---
def _int(minimum: int) -> Callable[[object], int]:
    def conv(value: object) -> int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            value = int(value.strip())
        if not isinstance(value, int) or value < minimum:
            raise ValueError
        return value

    return conv


def _number(minimum: float, *, above: bool = False) -> Callable[[object], float]:
    def conv(value: object) -> float:
        if isinstance(value, bool):
            raise ValueError
        x = float(value.strip()) if isinstance(value, str) else float(value)  # type: ignore[arg-type]
        if not math.isfinite(x) or x < minimum or (above and x <= minimum):
            raise ValueError
        return x

    return conv


def _text(value: object) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
        raise ValueError
    return str(value).strip()


def _tier(value: object) -> Tier:
    if not isinstance(value, str) or value.strip().upper() not in _TIERS:
        raise ValueError
    return _TIERS[value.strip().upper()]


def _role(value: object) -> Role:
    if not isinstance(value, str) or value.strip().lower() not in _ROLES:
        raise ValueError
    return _ROLES[value.strip().lower()]


def _time(value: object) -> float:
    if number(value):
        return float(value)
    if not isinstance(value, str):
        raise ValueError
    t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


_POS = _int(1)
_NONNEG = _int(0)
TIER_WANT = "HA, MA or LA"


# --- reading documents ---
def _load_document(text: str, source: str, problems: _Problems) -> object:
    if source.lower().endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            problems.add("", f"not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}")
            return None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problems.add("", f"not valid YAML{at}: {e.problem}")
    except yaml.YAMLError as e:
        problems.add("", f"not valid YAML: {e}")
    return None


def parse_cluster(text: str, source: str = "cluster") -> ClusterSpec:
    problems = _Problems(source)
    raw = _load_document(text, source, problems)
    problems.raise_if_any()
    d = _Doc(problems)
    top = d.mapping(raw, "", ["seed", "nodes", "groups", "failure_model"])
    if top is None:
        problems.raise_if_any()
        raise AssertionError  # unreachable: a problem was recorded
    seed = d.get(top, "seed", "", _NONNEG, "a non-negative integer", None)
    nodes: list[NodeSpec] = []
    for i, raw_node in enumerate(d.items(top, "nodes", "")):
        where = f"nodes[{i}]"
        n = d.mapping(raw_node, where, ["name", "gpu_type", "tiers", "gpus", "tier", "role"])
        if n is None:
            continue
        name = d.get(n, "name", where, _text, "a name")
        gpu_type = d.get(n, "gpu_type", where, _text, "a GPU type, e.g. H20")
        role = d.get(n, "role", where, _role, "online or shared", Role.SHARED)
        tiers: tuple[Tier, ...] = ()
        if "tiers" in n:
            if "gpus" in n or "tier" in n:
                d.p.add(where, "give tiers (one per GPU) or gpus and tier, not both")
            raw_tiers = d.items(n, "tiers", where)
            parsed = []
            for j, t in enumerate(raw_tiers):
                try:
                    parsed.append(_tier(t))
                except ValueError:
                    d.p.add(f"{where}.tiers[{j}]", f"want {TIER_WANT}, got {_show(t)}")
            tiers = tuple(parsed)
            if not raw_tiers:
                d.p.add(_at(where, "tiers"), "want at least one GPU")
        else:
            count = d.get(n, "gpus", where, _POS, "a positive integer", 8)
            tier = d.get(n, "tier", where, _tier, TIER_WANT, Tier.HA)
            if count is not _MISSING and tier is not _MISSING:
                tiers = (tier,) * count
        if name is not _MISSING and gpu_type is not _MISSING and tiers:
            nodes.append(NodeSpec(NodeName(name), gpu_type, tiers, role))
    groups: list[NodeGroup] = []
    for i, raw_group in enumerate(d.items(top, "groups", "")):
        where = f"groups[{i}]"
        g = d.mapping(
            raw_group, where, ["name", "count", "gpu_type", "gpus_per_node", "tiers", "role"]
        )
        if g is None:
            continue
        name = d.get(g, "name", where, _text, "a name")
        count = d.get(g, "count", where, _POS, "a positive integer")
        gpu_type = d.get(g, "gpu_type", where, _text, "a GPU type, e.g. H20")
        per_node = d.get(g, "gpus_per_node", where, _POS, "a positive integer", 8)
        role = d.get(g, "role", where, _role, "online or shared", Role.SHARED)
        mix = _tier_mix(d, g.get("tiers"), _at(where, "tiers"))
        if _MISSING not in (name, count, gpu_type, per_node) and mix:
            groups.append(NodeGroup(name, count, gpu_type, per_node, mix, role))
    model = FailureModel()
    if top.get("failure_model") is not None:
        model = _failure_model(d, top["failure_model"], "failure_model") or model
    if not nodes and not groups and not problems.items:
        problems.add("", "no nodes: give nodes, groups or both")
    problems.raise_if_any()
    spec = ClusterSpec(tuple(nodes), tuple(groups), model, seed)
    named = Counter(node.name for node in spec.expand(0))
    for twice in sorted(k for k, v in named.items() if v > 1)[:10]:
        problems.add("", f"node {twice!r} is named twice (check nodes and group names)")
    problems.raise_if_any()
    return spec


def _tier_mix(d: _Doc, value: object, where: str) -> tuple[tuple[Tier, float], ...]:
    if value is None:
        return ((Tier.HA, 1.0),)
    if not isinstance(value, dict):
        d.p.add(
            where, f"want shares per tier, e.g. {{HA: 0.7, MA: 0.2, LA: 0.1}}, got {_show(value)}"
        )
        return ()
    mix: list[tuple[Tier, float]] = []
    for key, share in value.items():
        try:
            tier = _tier(key)
        except ValueError:
            d.p.add(where, f"unknown tier {key!r} (want {TIER_WANT})")
            continue
        try:
            mix.append((tier, _number(0.0)(share)))
        except (TypeError, ValueError):
            d.p.add(f"{where}.{key}", f"want a share between 0 and 1, got {_show(share)}")
    total = sum(s for _, s in mix)
    if mix and abs(total - 1.0) > 0.01:
        d.p.add(where, f"shares add up to {total:g}, want 1")
        return ()
    return tuple(mix)


def _failure_model(d: _Doc, value: object, where: str) -> FailureModel | None:
    m = d.mapping(value, where, ["rates_per_day", "repair_hours"])
    if m is None:
        return None
    default = FailureModel()
    rates = default.rates_per_day
    if m.get("rates_per_day") is not None:
        raw = m["rates_per_day"]
        if not isinstance(raw, dict):
            d.p.add(_at(where, "rates_per_day"), f"want rates per tier, got {_show(raw)}")
        else:
            parsed = dict(default.rates_per_day)
            for key, rate in raw.items():
                try:
                    parsed[_tier(key)] = _number(0.0)(rate)
                except (TypeError, ValueError):
                    d.p.add(
                        f"{where}.rates_per_day.{key}",
                        f"want a tier ({TIER_WANT}) and a rate >= 0, got {_show(rate)}",
                    )
            rates = tuple(sorted(parsed.items(), key=lambda kv: -int(kv[0])))
    repair = default.repair_hours
    if m.get("repair_hours") is not None:
        raw = m["repair_hours"]
        ok = isinstance(raw, list) and len(raw) == 2
        try:
            lo, hi = (_number(0.0, above=True)(x) for x in raw) if ok else (0.0, 0.0)
            ok = ok and lo <= hi
        except (TypeError, ValueError):
            ok = False
        if ok:
            repair = (lo, hi)
        else:
            d.p.add(
                _at(where, "repair_hours"),
                f"want [min, max] hours, 0 < min <= max, got {_show(raw)}",
            )
    return FailureModel(rates, repair)


def parse_trace(
    text: str, source: str, nodes: Sequence[NodeSpec], *, days: float | None = None
) -> Trace:
    """A trace from YAML/JSON (or CSV when ``source`` ends in ``.csv``), checked against the
    cluster's ``nodes``; ``days`` overrides its length."""
    if source.lower().endswith(".csv"):
        trace = _parse_csv(text, source, days)
    else:
        trace = _parse_document(text, source, days)
    problems = check(nodes, trace)
    if problems:
        raise InvalidInput(problems)
    return trace


def _parse_document(text: str, source: str, days: float | None) -> Trace:
    problems = _Problems(source)
    raw = _load_document(text, source, problems)
    problems.raise_if_any()
    d = _Doc(problems)
    keys = ["start", "step_minutes", "days", "online_jobs", "borrowers", "failures"]
    top = d.mapping(raw, "", keys)
    if top is None:
        problems.raise_if_any()
        raise AssertionError
    start = d.get(top, "start", "", _time, "an ISO 8601 time or epoch seconds", DEFAULT_START)
    step = d.get(top, "step_minutes", "", _POS, "a positive integer", 5)
    length = d.get(top, "days", "", _number(0.0, above=True), "a positive number", None)
    online: list[OnlineJob] = []
    for i, raw_job in enumerate(d.items(top, "online_jobs", "")):
        where = f"online_jobs[{i}]"
        keys = ["name", "gpu_type", "gpus_per_replica", "min_tier", "demand", "schedule"]
        j = d.mapping(raw_job, where, keys)
        if j is None:
            continue
        name = d.get(j, "name", where, _text, "a name")
        gpu_type = d.get(j, "gpu_type", where, _text, "a GPU type, e.g. H20")
        per = d.get(j, "gpus_per_replica", where, _POS, "a positive integer", 8)
        tier = d.get(j, "min_tier", where, _tier, TIER_WANT, Tier.LA)
        demand: list[tuple[int, int]] = []
        for k, point in enumerate(d.items(j, "demand", where)):
            at = f"{where}.demand[{k}]"
            pair = (point.get("minute"), point.get("gpus")) if isinstance(point, dict) else point
            try:
                if not isinstance(pair, list | tuple) or len(pair) != 2:
                    raise ValueError
                demand.append((_NONNEG(pair[0]), _NONNEG(pair[1])))
            except (TypeError, ValueError):
                d.p.add(at, f"want [minute, GPUs], non-negative integers, got {_show(point)}")
        schedule: list[ScheduleEntry] = []
        for k, entry in enumerate(d.items(j, "schedule", where)):
            at = f"{where}.schedule[{k}]"
            e = d.mapping(entry, at, ["at", "gpus"])
            if e is None:
                continue
            minute = d.get(e, "at", at, lambda v: parse_schedule_time(str(v)), "HH:MM (UTC)")
            gpus = d.get(e, "gpus", at, _NONNEG, "a non-negative integer")
            if minute is not _MISSING and gpus is not _MISSING:
                schedule.append(ScheduleEntry(minute, gpus))
        if _MISSING not in (name, gpu_type, per, tier):
            online.append(
                OnlineJob(
                    JobKey(name),
                    gpu_type,
                    per,
                    tier,
                    _step_function(demand),
                    tuple(schedule),
                    source=f"{source}: {where}",
                )
            )
    borrowers: list[BorrowerJob] = []
    for i, raw_b in enumerate(d.items(top, "borrowers", "")):
        where = f"borrowers[{i}]"
        keys = [
            "name",
            "arrival_minute",
            "gpus",
            "duration_minutes",
            "patience_minutes",
            "gpu_type",
            "min_tier",
        ]
        b = d.mapping(raw_b, where, keys)
        if b is None:
            continue
        job = BorrowerJob(
            name=d.get(b, "name", where, _text, "a name", f"borrower-{i}"),
            arrival=d.get(b, "arrival_minute", where, _NONNEG, "a non-negative integer"),
            gpus=d.get(b, "gpus", where, _POS, "a positive integer"),
            duration=d.get(b, "duration_minutes", where, _POS, "a positive integer"),
            patience=d.get(
                b, "patience_minutes", where, _NONNEG, "a non-negative integer", MINUTES_PER_DAY
            ),
            gpu_type=d.get(b, "gpu_type", where, _text, "a GPU type, e.g. H20", None),
            min_tier=d.get(b, "min_tier", where, _tier, TIER_WANT, Tier.LA),
            source=f"{source}: {where}",
        )
        if _MISSING not in (job.arrival, job.gpus, job.duration, job.patience, job.min_tier):
            borrowers.append(job)
    failures: list[DeviceFailure] | None = None
    if top.get("failures") is not None:
        failures = []
        for i, raw_f in enumerate(d.items(top, "failures", "")):
            where = f"failures[{i}]"
            f = d.mapping(raw_f, where, ["minute", "node", "index", "repair_minutes"])
            if f is None:
                continue
            failure = DeviceFailure(
                at=d.get(f, "minute", where, _NONNEG, "a non-negative integer"),
                node=NodeName(d.get(f, "node", where, _text, "a node name")),
                index=d.get(f, "index", where, _NONNEG, "a non-negative integer"),
                repair=d.get(f, "repair_minutes", where, _POS, "a positive integer"),
                source=f"{source}: {where}",
            )
            if _MISSING not in (failure.at, failure.node, failure.index, failure.repair):
                failures.append(failure)
    problems.raise_if_any()
    return _trace(online, borrowers, failures or None, start, step, days or length)


def _step_function(points: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted by minute; of points at the same minute the last counts."""
    by_minute: dict[int, int] = {}
    for minute, gpus in points:
        by_minute[minute] = gpus
    return tuple(sorted(by_minute.items()))


def _trace(
    online: Sequence[OnlineJob],
    borrowers: Sequence[BorrowerJob],
    failures: Sequence[DeviceFailure] | None,
    start: float,
    step: int,
    days: float | None,
) -> Trace:
    if days is not None:
        minutes = max(step, round(days * MINUTES_PER_DAY))
    else:
        last = [m for j in online for m, _ in j.demand]
        last += [b.arrival + 1 for b in borrowers]
        last += [f.at for f in failures or ()]
        if any(j.schedule for j in online) and not last:
            last = [MINUTES_PER_DAY]
        minutes = max([step, *last])
        minutes = -(-minutes // MINUTES_PER_DAY) * MINUTES_PER_DAY  # whole days
    return Trace(
        minutes=minutes,
        online=tuple(online),
        borrowers=tuple(borrowers),
        failures=tuple(failures) if failures else None,
        start=start,
        step=step,
    )


CSV_COLUMNS = (
    "kind",
    "minute",
    "name",
    "gpus",
    "gpu_type",
    "min_tier",
    "gpus_per_replica",
    "at",
    "duration_minutes",
    "patience_minutes",
    "node",
    "index",
    "repair_minutes",
)
_CSV_KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # required, optional
    "online": (("name", "gpu_type"), ("gpus_per_replica", "min_tier")),
    "demand": (("minute", "name", "gpus"), ()),
    "schedule": (("name", "at", "gpus"), ()),
    "borrower": (
        ("minute", "name", "gpus", "duration_minutes"),
        ("patience_minutes", "gpu_type", "min_tier"),
    ),
    "failure": (("minute", "node", "index", "repair_minutes"), ()),
}


class _CsvRow:
    def __init__(self, values: Mapping[str, str], where: str, problems: _Problems) -> None:
        self.values, self.where, self.problems = values, where, problems

    def get(self, col: str, conv: Callable[[object], T], what: str, default: T = _MISSING) -> T:
        value = self.values.get(col)
        if value is None:
            return default
        try:
            return conv(value)
        except (TypeError, ValueError):
            self.problems.add(self.where, f"{col}: want {what}, got {value!r}")
            return _MISSING  # type: ignore[no-any-return]


def _parse_csv(text: str, source: str, days: float | None) -> Trace:
    problems = _Problems(source)
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    for row in reader:
        if row and any(c.strip() for c in row) and not row[0].lstrip().startswith("#"):
            header = [c.strip() for c in row]
            break
    if header is None:
        problems.add("", "empty: want a header row naming the columns, then one record a row")
        problems.raise_if_any()
        raise AssertionError
    for col in header:
        if col not in CSV_COLUMNS:
            problems.add(
                f"line {reader.line_num}",
                f"unknown column {col!r} (known: {', '.join(CSV_COLUMNS)})",
            )
    if "kind" not in header:
        problems.add(f"line {reader.line_num}", "no 'kind' column")
    problems.raise_if_any()
    jobs: dict[str, dict[str, Any]] = {}
    borrowers: list[BorrowerJob] = []
    failures: list[DeviceFailure] = []
    later: list[tuple[str, str, dict[str, str]]] = []  # demand and schedule rows
    for row in reader:
        if not row or not any(c.strip() for c in row) or row[0].lstrip().startswith("#"):
            continue
        line = f"line {reader.line_num}"
        if len(row) > len(header):
            problems.add(line, f"{len(row)} fields, the header names {len(header)}")
            continue
        rec = {col: (row[i].strip() if i < len(row) else "") for i, col in enumerate(header)}
        kind = rec.get("kind", "").lower()
        if kind not in _CSV_KINDS:
            problems.add(
                line, f"kind: want one of {', '.join(_CSV_KINDS)}, got {rec.get('kind')!r}"
            )
            continue
        where = f"{line} ({kind})"
        required, optional = _CSV_KINDS[kind]
        values: dict[str, str] = {}
        for col in CSV_COLUMNS[1:]:
            value = rec.get(col, "")
            if not value:
                if col in required:
                    problems.add(where, f"{col}: required")
                continue
            if col not in required and col not in optional:
                problems.add(where, f"{col}: not used by {kind} rows (leave it empty)")
                continue
            values[col] = value
        if any(c not in values for c in required):
            continue
        get = _CsvRow(values, where, problems).get
        if kind == "online":
            name = values["name"]
            if name in jobs:
                problems.add(where, f"online job {name!r} is declared twice")
                continue
            jobs[name] = {
                "gpu_type": values["gpu_type"],
                "per": get("gpus_per_replica", _POS, "a positive integer", 8),
                "tier": get("min_tier", _tier, TIER_WANT, Tier.LA),
                "demand": [],
                "schedule": [],
                "source": f"{source} {line}",
            }
        elif kind in ("demand", "schedule"):
            later.append((kind, where, values))
        elif kind == "borrower":
            job = BorrowerJob(
                name=values["name"],
                arrival=get("minute", _NONNEG, "a non-negative integer"),
                gpus=get("gpus", _POS, "a positive integer"),
                duration=get("duration_minutes", _POS, "a positive integer"),
                patience=get(
                    "patience_minutes", _NONNEG, "a non-negative integer", MINUTES_PER_DAY
                ),
                gpu_type=values.get("gpu_type"),
                min_tier=get("min_tier", _tier, TIER_WANT, Tier.LA),
                source=f"{source} {line}",
            )
            if _MISSING not in (job.arrival, job.gpus, job.duration, job.patience, job.min_tier):
                borrowers.append(job)
        else:
            failure = DeviceFailure(
                at=get("minute", _NONNEG, "a non-negative integer"),
                node=NodeName(values["node"]),
                index=get("index", _NONNEG, "a non-negative integer"),
                repair=get("repair_minutes", _POS, "a positive integer"),
                source=f"{source} {line}",
            )
            if _MISSING not in (failure.at, failure.index, failure.repair):
                failures.append(failure)
    for kind, where, values in later:
        job_rec = jobs.get(values["name"])
        if job_rec is None:
            problems.add(where, f"online job {values['name']!r} is not declared by an 'online' row")
            continue
        try:
            gpus = _NONNEG(values["gpus"])
        except ValueError:
            problems.add(where, f"gpus: want a non-negative integer, got {values['gpus']!r}")
            continue
        if kind == "demand":
            try:
                job_rec["demand"].append((_NONNEG(values["minute"]), gpus))
            except ValueError:
                problems.add(
                    where, f"minute: want a non-negative integer, got {values['minute']!r}"
                )
        else:
            try:
                job_rec["schedule"].append(ScheduleEntry(parse_schedule_time(values["at"]), gpus))
            except ValueError as e:
                problems.add(where, f"at: {e}")
    problems.raise_if_any()
    online = [
        OnlineJob(
            JobKey(name),
            rec["gpu_type"],
            rec["per"],
            rec["tier"],
            _step_function(rec["demand"]),
            tuple(rec["schedule"]),
            source=rec["source"],
        )
        for name, rec in jobs.items()
    ]
    return _trace(online, borrowers, failures or None, DEFAULT_START, 5, days)


def load_cluster(path: Path) -> ClusterSpec:
    return parse_cluster(_read(path), str(path))


def load_trace(path: Path, nodes: Sequence[NodeSpec], *, days: float | None = None) -> Trace:
    return parse_trace(_read(path), str(path), nodes, days=days)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidInput(f"{path}: cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e


# --- writing (a starting point for an admin's own files) ---
def cluster_document(nodes: Sequence[NodeSpec], model: FailureModel) -> str:
    doc = {
        "nodes": [
            {
                "name": n.name,
                "gpu_type": n.gpu_type,
                "tiers": [t.name for t in n.tiers],
                **({"role": n.role.value} if n.role is not Role.SHARED else {}),
            }
            for n in nodes
        ],
        "failure_model": {
            "rates_per_day": {t.name: r for t, r in model.rates_per_day},
            "repair_hours": list(model.repair_hours),
        },
    }
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


def trace_csv(trace: Trace, failures: Sequence[DeviceFailure] = ()) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for j in trace.online:
        w.writerow(
            {
                "kind": "online",
                "name": j.name,
                "gpu_type": j.gpu_type,
                "gpus_per_replica": j.gpus_per_replica,
                "min_tier": j.min_tier.name,
            }
        )
        for minute, gpus in j.demand:
            w.writerow({"kind": "demand", "minute": minute, "name": j.name, "gpus": gpus})
        for e in j.schedule:
            at = f"{e.minute_of_day // 60:02d}:{e.minute_of_day % 60:02d}"
            w.writerow({"kind": "schedule", "name": j.name, "at": at, "gpus": e.gpus})
    for b in trace.borrowers:
        w.writerow(
            {
                "kind": "borrower",
                "minute": b.arrival,
                "name": b.name,
                "gpus": b.gpus,
                "duration_minutes": b.duration,
                "patience_minutes": b.patience,
                "gpu_type": b.gpu_type or "",
                "min_tier": b.min_tier.name,
            }
        )
    for f in failures or trace.failures or ():
        w.writerow(
            {
                "kind": "failure",
                "minute": f.at,
                "node": f.node,
                "index": f.index,
                "repair_minutes": f.repair,
            }
        )
    return out.getvalue()
