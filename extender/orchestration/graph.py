"""The dependency file as a DAG: one node per command, an edge from each command named in
``after`` to the command that waits for it. Pure.

Reference: weflex 3.4 (docs/references.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from common.errors import InvalidInput
from extender.orchestration.depfile import Command, DependencyFile, parse


@dataclass(frozen=True)
class Dag:
    file: DependencyFile
    order: tuple[Command, ...]  # a topological order: every command after those it waits for
    dependents: Mapping[str, tuple[str, ...]]  # command -> the commands that wait for it

    def command(self, name: str) -> Command:
        for c in self.order:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def roles(self) -> Mapping[str, int | None]:
        return self.file.roles


def find_cycle(edges: Mapping[str, tuple[str, ...]]) -> list[str] | None:
    """A cycle of ``edges`` (node -> the nodes it waits for) as [a, b, ..., a], or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(edges, white)
    for start in edges:
        if color[start] != white:
            continue
        path: list[str] = [start]
        stack = [iter(edges[start])]
        color[start] = grey
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                color[path.pop()] = black
                continue
            if color.get(nxt, black) == grey:
                return [*path[path.index(nxt) :], nxt]
            if color.get(nxt) == white:
                color[nxt] = grey
                path.append(nxt)
                stack.append(iter(edges[nxt]))
    return None


def build(file: DependencyFile) -> Dag:
    """The DAG of ``file``; raises InvalidInput naming a cycle (``cycle: a -> b -> a``)."""
    edges = {c.name: c.after for c in file.commands}
    cycle = find_cycle(edges)
    if cycle is not None:
        raise InvalidInput(f"cycle: {' -> '.join(cycle)}")
    # Kahn's algorithm, keeping the file's order among commands that are free together.
    by_name = {c.name: c for c in file.commands}
    waiting = {c.name: len(c.after) for c in file.commands}
    dependents: dict[str, list[str]] = {c.name: [] for c in file.commands}
    for c in file.commands:
        for dep in c.after:
            dependents[dep].append(c.name)
    order: list[Command] = []
    free = [c.name for c in file.commands if not c.after]
    while free:
        name = free.pop(0)
        order.append(by_name[name])
        for d in dependents[name]:
            waiting[d] -= 1
            if waiting[d] == 0:
                free.append(d)
    return Dag(file, tuple(order), {k: tuple(v) for k, v in dependents.items()})


def load(text: str) -> Dag:
    """Parse, validate and build; InvalidInput lists every problem with its place."""
    return build(parse(text))
