"""Record the extender's filter and prioritize replies over a changing cluster, to show that an
optimisation changes no decision.

Runs a few hundred varied requests (high/low priority, GPU counts, types, tiers, owners,
reclaims, pods holding devices already, repeats of earlier pods) through the server's verbs
(``ExtenderApp.filter`` / ``.prioritize``, reply encoding included) over the bench's generated
cluster, with mutations between requests: allocations added and released, pods gone, caches and
tiers changed, agents going silent and back, inventories removed and re-added, a lease
reclaiming. Prints a digest of every reply body; ``--record FILE`` writes the canonical replies
(JSON objects with sorted maps), ``--check FILE`` compares against a recording.

    python -m benchmarks.check_decisions [--nodes 300] [--requests 600] [--record F | --check F]
                                         [--smoke]

``--smoke``: 20 nodes and 40 requests, recorded to a temporary file and the same run done again
and checked against it (unless ``--record`` or ``--check`` is given), to check that the tool
still works.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import random
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.bench_extender import JOBS, TYPES, cluster
from common import builders
from common.model import (
    Allocation,
    Holder,
    JobKey,
    NodeInventory,
    NodeName,
    PodUid,
    Priority,
    Tier,
)
from common.objects import gpu_node_object
from common.timefmt import epoch
from extender.cluster.store import MemoryStore
from extender.scheduler import wire
from extender.scheduler.extenderserver import build_app
from extender.scheduler.handlers import ExtenderApp
from extender.scheduler.settings import ExtenderSettings

PRIORITIES = [0, 100, 1000, 5000, 100000]


def load(n_nodes: int) -> ExtenderApp:
    app = build_app(store=MemoryStore([]), settings=ExtenderSettings())
    for obj in cluster(n_nodes, seed=11):
        kind = obj["kind"]
        if kind == "GpuNode":
            app.cluster.apply_gpu_node("ADDED", obj)
        elif kind == "GpuAllocation":
            app.cluster.apply_gpu_allocation("ADDED", obj)
    return app


def random_pod(rng: random.Random, i: int, held: list[PodUid]) -> dict[str, Any]:
    high = rng.random() < 0.4
    owner = rng.choice([*JOBS, "other"]) if high or rng.random() < 0.2 else None
    reclaim = high and owner is not None and rng.random() < 0.3
    uid = str(rng.choice(held)) if held and rng.random() < 0.1 else f"uid-req-{i}"
    return builders.pod(
        f"req-{i}",
        rng.choice([0, 1, 1, 2, 2, 4, 4, 6, 8, 9]),
        uid=uid,
        priority=Priority.HIGH if high else (Priority.LOW if rng.random() < 0.7 else None),
        owner=owner,
        tier=rng.choice([None, Tier.LA, Tier.MA, Tier.HA]),
        gpu_type=rng.choice([None, None, *TYPES, "V100"]),
        reclaim=reclaim,
        checkpoint=rng.choice([None, "ck-1", "ck-2"]),
        image=rng.choice(["registry.example/recsys:v7", "registry.example/train:v1"]),
        pod_priority=rng.choice([None, *PRIORITIES, 50, 2000]),
    )


FRESH, STALE = "2026-01-01T00:00:00Z", "2025-12-31T23:00:00Z"


class Mutator:
    """Random changes of the cluster view, as the watches would apply them."""

    def __init__(self, app: ExtenderApp, rng: random.Random) -> None:
        self.app, self.rng = app, rng
        self.removed: dict[NodeName, dict[str, Any]] = {}

    def __call__(self, step: int) -> None:
        c, rng = self.app.cluster, self.rng
        state = c.nodes[rng.choice(sorted(c.nodes))]
        what = rng.random()
        if what < 0.35 and state.has_inventory:  # allocate some free devices
            held = {u for a in state.ledger.values() for u in a.devices}
            free = [d.uuid for d in state.devices if d.uuid not in held]
            if free:
                take = rng.sample(free, rng.randint(1, len(free)))
                high = rng.random() < 0.3
                holder = Holder(
                    PodUid(f"uid-m-{step}-{rng.randrange(10**6)}"),
                    "default",
                    f"m-{step}",
                    Priority.HIGH if high else Priority.LOW,
                    rng.choice(PRIORITIES),
                    JobKey(rng.choice(JOBS)) if high else None,
                )
                alloc = Allocation(holder, tuple(take), "2026-01-01T00:00:00Z")
                c.set_ledger(state.node, (*state.ledger.values(), alloc), str(step))
        elif what < 0.55 and state.ledger:  # release one allocation
            keep = list(state.ledger.values())
            keep.pop(rng.randrange(len(keep)))
            c.set_ledger(state.node, tuple(keep), str(step))
        elif what < 0.65 and state.ledger:  # its pod is gone (the ledger entry stays)
            c.pod_gone(rng.choice(list(state.ledger)))
        elif what < 0.8 and state.has_inventory:  # cache contents, tiers or tags change
            devs = list(state.devices)
            if devs and rng.random() < 0.5:
                k = rng.randrange(len(devs))
                cls = devs[k].cls._replace(
                    tier=rng.choice(list(Tier)),
                    owner=JobKey(rng.choice(JOBS)) if rng.random() < 0.4 else None,
                )
                devs[k] = replace(devs[k], cls=cls)
            images = rng.choice([[], ["registry.example/recsys:v7"], ["registry.example/train:v1"]])
            ckpts = rng.choice([[], ["ck-1"], ["ck-1", "ck-2"]])
            c.apply_gpu_node(
                "MODIFIED",
                builders.gpu_node(str(state.node), devs, images=images, checkpoints=ckpts),
            )
        elif what < 0.84:  # the agent goes silent, or comes back
            c.apply_lease(
                "MODIFIED",
                {
                    "metadata": {"name": f"tidelease-agent-{state.node}"},
                    "spec": {
                        "holderIdentity": str(state.node),
                        "renewTime": FRESH if state.silent else STALE,
                    },
                },
            )
            c.sweep((epoch(FRESH) or 0.0) + 1, 60)
        elif what < 0.95:  # the inventory goes, and comes back later
            if state.has_inventory:
                inv = NodeInventory(state.node, state.devices, state.cache)
                self.removed[state.node] = gpu_node_object(inv)
                c.apply_gpu_node("DELETED", {"metadata": {"name": str(state.node)}})
            elif state.node in self.removed:
                c.apply_gpu_node("ADDED", self.removed.pop(state.node))
        else:  # an online job's lease starts or stops reclaiming
            job = rng.choice(JOBS)
            c.apply_gpu_lease(
                "MODIFIED",
                {
                    "metadata": {"name": f"lease-{job}", "namespace": "default"},
                    "spec": {"owner": job},
                    "status": {"phase": rng.choice(["Reclaiming", "Lent"])},
                },
            )


def canonical(verb: str, body: bytes) -> Any:
    reply = json.loads(body)
    if verb == "filter" and isinstance(reply, dict):
        for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
            if reply.get(key):
                reply[key] = sorted(reply[key].items())
    return reply


def replies(n_nodes: int, n_requests: int, seed: int = 3) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    app = load(n_nodes)
    names = [f"gpu-{i:05d}" for i in range(n_nodes)]
    earlier: list[dict[str, Any]] = []
    mutate = Mutator(app, rng)

    async def call(verb: str, body: dict[str, Any]) -> bytes:
        handler = app.filter if verb == "filter" else app.prioritize
        try:
            _, reply = await handler(wire.decode(wire.encode(body)))
        except Exception as e:  # an invalid pod at prioritize answers 400: record the error
            return f"{type(e).__name__}: {e}".encode()
        return wire.encode(reply)

    for i in range(n_requests):
        for _ in range(rng.choice([0, 1, 1, 2, 5])):
            mutate(i)
        held = [u for s in app.cluster for u in s.allocations]
        if earlier and rng.random() < 0.3:
            pod = rng.choice(earlier)  # a retry, or the next pod of a job: memo hits
        else:
            pod = random_pod(rng, i, held)
            earlier.append(pod)
        if rng.random() < 0.7:
            candidates = [*names, "not-a-node"]
        else:
            candidates = rng.sample(names, rng.randint(1, len(names)))
        body = {"Pod": pod, "Nodes": None, "NodeNames": candidates}
        for verb in ("filter", "prioritize"):
            yield verb, asyncio.run(call(verb, body))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--record", type=Path)
    parser.add_argument("--check", type=Path)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it still runs")
    args = parser.parse_args()
    if args.smoke:  # the smoke sizes, unless given
        parser.set_defaults(nodes=20, requests=40)
        args = parser.parse_args()
    logging.disable(logging.WARNING)  # agents going silent and back
    got = decisions(args.nodes, args.requests)
    if args.record:
        args.record.write_bytes(got)
    if args.check:
        return check(args.check, got)
    if args.smoke and not args.record:
        with tempfile.TemporaryDirectory(prefix="check-decisions-") as tmp:
            recording = Path(tmp) / "decisions.json"
            recording.write_bytes(got)
            return check(recording, decisions(args.nodes, args.requests))
    return 0


def decisions(n_nodes: int, n_requests: int) -> bytes:
    """Every reply of a run, canonical; prints their count and digests."""
    raw = hashlib.sha256()
    out: list[Any] = []
    for verb, body in replies(n_nodes, n_requests):
        raw.update(body)
        out.append([verb, canonical(verb, body) if body.startswith((b"{", b"[")) else str(body)])
    encoded = json.dumps(out, sort_keys=True).encode()
    print(
        f"{len(out)} replies; bytes sha256 {raw.hexdigest()[:16]}; decisions sha256 "
        f"{hashlib.sha256(encoded).hexdigest()[:16]}"
    )
    return encoded


def check(recording: Path, got: bytes) -> int:
    """0 when every reply equals the recording's, else 1 (and the first difference)."""
    expected, out = json.loads(recording.read_text()), json.loads(got)
    bad = [i for i, (a, b) in enumerate(zip(expected, out, strict=True)) if a != b]
    if bad:
        print(f"{len(bad)} replies differ, first at {bad[0]}: {out[bad[0]]!s:.300}")
        return 1
    print("all replies equal to the recording")
    return 0


if __name__ == "__main__":
    sys.exit(main())
