"""The dependency file a framework ships: its commands, the role of the pods each runs in, and what
must hold before each runs (its preconditions). Parsed and validated once, into frozen values; every
problem is reported at once, each with its place in the file (``commands[2].after[0]: unknown
command "ray-head"``). Pure.

.. code-block:: yaml

    apiVersion: tidelease.io/v1alpha1
    kind: Dependencies
    framework: mpi
    roles:
      launcher: {replicas: 1}
      worker: {}                  # replicas from the job
    discovery: {role: worker}     # elastic Horovod: discover_hosts from the ready workers
    commands:
      - name: mpirun
        role: launcher            # runs in a pod of this role
        target: one               # one: the first ready pod; each: every ready pod
        run: [mpirun, -H, "{{hosts:worker}}", python, train.py]
        after: []                 # commands that must be done first
        when:
          - {role: worker, ready: all}   # all: every expected pod; N: at least N
        timeoutSeconds: 600
        retry: {attempts: 5, initialSeconds: 1, maxSeconds: 60}
        # detach: {settleSeconds: 3}   # long-running: start it in the background, done if
                                       # it still runs (or exited 0) after settleSeconds

docs/orchestration.md describes the semantics.

Reference: weflex 3.4 (docs/references.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import yaml

from common import contract
from common.coercion import number, real, whole
from common.errors import InvalidInput
from extender.orchestration.rendering import placeholder_problems

API_VERSION: Final = f"{contract.PREFIX}/v1alpha1"
KIND: Final = "Dependencies"
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 63


class Target(StrEnum):
    ONE = "one"  # once per job, in the first ready pod of the role
    EACH = "each"  # once in every ready pod of the role (pods that join later too)


@dataclass(frozen=True)
class ReadyCondition:
    """Pods of ``role`` ready: all expected replicas (``count`` None) or at least ``count``."""

    role: str
    count: int | None = None

    def describe(self) -> str:
        return f"{'all' if self.count is None else f'at least {self.count}'} {self.role} ready"


@dataclass(frozen=True)
class Retry:
    attempts: int = 5  # issues in all, the first one included
    initial_s: float = 1.0
    max_s: float = 60.0


@dataclass(frozen=True)
class Command:
    name: str
    role: str
    run: tuple[str, ...]
    target: Target = Target.ONE
    container: str | None = None
    after: tuple[str, ...] = ()
    when: tuple[ReadyCondition, ...] = ()
    timeout_s: float = 300.0
    retry: Retry = Retry()
    detach_s: float | None = None  # start in the background; done if still running after this


@dataclass(frozen=True)
class Discovery:
    """Keep a discover_hosts script of the ready pods of ``role`` in a ConfigMap."""

    role: str
    slots: int | None = None  # None: each pod's GPUs (at least 1)


@dataclass(frozen=True)
class DependencyFile:
    framework: str
    roles: Mapping[str, int | None]  # role -> default replica count (None: the job gives it)
    commands: tuple[Command, ...]
    discovery: Discovery | None = None


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}" if where else what)

    def fields(self, where: str, value: Mapping[Any, Any], allowed: set[str]) -> None:
        for key in value:
            if key is True:  # YAML 1.1 reads a bare ``on:`` key as a boolean
                self.add(where, 'unknown field "on" (YAML reads it as true; use "target")')
            elif key not in allowed:
                self.add(where, f'unknown field "{key}" (known: {", ".join(sorted(allowed))})')


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _mapping(p: _Problems, where: str, value: Any, *, nullable: bool = False) -> dict[str, Any]:
    if value is None and nullable:
        return {}
    if not isinstance(value, dict):
        p.add(where, f"want a mapping, got {_kind(value)}")
        return {}
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f'the string "{value}"'
    if isinstance(value, list):
        return "a list"
    return "a mapping" if isinstance(value, dict) else type(value).__name__


def _int(p: _Problems, where: str, value: Any, minimum: int) -> int | None:
    if not whole(value):
        p.add(where, f"want an integer, got {_kind(value)}")
        return None
    if value < minimum:
        p.add(where, f"want at least {minimum}, got {value}")
        return None
    return value


def _seconds(p: _Problems, where: str, value: Any) -> float | None:
    if not number(value):
        p.add(where, f"want a number of seconds, got {_kind(value)}")
        return None
    seconds = real(value)  # an integer past the largest float is infinite
    if not math.isfinite(seconds):  # .inf, .nan: a command never timed out, a retry never due
        p.add(where, f"want a finite number of seconds, got {_kind(value)}")
        return None
    if seconds <= 0:
        p.add(where, f"want a positive number of seconds, got {value}")
        return None
    return seconds


def _name(p: _Problems, where: str, value: Any, what: str) -> str | None:
    if not isinstance(value, str) or not value:
        p.add(where, f"want a {what} name, got {_kind(value)}")
        return None
    if len(value) > MAX_NAME or not NAME.match(value):
        p.add(where, f'"{value}" is not a valid {what} name (lower-case DNS label)')
        return None
    return value


def _parse_yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        place = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InvalidInput(f"{place}{e.problem or e.context or 'not valid YAML'}") from None
    except yaml.YAMLError as e:
        raise InvalidInput(f"not valid YAML: {e}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise InvalidInput("not valid YAML: nested too deeply") from None
    except ValueError as e:  # an integer too long to convert (int's digit limit)
        raise InvalidInput(f"not valid YAML: {e}") from None


def parse(text: str) -> DependencyFile:
    """The file's contents; raises InvalidInput listing every problem (cycles are found by
    :func:`extender.orchestration.graph.build`)."""
    doc = _parse_yaml(text)
    if doc is None:
        raise InvalidInput("the file is empty")
    p = _Problems()
    top = _mapping(p, "", doc)
    if not top:
        if not p.items:
            p.add("", "the file is empty")
        raise InvalidInput(p.items)
    p.fields(
        "",
        top,
        {"apiVersion", "kind", "framework", "description", "roles", "discovery", "commands"},
    )
    if top.get("apiVersion") != API_VERSION:
        p.add("apiVersion", f'want "{API_VERSION}", got {_kind(top.get("apiVersion"))}')
    if top.get("kind") != KIND:
        p.add("kind", f'want "{KIND}", got {_kind(top.get("kind"))}')
    framework = top.get("framework", "")
    if not isinstance(framework, str):
        p.add("framework", f"want a string, got {_kind(framework)}")
        framework = ""

    roles: dict[str, int | None] = {}
    raw_roles = top.get("roles")
    if raw_roles is None:
        p.add("roles", "missing: name the roles the commands run in")
    for role, body in _mapping(p, "roles", raw_roles, nullable=True).items():
        where = f"roles.{role}"
        name = _name(p, where, role, "role")
        spec = _mapping(p, where, body, nullable=True)
        p.fields(where, spec, {"replicas", "description"})
        replicas = None
        if "replicas" in spec:
            replicas = _int(p, f"{where}.replicas", spec["replicas"], 0)
        if name is not None:
            roles[name] = replicas
    role_names = list(roles)

    def known_role(where: str, value: Any) -> str | None:
        if not isinstance(value, str) or not value:
            p.add(where, f"want a role name, got {_kind(value)}")
            return None
        if raw_roles is not None and value not in roles:
            known = ", ".join(f'"{r}"' for r in role_names) or "none"
            p.add(where, f'unknown role "{value}" (roles: {known})')
            return None
        return value

    discovery = None
    if top.get("discovery") is not None:
        spec = _mapping(p, "discovery", top["discovery"])
        p.fields("discovery", spec, {"role", "slots"})
        discovery_role = known_role("discovery.role", spec.get("role"))
        slots = None
        if "slots" in spec:
            slots = _int(p, "discovery.slots", spec["slots"], 1)
        if discovery_role is not None:
            discovery = Discovery(discovery_role, slots)

    raw_commands = top.get("commands")
    if not isinstance(raw_commands, list) or not raw_commands:
        p.add("commands", f"want a non-empty list of commands, got {_kind(raw_commands)}")
        raw_commands = []
    first_at: dict[str, str] = {}
    for i, body in enumerate(raw_commands):
        where = f"commands[{i}]"
        spec = _mapping(p, where, body)
        name = spec.get("name")
        if isinstance(name, str) and name in first_at:
            p.add(f"{where}.name", f'duplicate command "{name}" (first at {first_at[name]})')
        elif isinstance(name, str):
            first_at[name] = where
    commands = []
    for i, body in enumerate(raw_commands):
        command = _command(p, f"commands[{i}]", body, first_at, known_role, role_names)
        if command is not None:
            commands.append(command)
    if p.items:
        raise InvalidInput(p.items)
    return DependencyFile(framework, roles, tuple(commands), discovery)


def _command(
    p: _Problems,
    where: str,
    body: Any,
    names: Mapping[str, str],
    known_role: Any,
    role_names: list[str],
) -> Command | None:
    if not isinstance(body, dict):
        return None  # reported with the names
    before = len(p.items)
    p.fields(
        where,
        body,
        {
            "name",
            "role",
            "target",
            "container",
            "run",
            "after",
            "when",
            "timeoutSeconds",
            "retry",
            "detach",
            "description",
        },
    )
    name = _name(p, _join(where, "name"), body.get("name"), "command")
    role = known_role(_join(where, "role"), body.get("role"))
    target = Target.ONE
    if "target" in body:
        try:
            target = Target(body["target"])
        except ValueError:
            p.add(_join(where, "target"), f'want "one" or "each", got {_kind(body["target"])}')
    container = body.get("container")
    if container is not None and (not isinstance(container, str) or not container):
        p.add(_join(where, "container"), f"want a container name, got {_kind(container)}")
        container = None
    run = body.get("run")
    args: list[str] = []
    if not isinstance(run, list) or not run:
        p.add(
            _join(where, "run"),
            f"want a non-empty list of arguments (argv, no shell), got {_kind(run)}",
        )
    else:
        for j, arg in enumerate(run):
            if isinstance(arg, bool) or not isinstance(arg, str | int | float):
                p.add(f"{where}.run[{j}]", f"want a string, got {_kind(arg)}")
                continue
            for problem in placeholder_problems(str(arg), role_names):
                p.add(f"{where}.run[{j}]", problem)
            args.append(str(arg))
    after: list[str] = []
    raw_after = body.get("after", [])
    if not isinstance(raw_after, list):
        p.add(_join(where, "after"), f"want a list of command names, got {_kind(raw_after)}")
        raw_after = []
    for j, dep in enumerate(raw_after):
        if not isinstance(dep, str) or dep not in names:
            shown = f'"{dep}"' if isinstance(dep, str) else _kind(dep)
            p.add(f"{where}.after[{j}]", f"unknown command {shown}")
        elif dep in after:
            p.add(f"{where}.after[{j}]", f'"{dep}" is listed twice')
        else:
            after.append(dep)
    when: list[ReadyCondition] = []
    raw_when = body.get("when", [])
    if not isinstance(raw_when, list):
        p.add(_join(where, "when"), f"want a list of conditions, got {_kind(raw_when)}")
        raw_when = []
    for j, cond in enumerate(raw_when):
        cwhere = f"{where}.when[{j}]"
        spec = _mapping(p, cwhere, cond)
        if not spec:
            continue
        p.fields(cwhere, spec, {"role", "ready"})
        crole = known_role(f"{cwhere}.role", spec.get("role"))
        ready = spec.get("ready", "all")
        count: int | None = None
        if ready != "all":
            if not whole(ready) or ready < 1:
                p.add(f"{cwhere}.ready", f'want "all" or a count of at least 1, got {_kind(ready)}')
                continue
            count = ready
        if crole is not None:
            when.append(ReadyCondition(crole, count))
    timeout = 300.0
    if "timeoutSeconds" in body:
        timeout = _seconds(p, _join(where, "timeoutSeconds"), body["timeoutSeconds"]) or timeout
    retry = Retry()
    if "retry" in body:
        rwhere = _join(where, "retry")
        spec = _mapping(p, rwhere, body["retry"])
        p.fields(rwhere, spec, {"attempts", "initialSeconds", "maxSeconds"})
        attempts = _int(p, f"{rwhere}.attempts", spec.get("attempts", retry.attempts), 1)
        initial = _seconds(p, f"{rwhere}.initialSeconds", spec.get("initialSeconds", 1.0))
        cap = _seconds(p, f"{rwhere}.maxSeconds", spec.get("maxSeconds", max(60.0, initial or 0)))
        if initial is not None and cap is not None and cap < initial:
            p.add(f"{rwhere}.maxSeconds", f"want at least initialSeconds ({initial:g})")
        elif attempts is not None and initial is not None and cap is not None:
            retry = Retry(attempts, initial, cap)
    detach_s = None
    if "detach" in body:
        dwhere = _join(where, "detach")
        spec = _mapping(p, dwhere, body["detach"])
        p.fields(dwhere, spec, {"settleSeconds"})
        detach_s = _seconds(p, f"{dwhere}.settleSeconds", spec.get("settleSeconds", 2.0))
        if detach_s is not None and detach_s >= timeout:
            p.add(f"{dwhere}.settleSeconds", f"want less than timeoutSeconds ({timeout:g})")
    if len(p.items) > before or name is None or role is None:
        return None
    return Command(
        name=name,
        role=role,
        run=tuple(args),
        target=target,
        container=container,
        after=tuple(after),
        when=tuple(when),
        timeout_s=timeout,
        retry=retry,
        detach_s=detach_s,
    )
