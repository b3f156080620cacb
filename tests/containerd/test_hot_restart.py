"""Hot restart inside the existing pod sandbox, on a real containerd (weflex 3.3).

After a restart the sandbox, its pause process, network namespace and pod IP and the host-path
volume are the same, and the new image answers; the failure paths leave the old container
running (or say exactly why not).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from nodeagent.cri.client import GrpcRuntime
from nodeagent.cri.runtime import ContainerState, Runtime
from nodeagent.hotrestart.insandbox import hot_restart
from nodeagent.hotrestart.planning import RestartSettings, Step
from tests.containerd.conftest import (
    ABSENT,
    APP_V1,
    APP_V2,
    Containerd,
    app_config,
    http_get,
    pod,
)
from tests.containerd.proxy import SocketProxy

pytestmark = pytest.mark.containerd

SETTINGS = RestartSettings(stop_timeout_s=5)


async def running_apps(runtime: Runtime, sandbox_id: str) -> list[str]:
    return [
        c.id
        for c in await runtime.list_containers(sandbox_id)
        if c.name == "app" and c.state is ContainerState.RUNNING
    ]


async def test_hot_restart_keeps_the_sandbox_and_runs_the_new_image(
    runtime: GrpcRuntime, containerd: Containerd, tmp_path: Path
) -> None:
    async with pod(runtime, containerd, tmp_path, "keep") as p:
        (p.data / "marker").write_text("kept\n")
        before = await runtime.sandbox_status(p.sandbox_id)
        assert before.ip
        assert before.pid
        assert before.netns
        assert await http_get(f"http://{before.ip}:8080/version") == "v1"

        outcome = await hot_restart(
            runtime, sandbox_id=p.sandbox_id, container="app", image=APP_V2, settings=SETTINGS
        )

        assert outcome.succeeded, outcome.reason
        assert outcome.old_container_id == p.app_id
        assert outcome.new_container_id
        assert outcome.new_container_id != p.app_id
        assert outcome.dropped_config_keys == ()
        after = await runtime.sandbox_status(p.sandbox_id)
        assert (after.id, after.pid, after.netns, after.ip, after.ready) == (
            before.id,
            before.pid,
            before.netns,
            before.ip,
            True,
        )
        assert await http_get(f"http://{after.ip}:8080/version") == "v2"
        assert await http_get(f"http://{after.ip}:8080/data/marker") == "kept"
        assert await running_apps(runtime, p.sandbox_id) == [outcome.new_container_id]
        new = await runtime.container_status(outcome.new_container_id)
        assert new.image == APP_V2
        assert new.config is not None
        want = app_config(APP_V2, p.data, attempt=1)
        assert list(new.config.mounts) == list(want.mounts)
        assert list(new.config.envs) == list(want.envs)
        assert dict(new.config.labels) == dict(want.labels)
        assert dict(new.config.annotations) == dict(want.annotations)


async def test_unknown_container_changes_nothing(
    runtime: GrpcRuntime, containerd: Containerd, tmp_path: Path
) -> None:
    async with pod(runtime, containerd, tmp_path, "unknown") as p:
        outcome = await hot_restart(
            runtime, sandbox_id=p.sandbox_id, container="nope", image=APP_V2, settings=SETTINGS
        )
        assert not outcome.succeeded
        assert outcome.failed_step is Step.FIND
        assert "no container named 'nope'" in outcome.reason
        assert outcome.old_running
        assert await running_apps(runtime, p.sandbox_id) == [p.app_id]


async def test_unknown_sandbox_is_reported(runtime: GrpcRuntime) -> None:
    outcome = await hot_restart(
        runtime, sandbox_id="f" * 64, container="app", image=APP_V2, settings=SETTINGS
    )
    assert not outcome.succeeded
    assert outcome.failed_step is Step.FIND
    assert "nothing was changed" in outcome.reason


async def test_unpullable_image_leaves_the_old_container_running(
    runtime: GrpcRuntime, containerd: Containerd, tmp_path: Path
) -> None:
    async with pod(runtime, containerd, tmp_path, "unpullable") as p:
        ip = (await runtime.sandbox_status(p.sandbox_id)).ip
        outcome = await hot_restart(
            runtime, sandbox_id=p.sandbox_id, container="app", image=ABSENT, settings=SETTINGS
        )
        assert not outcome.succeeded
        assert outcome.failed_step is Step.PULL
        assert not outcome.old_stopped
        assert outcome.old_running
        assert "pre-pulling the new image failed" in outcome.reason
        assert "left running, untouched" in outcome.reason
        assert await running_apps(runtime, p.sandbox_id) == [p.app_id]
        assert await http_get(f"http://{ip}:8080/version") == "v1"


class Cutting:
    """A runtime whose proxy socket is pulled away just before the named call."""

    def __init__(self, inner: GrpcRuntime, proxy: SocketProxy, before: str) -> None:
        self._inner, self._proxy, self._before = inner, proxy, before

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if name != self._before:
            return method

        @functools.wraps(method)
        async def cut_then_call(*args: Any, **kwargs: Any) -> Any:
            await self._proxy.cut()
            return await method(*args, **kwargs)

        return cut_then_call


@pytest.mark.parametrize(
    ("before", "step", "old_running"),
    [
        pytest.param("image_status", Step.PULL, True, id="during-pre-pull"),
        pytest.param("stop_container", Step.STOP, True, id="before-stop"),
        pytest.param("remove_container", Step.REMOVE, False, id="after-stop"),
    ],
)
async def test_runtime_socket_gone_mid_way_is_reported(
    runtime: GrpcRuntime,
    containerd: Containerd,
    tmp_path: Path,
    before: str,
    step: Step,
    old_running: bool,
) -> None:
    async with pod(runtime, containerd, tmp_path, f"gone-{step.value}") as p:
        proxy = SocketProxy(containerd.sock, tmp_path / "proxy.sock")
        await proxy.start()
        try:
            async with GrpcRuntime(str(proxy.path), timeout_s=3) as via_proxy:
                outcome = await hot_restart(
                    Cutting(via_proxy, proxy, before),
                    sandbox_id=p.sandbox_id,
                    container="app",
                    image=APP_V2,
                    settings=SETTINGS,
                )
        finally:
            await proxy.cut()
        assert not outcome.succeeded
        assert outcome.failed_step is step
        assert "container runtime became unreachable" in outcome.reason
        # What really happened, seen through containerd's own socket.
        still = await running_apps(runtime, p.sandbox_id)
        assert still == ([p.app_id] if old_running else [])
        if step is Step.STOP:
            assert "state is unknown" in outcome.reason
        if step is Step.REMOVE:
            assert outcome.old_stopped
            assert not outcome.restored_container_id
            assert "had already been stopped" in outcome.reason
            assert "restarting its old config failed" in outcome.reason


async def test_a_failed_start_restores_the_old_configuration(
    runtime: GrpcRuntime, containerd: Containerd, tmp_path: Path
) -> None:
    """A new container that cannot start (the caller's config names a command the image lacks):
    the old container's recorded configuration runs again in the same sandbox, and the outcome
    says so."""
    async with pod(runtime, containerd, tmp_path, "restore") as p:
        ip = (await runtime.sandbox_status(p.sandbox_id)).ip
        status = await runtime.container_status(p.app_id)
        assert status.config is not None
        broken = app_config(APP_V1, p.data)
        broken.command[:] = ["/bin/no-such-command"]
        outcome = await hot_restart(
            runtime,
            sandbox_id=p.sandbox_id,
            container="app",
            image=APP_V2,
            settings=SETTINGS,
            config=broken,  # the caller's config: its command does not exist
            sandbox_config=p.config,
        )
        assert not outcome.succeeded, outcome
        assert outcome.failed_step in {Step.CREATE, Step.START}
        assert outcome.restored_container_id
        assert "restarted with its old config" in outcome.reason
        assert await running_apps(runtime, p.sandbox_id) == [outcome.restored_container_id]
        assert await http_get(f"http://{ip}:8080/version") == "v1"
