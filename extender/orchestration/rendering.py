"""What a command line and a ``discover_hosts`` script say about the job's peers. Pure.

Command arguments may hold placeholders, filled from the snapshot when the command is issued:

- ``{{address:ROLE}}`` the address of the first ready pod of ROLE (by name, ordinals in order);
- ``{{addresses:ROLE}}`` the addresses of every ready pod of ROLE, comma-separated;
- ``{{hosts:ROLE}}`` the same as ``address:slots`` pairs (``mpirun -H``);
- ``{{count:ROLE}}`` how many pods of ROLE are ready; ``{{replicas:ROLE}}`` how many are expected;
- ``{{pod}}``, ``{{namespace}}``, ``{{job}}`` the target pod, its namespace, the job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.orchestration.jobreadiness import PodState, Snapshot

PLACEHOLDER = re.compile(r"\{\{\s*([a-z]+)(?::([A-Za-z0-9._-]+))?\s*\}\}")
ROLE_FIELDS = frozenset({"address", "addresses", "hosts", "count", "replicas"})
PLAIN_FIELDS = frozenset({"pod", "namespace", "job"})


def placeholder_problems(arg: str, roles: Sequence[str]) -> list[str]:
    """What is wrong with the placeholders of one argument (empty: nothing)."""
    problems = []
    for m in PLACEHOLDER.finditer(arg):
        name, role = m.group(1), m.group(2)
        if name in ROLE_FIELDS:
            if role is None:
                problems.append(f'placeholder "{m.group(0)}" needs a role: {{{{{name}:ROLE}}}}')
            elif role not in roles:
                problems.append(f'placeholder "{m.group(0)}": unknown role "{role}"')
        elif name in PLAIN_FIELDS:
            if role is not None:
                problems.append(f'placeholder "{m.group(0)}" takes no role')
        else:
            problems.append(f'unknown placeholder "{m.group(0)}"')
    rest = PLACEHOLDER.sub("", arg)
    if "{{" in rest:
        problems.append(f"unterminated or malformed placeholder in {arg!r}")
    return problems


@dataclass(frozen=True)
class Context:
    """What placeholders are filled from."""

    namespace: str
    job: str
    pod: str
    snapshot: Snapshot
    replicas: Mapping[str, int]


def host_of(pod: PodState) -> str:
    return f"{pod.address}:{pod.slots}"


def render(args: Sequence[str], ctx: Context) -> tuple[str, ...]:
    """``args`` with every placeholder filled (they were validated when the file was loaded)."""

    def fill(m: re.Match[str]) -> str:
        name, role = m.group(1), m.group(2) or ""
        if name == "pod":
            return ctx.pod
        if name == "namespace":
            return ctx.namespace
        if name == "job":
            return ctx.job
        ready = ctx.snapshot.ready(role)
        if name == "address":
            return ready[0].address if ready else ""
        if name == "addresses":
            return ",".join(p.address for p in ready)
        if name == "hosts":
            return ",".join(host_of(p) for p in ready)
        if name == "count":
            return str(len(ready))
        return str(ctx.replicas.get(role, 0))

    return tuple(PLACEHOLDER.sub(fill, a) for a in args)


def hosts_lines(pods: Sequence[PodState]) -> str:
    """``host:slots`` lines, one per ready pod, as ``horovodrun --host-discovery-script`` reads."""
    return "".join(f"{host_of(p)}\n" for p in pods)


def discover_hosts_script(hosts: str) -> str:
    """A POSIX shell script printing ``hosts`` (kept in a ConfigMap, mounted in the launcher)."""
    return (
        "#!/bin/sh\n"
        "# Written by the tidelease orchestrator from the job's ready worker pods.\n"
        "cat <<'TIDELEASE_HOSTS'\n"
        f"{hosts}"
        "TIDELEASE_HOSTS\n"
    )


def detached(argv: Sequence[str], settle_s: float) -> tuple[str, ...]:
    """``argv`` started in the background of the container (output to its PID 1's stdout, so
    ``kubectl logs`` shows it): the exec returns once it has run ``settle_s`` seconds (success)
    or exited before that (its own exit status). Needs a POSIX ``sh`` in the container."""
    script = (
        'nohup "$@" >/proc/1/fd/1 2>&1 </dev/null & pid=$!; '
        f"sleep {settle_s:g}; "
        'if kill -0 "$pid" 2>/dev/null; then exit 0; fi; wait "$pid"'
    )
    return ("sh", "-c", script, "tidelease-detach", *argv)
