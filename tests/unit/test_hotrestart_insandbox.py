"""Hot restart inside a sandbox, on the faithful fake runtime: the decisions and the outcome
record for every failure path (the same paths run on a real containerd in tests/containerd)."""

from __future__ import annotations

import itertools

import pytest

from nodeagent.cri import api_pb2 as pb
from nodeagent.cri.testing import FakeRuntime
from nodeagent.hotrestart.insandbox import hot_restart
from nodeagent.hotrestart.planning import (
    Outcome,
    PullPolicy,
    RestartSettings,
    Step,
    failure_reason,
    needs_pull,
    replacement,
)

V1, V2, ABSENT = "docker.io/local/app:v1", "docker.io/local/app:v2", "docker.io/local/absent:v1"


def app(image: str = V1) -> pb.ContainerConfig:
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app"),
        image=pb.ImageSpec(image=image),
        command=["/bin/sh", "-c", "serve"],
        envs=[pb.KeyValue(key="ROLE", value="worker")],
        mounts=[pb.Mount(container_path="/data", host_path="/srv/data")],
        devices=[pb.Device(container_path="/dev/nvidia0", host_path="/dev/nvidia0")],
        labels={"app": "trainer"},
        annotations={"tidelease.io/owner": "job-a"},
        linux=pb.LinuxContainerConfig(
            resources=pb.LinuxContainerResources(memory_limit_in_bytes=1 << 30)
        ),
    )


async def started(rt: FakeRuntime) -> tuple[str, str]:
    sandbox = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="n"))
    sid = await rt.run_sandbox(sandbox)
    cid = await rt.create_container(sid, app(), sandbox)
    await rt.start_container(cid)
    rt.calls.clear()
    return sid, cid


def clock() -> itertools.count[float]:
    return itertools.count(100.0, 0.5)


async def restart(rt: FakeRuntime, sid: str, container: str = "app", image: str = V2) -> Outcome:
    ticks = clock()
    return await hot_restart(
        rt,
        sandbox_id=sid,
        container=container,
        image=image,
        settings=RestartSettings(stop_timeout_s=7),
        clock=lambda: next(ticks),
    )


def fake() -> FakeRuntime:
    return FakeRuntime(images={V1, V2}, pullable={"docker.io/local/app:v3"})


def test_replacement_changes_only_image_and_attempt() -> None:
    new = replacement(app(), V2, attempt=3)
    want = app(V2)
    want.metadata.attempt = 3
    assert new == want
    assert app().image.image == V1  # the old config is not changed


def test_replacement_keeps_the_image_specs_own_settings() -> None:
    old = app()
    old.image.annotations["io.kubernetes.cri.runtimehandler"] = "nvidia"
    old.image.runtime_handler = "nvidia"
    old.image.user_specified_image = V1
    old.image.image_ref = "sha256:" + "a" * 64
    new = replacement(old, V2, attempt=3)
    assert dict(new.image.annotations) == {"io.kubernetes.cri.runtimehandler": "nvidia"}
    assert new.image.runtime_handler == "nvidia"
    assert (new.image.image, new.image.user_specified_image) == (V2, V2)
    assert new.image.image_ref == ""  # it named the old image's content


@pytest.mark.parametrize(
    ("present", "policy", "pull"),
    [
        (True, PullPolicy.IF_NOT_PRESENT, False),
        (False, PullPolicy.IF_NOT_PRESENT, True),
        (True, PullPolicy.ALWAYS, True),
    ],
    ids=["present", "absent", "always"],
)
def test_needs_pull(present: bool, policy: PullPolicy, pull: bool) -> None:
    assert needs_pull(present, policy) is pull


async def test_success_replaces_only_the_container_in_its_sandbox() -> None:
    rt = fake()
    sid, old = await started(rt)
    out = await restart(rt, sid)
    assert out.succeeded, out.reason
    assert rt.calls == [
        "ListContainers",
        "ContainerStatus",
        "PodSandboxStatus",
        "ImageStatus",
        "StopContainer",
        "RemoveContainer",
        "CreateContainer",
        "StartContainer",
    ]
    (running,) = rt.running(sid, "app")
    assert running.id == out.new_container_id != old
    assert running.config == replacement(app(), V2, 1)
    assert (out.old_container_id, out.old_image, out.duration_s) == (old, V1, 0.5)
    assert out.to_json()["succeeded"] is True


