"""Property: random concurrent bind sequences, on two replicas, never assign one device twice,
and refuse a pod only for want of room: every pod left unbound, bound again alone, gets its
devices wherever its node's ledger has them free."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import builders, contract
from common.errors import Conflict
from common.model import NodeName
from extender.cluster.store import MemoryStore
from extender.scheduler.binding import BindRefused
from tests.unit.test_binding import replica


class JitteryStore(MemoryStore):
    """A store whose every call yields to other tasks a random number of times first."""

    def __init__(self, objects: list[dict[str, Any]], rng: random.Random) -> None:
        super().__init__(objects)
        self._rng = rng

    async def _jitter(self) -> None:
        for _ in range(self._rng.randint(0, 3)):
            await asyncio.sleep(0)

    async def write_ledger(self, *a: Any, **k: Any) -> str:
        await self._jitter()
        return await super().write_ledger(*a, **k)

    async def bind_pod(self, *a: Any, **k: Any) -> None:
        await self._jitter()
        await super().bind_pod(*a, **k)


scenario = st.fixed_dictionaries(
    {
        "gpus_per_node": st.lists(st.integers(1, 8), min_size=1, max_size=3),
        "pods": st.lists(
            st.tuples(st.integers(1, 4), st.integers(0, 2), st.integers(0, 1)),
            min_size=1,
            max_size=12,
        ),
        "seed": st.integers(0, 2**32 - 1),
        "delete_some": st.booleans(),
    }
)


async def run(case: dict[str, Any]) -> None:
    rng = random.Random(case["seed"])
    nodes = [f"n{i}" for i in range(len(case["gpus_per_node"]))]
    objects = [
        builders.gpu_node(n, builders.devices(n, g))
        for n, g in zip(nodes, case["gpus_per_node"], strict=True)
    ]
    pods = [builders.pod(f"p{i}", gpus) for i, (gpus, _, _) in enumerate(case["pods"])]
    store = JitteryStore(objects + pods, rng)
    replicas = [await replica(store, missing_grace_s=1e-9), await replica(store)]

    async def bind(i: int) -> None:
        _, node_i, rep = case["pods"][i]
        meta = pods[i]["metadata"]
        # Refusals and lost races are fine; double grants are not.
        with contextlib.suppress(BindRefused, Conflict):
            await replicas[rep].app.binder.bind(
                "default", meta["name"], meta["uid"], nodes[node_i % len(nodes)]
            )

    await asyncio.gather(*(bind(i) for i in range(len(pods))))
    if case["delete_some"]:
        for p in pods[::2]:
            store.delete("Pod", "default", p["metadata"]["name"])
        await store.settle()
        await replicas[0].app.binder.reap_once()
        more = [builders.pod(f"q{i}", 1, uid=f"q{i}") for i in range(4)]
        for p in more:
            store.put(p)
        await store.settle()
        pods.extend(more)
        case["pods"].extend((1, i, i % 2) for i in range(4))
        await asyncio.gather(*(bind(i) for i in range(len(pods) - 4, len(pods))))
    await store.settle()

    seen: dict[str, str] = {}
    for node in nodes:
        ledger, _ = await store.read_ledger(NodeName(node))
        for a in ledger:
            for u in a.devices:
                assert u not in seen, f"{u} held by {seen[u]} and {a.holder.key}"
                seen[u] = a.holder.key
    for p in store.objects("Pod"):
        ann = p["metadata"].get("annotations", {})
        if p["spec"].get("nodeName") and contract.ANN_DEVICES in ann:
            for u in ann[contract.ANN_DEVICES].split(","):
                assert seen.get(u) == f"default/{p['metadata']['name']}"

    # Liveness: each pod left unbound, bound alone now (no race left to lose), is refused only
    # where its node's ledger has too few devices free.
    gpus_of = dict(zip(nodes, case["gpus_per_node"], strict=True))
    for i, p in enumerate(pods):
        meta = p["metadata"]
        now = store.get("Pod", "default", meta["name"])
        if now is None or now["spec"].get("nodeName"):
            continue
        gpus, node_i, _ = case["pods"][i]
        node = nodes[node_i % len(nodes)]
        ledger, _ = await store.read_ledger(NodeName(node))
        free = gpus_of[node] - sum(len(a.devices) for a in ledger)
        try:
            await replicas[1].app.binder.bind("default", meta["name"], meta["uid"], node)
        except BindRefused:
            assert free < gpus, f"{meta['name']} ({gpus} GPUs) refused on {node} with {free} free"
        else:
            assert free >= gpus, f"{meta['name']} ({gpus} GPUs) bound on {node} with {free} free"
    for r in replicas:
        await r.stop()


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_random_concurrent_binds_never_assign_a_device_twice_and_refuse_only_for_room(
    case: dict[str, Any],
) -> None:
    asyncio.run(run(case))
