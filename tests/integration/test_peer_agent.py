"""The agent publishes its peer cache's inventory on the GpuNode, in the schema's form."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import jsonschema
import pytest

from common import contract
from nodeagent.agent import AgentSettings, NodeView, run_agent
from nodeagent.cache.naming import EntryId, Kind
from nodeagent.nvml import NvmlReader
from nodeagent.nvmlfake import FakeNvml, full_gpu
from nodeagent.publishing import MemoryPublisher
from nodeagent.pulling.command import add_agent_flags, open_agent_cache
from tests.unit.test_manifests import crd_schema


def agent_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_agent_flags(p)
    return p.parse_args(list(argv))


def test_cache_is_off_by_default() -> None:
    assert open_agent_cache(agent_args()) is None


def test_bad_cache_flags_are_reported_together(tmp_path: Path) -> None:
    from common.errors import InvalidInput

    with pytest.raises(InvalidInput) as e:
        open_agent_cache(
            agent_args(
                "--cache-dir",
                str(tmp_path),
                "--cache-port",
                "70000",
                "--cache-max-bytes",
                "0",
                "--cache-partial-ttl",
                "-1",
                "--cache-reserve-bytes",
                "-1",
            )
        )
    assert len(e.value.problems) == 4


def test_inventory_is_published_in_the_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    cache = open_agent_cache(
        agent_args(
            "--cache-dir",
            str(tmp_path / "c"),
            "--cache-max-bytes",
            "1Mi",
            "--cache-partial-ttl",
            "3600",
        )
    )
    assert cache is not None
    assert cache.store.partial_ttl_s == 3600
    assert cache.store.reserve_bytes == 1 << 30  # the default
    src = tmp_path / "ck"
    src.write_bytes(b"z" * 1000)
    cache.store.add_file(Kind.CHECKPOINT, EntryId("job-a.step-3"), src)
    cache.store.add_file(Kind.IMAGE, EntryId("reg-app-1"), src, ref="reg/app:1")
    inventory = cache.inventory()
    assert inventory == {
        "checkpoints": ["job-a.step-3"],
        "images": ["reg/app:1"],
        "endpoint": "http://10.1.2.3:8477",
    }
    view = NodeView([], AgentSettings(node="n1"), None)
    status = view.status(100.0, inventory)
    assert status["cache"] == inventory
    obj = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_GPU_NODE,
        "metadata": {"name": "n1"},
        "spec": {},
        "status": status,
    }
    jsonschema.validate(obj, crd_schema(contract.PLURAL_GPU_NODE))


async def test_run_agent_publishes_inventory_changes() -> None:
    held = {"checkpoints": [], "images": []}
    publisher = MemoryPublisher()
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_agent(
            reader=NvmlReader(FakeNvml([full_gpu(0)])),
            publisher=publisher,
            settings=AgentSettings(node="n1", cycle_s=0.01, heartbeat_s=60),
            ready=ready,
            cache_inventory=lambda: dict(held),
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 5)
        held = {"checkpoints": ["ck"], "images": [], "endpoint": "http://10.0.0.1:8477"}
        for _ in range(500):
            if publisher.statuses[-1]["cache"].get("checkpoints") == ["ck"]:
                break
            await asyncio.sleep(0.01)
        assert publisher.statuses[-1]["cache"] == held
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_inventory_beyond_the_schema_limit_keeps_the_most_recently_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More entries of a kind than the schema allows: the ones published are the most recently
    used of that kind (sorted, so that a use alone does not change the published list)."""
    from nodeagent.cache.cachestore import CacheStore
    from nodeagent.cache.peerserver import ServeSettings
    from nodeagent.pulling import command

    monkeypatch.setattr(command, "MAX_PUBLISHED", 2)
    now = [1000.0]
    store = CacheStore(tmp_path / "c", max_bytes=1 << 20, clock=lambda: now[0])
    src = tmp_path / "src"
    src.write_bytes(b"z" * 100)
    # Added in this order, one second apart, checkpoints first: "a" and "ref/a" are the least
    # recently used of their kinds...
    for kind, name, ref in [
        *((Kind.CHECKPOINT, n, None) for n in ("a", "b", "c")),
        *((Kind.IMAGE, f"ref-{n}", f"ref/{n}") for n in ("a", "b", "c")),
    ]:
        now[0] += 1
        store.add_file(kind, EntryId(name), src, ref=ref)
    # ...until "a" is used again: then "b" is.
    now[0] += 1
    store.touch(Kind.CHECKPOINT, EntryId("a"))
    inventory = command.AgentCache(store, ServeSettings(), None).inventory()
    assert inventory == {"checkpoints": ["a", "c"], "images": ["ref/b", "ref/c"]}


def test_a_second_process_cannot_open_a_cache_directory_in_use(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from nodeagent.cache.cachestore import CacheStore

    def ls() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "common.cli", "cache", "ls", "--cache-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    held = CacheStore(tmp_path, max_bytes=1 << 20)
    busy = held.data_dir(Kind.CHECKPOINT) / ".tmp-publishing"
    busy.write_bytes(b"half written")
    refused = ls()
    assert refused.returncode == 2, refused
    assert f"is in use by another process (pid {os.getpid()})" in refused.stderr
    assert busy.read_bytes() == b"half written"  # the holder's temporary file is untouched
    # In the same process a store opens again (as tests and an in-place restart do).
    again = CacheStore(tmp_path, max_bytes=1 << 20)
    held.close()
    again.close()
    assert ls().returncode == 0
