"""kube-scheduler's extender v1 wire format (k8s.io/kube-scheduler/extender/v1), parsed once.

Keys are PascalCase as Go's encoding/json writes them. Go decodes keys case-insensitively, but
kube-scheduler always sends the exact field names, and so do we. Raw dicts stop here: handlers
get frozen dataclasses, and replies are built by the functions at the bottom.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, Final

from common.coercion import whole
from common.errors import InvalidInput
from extender.scheduler.victims import Proposal

# Go's int64, the type of NumPDBViolations: a larger count could not be read back.
INT64_MAX: Final = 2**63 - 1


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or InvalidInput.

    Refused too: NaN and Infinity (Python extensions, which Go could not read back where a
    reply echoes the request's objects), integers too long to convert (ValueError) and nesting
    deeper than the interpreter's recursion limit (RecursionError).
    """
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise InvalidInput("request body is not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidInput(f"request body is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise InvalidInput("request body must be a JSON object")
    return value


@dataclass(frozen=True, slots=True)
class Encoded:
    """A reply encoded already (see :func:`encoded_filter_result`)."""

    body: bytes


def encode(value: object) -> bytes:
    if isinstance(value, Encoded):
        return value.body
    return json.dumps(value, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """Filter and prioritize input. Exactly one of ``node_names`` / ``nodes`` is the source."""

    pod: dict[str, Any]
    node_names: tuple[str, ...]
    nodes: tuple[dict[str, Any], ...] | None  # full v1.Node objects when not nodeCacheCapable

    @property
    def cache_capable(self) -> bool:
        return self.nodes is None


def _pod(body: Mapping[str, Any]) -> dict[str, Any]:
    pod = body.get("Pod")
    if not isinstance(pod, dict):
        raise InvalidInput("Pod is missing or not an object")
    return pod


def pod_fields(body: object) -> dict[str, str]:
    """The pod a verb's body is about, as log fields (namespace, name); none where the body
    does not say (it is then refused, with its own message)."""
    if not isinstance(body, Mapping):
        return {}
    if "PodName" in body:  # bind
        ns, name = body.get("PodNamespace"), body.get("PodName")
    else:
        pod = body.get("Pod")
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        ns, name = meta.get("namespace"), meta.get("name")
    fields = {"namespace": ns, "name": name}
    return {k: v for k, v in fields.items() if isinstance(v, str) and v}


def parse_extender_args(body: Mapping[str, Any]) -> ExtenderArgs:
    pod = _pod(body)
    names = body.get("NodeNames")
    nodes = body.get("Nodes")
    if names is not None:
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise InvalidInput("NodeNames must be a list of strings")
        return ExtenderArgs(pod, tuple(names), None)
    if nodes is None:
        raise InvalidInput("either NodeNames (nodeCacheCapable) or Nodes must be set")
    if not isinstance(nodes, dict):
        raise InvalidInput("Nodes must be a NodeList object")
    items = nodes.get("items") or []
    if not isinstance(items, list):
        raise InvalidInput("Nodes.items must be a list")
    out_names: list[str] = []
    for i, node in enumerate(items):
        meta = node.get("metadata") if isinstance(node, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"Nodes.items[{i}].metadata.name must be a non-empty string")
        out_names.append(name)
    return ExtenderArgs(pod, tuple(out_names), tuple(items))


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def parse_binding_args(body: Mapping[str, Any]) -> BindingArgs:
    values = {k: body.get(k) for k in ("PodName", "PodNamespace", "PodUID", "Node")}
    bad = [k for k, v in values.items() if not isinstance(v, str) or not v]
    if bad:
        raise InvalidInput(f"{', '.join(bad)} must be non-empty strings")
    return BindingArgs(
        pod_name=str(values["PodName"]),
        pod_namespace=str(values["PodNamespace"]),
        pod_uid=str(values["PodUID"]),
        node=str(values["Node"]),
    )


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: dict[str, Any]
    proposals: dict[str, Proposal]
    meta: bool  # whether the request came in the NodeNameToMetaVictims form


def _pdb(value: object, where: str) -> int:
    if value is None:
        return 0
    if not whole(value) or not 0 <= value <= INT64_MAX:
        raise InvalidInput(f"{where}.NumPDBViolations must be an integer from 0 to 2^63-1")
    return value


def _uids(pods: object, where: str, *, full: bool) -> tuple[str, ...]:
    if pods is None:
        return ()
    if not isinstance(pods, list):
        raise InvalidInput(f"{where}.Pods must be a list")
    uids = []
    for i, p in enumerate(pods):
        if not isinstance(p, dict):
            raise InvalidInput(f"{where}.Pods[{i}] must be an object")
        if full:
            meta = p.get("metadata")
            uid = meta.get("uid") if isinstance(meta, dict) else None
        else:
            uid = p.get("UID")
        if not isinstance(uid, str) or not uid:
            field = "metadata.uid" if full else "UID"
            raise InvalidInput(f"{where}.Pods[{i}].{field} must be a non-empty string")
        uids.append(uid)
    return tuple(uids)


def parse_preemption_args(body: Mapping[str, Any]) -> PreemptionArgs:
    pod = _pod(body)
    meta_map = body.get("NodeNameToMetaVictims")
    full_map = body.get("NodeNameToVictims")
    meta = meta_map is not None
    source = meta_map if meta else full_map
    if source is None:
        source = {}
    if not isinstance(source, dict):
        key = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
        raise InvalidInput(f"{key} must be an object")
    proposals: dict[str, Proposal] = {}
    for node, victims in source.items():
        where = f"victims of node {node}"
        if victims is None:
            victims = {}
        if not isinstance(victims, dict):
            raise InvalidInput(f"{where} must be an object")
        proposals[node] = Proposal(
            victims=_uids(victims.get("Pods"), where, full=not meta),
            pdb_violations=_pdb(victims.get("NumPDBViolations"), where),
        )
    return PreemptionArgs(pod, proposals, meta)


# --- replies ---


def _filter_reply(
    failed: Mapping[str, str], unresolvable: Mapping[str, str], error: str
) -> dict[str, Any]:
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }


def filter_result(
    args: ExtenderArgs,
    passed: Iterable[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
) -> dict[str, Any]:
    """ExtenderFilterResult, answering in the form the request came in."""
    reply = _filter_reply(failed, unresolvable, "")
    if args.cache_capable:
        reply["NodeNames"] = list(passed)
    else:
        keep = set(passed)
        assert args.nodes is not None
        items = [n for n, name in zip(args.nodes, args.node_names, strict=True) if name in keep]
        reply["Nodes"] = {"metadata": {}, "items": items}
    return reply


def filter_error(error: str) -> dict[str, Any]:
    """A filter reply that fails the pod with a message (kube-scheduler shows it on the pod)."""
    return _filter_reply({}, {}, error)


def host_priority_list(scores: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"Host": host, "Score": score} for host, score in scores]


# Filter and prioritize replies name every candidate node (1,250 and more): written directly,
# byte for byte what encode() writes of the objects above, they take a half (filter) to a
# quarter (prioritize) of the time.
# json.dumps writes a str as encode_basestring_ascii does (ensure_ascii) and an int as
# int.__repr__ does.


def _names(names: Iterable[str]) -> str:
    return "[" + ",".join(map(encode_basestring_ascii, names)) + "]"


def _string_map(entries: Mapping[str, str]) -> str:
    """A map of node names to reasons; the reasons are few, each is escaped once."""
    values = {v: ":" + encode_basestring_ascii(v) for v in set(entries.values())}
    return (
        "{" + ",".join([encode_basestring_ascii(k) + values[v] for k, v in entries.items()]) + "}"
    )


def encoded_filter_result(
    args: ExtenderArgs,
    passed: Iterable[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
) -> Encoded:
    """``encode(filter_result(...))``."""
    if not args.cache_capable:  # the reply echoes whole Node objects: no shortcut
        return Encoded(encode(filter_result(args, passed, failed, unresolvable)))
    return Encoded(
        (
            '{"Nodes":null,"NodeNames":'
            + _names(passed)
            + ',"FailedNodes":'
            + _string_map(failed)
            + ',"FailedAndUnresolvableNodes":'
            + _string_map(unresolvable)
            + ',"Error":""}'
        ).encode()
    )


def encoded_host_priority_list(scores: Iterable[tuple[str, int]]) -> Encoded:
    """``encode(host_priority_list(scores))``."""
    tails: dict[int, str] = {}
    entries = []
    for host, score in scores:
        tail = tails.get(score)
        if tail is None:
            tail = tails[score] = ',"Score":' + int.__repr__(score) + "}"
        entries.append('{"Host":' + encode_basestring_ascii(host) + tail)
    return Encoded(("[" + ",".join(entries) + "]").encode())


def binding_result(error: str = "") -> dict[str, Any]:
    return {"Error": error}


def preemption_result(answer: Mapping[str, Proposal]) -> dict[str, Any]:
    """ExtenderPreemptionResult: always the MetaVictims (UID) form."""
    return {
        "NodeNameToMetaVictims": {
            node: {
                "Pods": [{"UID": uid} for uid in p.victims],
                "NumPDBViolations": p.pdb_violations,
            }
            for node, p in answer.items()
        }
    }
