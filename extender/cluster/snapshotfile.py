"""Read cluster objects from a YAML or JSON ``List``, as ``kubectl get -o yaml`` prints it.

Used by ``tidelease extender --snapshot FILE`` (dry runs against a copy of a cluster's objects)
and by the embedded demo. Objects of other kinds (Nodes, ConfigMaps, ...) are skipped; a file
that is not a List, or a tidelease object that does not parse, is an error naming the place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from common import contract
from common.errors import InvalidInput
from common.objects import parse_gpu_allocation, parse_gpu_node
from extender.cluster.store import MemoryStore

_KINDS = {
    "Pod",
    contract.KIND_GPU_NODE,
    contract.KIND_GPU_ALLOCATION,
    "Lease",
    contract.KIND_GPU_LEASE,
    "Namespace",
}


def objects_from_text(text: str, source: str = "snapshot") -> list[dict[str, Any]]:
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        docs = [d for d in yaml.load_all(text, Loader=loader) if d is not None]
    except yaml.YAMLError as e:
        raise InvalidInput(f"{source}: not YAML or JSON: {e}") from e
    items: list[Any] = []
    for doc in docs:
        if not isinstance(doc, dict):
            raise InvalidInput(f"{source}: each document must be an object")
        if doc.get("kind") == "List" or str(doc.get("kind", "")).endswith("List"):
            if not isinstance(doc.get("items"), list):
                raise InvalidInput(f"{source}: List without items")
            items.extend(doc["items"])
        else:
            items.append(doc)
    objects: list[dict[str, Any]] = []
    problems: list[str] = []
    for i, obj in enumerate(items):
        if not isinstance(obj, dict):
            problems.append(f"{source}: item {i} is not an object")
            continue
        kind = obj.get("kind")
        if kind not in _KINDS:
            continue
        try:
            if kind == contract.KIND_GPU_NODE:
                parse_gpu_node(obj)
            elif kind == contract.KIND_GPU_ALLOCATION:
                parse_gpu_allocation(obj)
        except InvalidInput as e:
            problems.extend(f"{source}: item {i}: {p}" for p in e.problems)
            continue
        objects.append(obj)
    if problems:
        raise InvalidInput(problems)
    return objects


def load_snapshot(path: Path) -> MemoryStore:
    try:
        text = path.read_text()
    except OSError as e:
        raise InvalidInput(f"cannot read snapshot {path}: {e}") from e
    return MemoryStore(objects_from_text(text, str(path)))