async def test_absent_image_is_pulled_first() -> None:
    rt = fake()
    sid, _ = await started(rt)
    out = await restart(rt, sid, image="docker.io/local/app:v3")
    assert out.succeeded
    assert rt.calls.index("PullImage") < rt.calls.index("StopContainer")


async def test_unknown_container_changes_nothing() -> None:
    rt = fake()
    sid, old = await started(rt)
    out = await restart(rt, sid, container="nope")
    assert (out.succeeded, out.failed_step, out.old_running) == (False, Step.FIND, True)
    assert [c.id for c in rt.running(sid, "app")] == [old]


async def test_unknown_sandbox_is_not_found() -> None:
    out = await restart(fake(), "sb-missing")
    assert out.failed_step is Step.FIND
    assert "not found" in out.reason


async def test_failed_pull_leaves_the_old_container_untouched() -> None:
    rt = fake()
    sid, old = await started(rt)
    out = await restart(rt, sid, image=ABSENT)
    assert (out.failed_step, out.old_stopped, out.old_running) == (Step.PULL, False, True)
    assert "StopContainer" not in rt.calls
    assert [c.id for c in rt.running(sid, "app")] == [old]


async def test_failed_start_restores_the_old_config() -> None:
    rt = fake()
    rt.unstartable.add(V2)
    sid, _ = await started(rt)
    out = await restart(rt, sid)
    assert out.failed_step is Step.START
    assert out.restored_container_id
    assert out.old_running
    (running,) = rt.running(sid, "app")
    assert running.id == out.restored_container_id
    assert running.config == replacement(app(), V1, 2)
    assert "restarted with its old config" in out.reason


async def test_a_restore_leaves_a_container_that_was_not_running_stopped() -> None:
    rt = fake()
    rt.unstartable.add(V2)
    sandbox = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="n"))
    sid = await rt.run_sandbox(sandbox)
    await rt.create_container(sid, app(), sandbox)  # created, never started
    out = await restart(rt, sid)
    assert out.failed_step is Step.START
    assert out.restored_container_id
    assert not out.old_was_running
    assert not out.old_running
    assert rt.running(sid, "app") == []  # nothing runs that did not run before
    restored = await rt.container_status(out.restored_container_id)
    assert restored.config is not None
    assert restored.config.image.image == V1
    assert "was not running" in out.reason
    assert out.to_json()["oldWasRunning"] is False


@pytest.mark.parametrize(
    ("method", "step", "old_running", "phrase"),
    [
        ("ImageStatus", Step.PULL, True, "left running, untouched"),
        ("StopContainer", Step.STOP, True, "state is unknown"),
        ("RemoveContainer", Step.REMOVE, False, "restarting its old config failed"),
        ("CreateContainer", Step.CREATE, False, "had already been stopped"),
    ],
)
async def test_runtime_gone_mid_way(
    method: str, step: Step, old_running: bool, phrase: str
) -> None:
    rt = fake()
    sid, old = await started(rt)
    rt.break_at = (method, 1)
    out = await restart(rt, sid)
    assert out.failed_step is step
    assert "container runtime became unreachable" in out.reason
    assert phrase in out.reason
    assert not out.restored_container_id
    assert [c.id for c in rt.running(sid, "app")] == ([old] if old_running else [])


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        (
            {"runtime_gone": False, "old_stopped": False, "restored": False},
            "pre-pulling the new image failed: boom; the old container was left running, untouched",
        ),
        (
            {"runtime_gone": False, "old_stopped": True, "restored": True},
            "pre-pulling the new image failed: boom; the old container had been stopped and "
            "was restarted with its old config",
        ),
        (
            {"runtime_gone": True, "old_stopped": True, "restored": False},
            "the container runtime became unreachable while pre-pulling the new image: boom; "
            "the old container had already been stopped and could not be restarted "
            "(runtime unreachable)",
        ),
    ],
    ids=["untouched", "restored", "gone"],
)
def test_failure_reason(kwargs: dict[str, bool], text: str) -> None:
    got = failure_reason(
        Step.PULL,
        "boom",
        runtime_gone=kwargs["runtime_gone"],
        old_stopped=kwargs["old_stopped"],
        restored=kwargs["restored"],
    )
    assert got == text
