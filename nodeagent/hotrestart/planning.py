"""Pure parts of a hot restart: what to create, whether to pull, and the outcome record."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from nodeagent.cri import api_pb2 as pb


class PullPolicy(enum.Enum):
    IF_NOT_PRESENT = "IfNotPresent"  # use a present image as it is (no registry round-trip)
    ALWAYS = "Always"  # pull even when present (a moving tag)


class Step(enum.Enum):
    """The steps of a restart, in order; an outcome names the one that failed."""

    FIND = "find"
    PULL = "pull"
    STOP = "stop"
    REMOVE = "remove"
    CREATE = "create"
    START = "start"


@dataclass(frozen=True, slots=True)
class RestartSettings:
    stop_timeout_s: int = 30  # grace period of the old container (SIGTERM, then SIGKILL)
    pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    restore_on_failure: bool = True  # re-create the old container when a later step fails

    def validate(self) -> list[str]:
        problems = []
        if self.stop_timeout_s < 0:
            problems.append("stop_timeout_s must be >= 0")
        return problems


def needs_pull(present: bool, policy: PullPolicy) -> bool:
    return policy is PullPolicy.ALWAYS or not present


def replacement(old: pb.ContainerConfig, image: str, attempt: int) -> pb.ContainerConfig:
    """``old`` with only the image (and the attempt, which names the container) changed:
    command, args, envs, mounts, devices, labels, annotations, resources and security stay, and
    so do the image spec's annotations and runtime handler. The image spec's references to the
    old image (``user_specified_image``, the resolved ``image_ref``) follow the new one."""
    new = pb.ContainerConfig()
    new.CopyFrom(old)
    new.image.image = image
    new.image.ClearField("image_ref")
    if old.image.user_specified_image:
        new.image.user_specified_image = image
    new.metadata.attempt = attempt
    return new


def next_attempts(old_attempt: int) -> tuple[int, int]:
    """The attempts of the new container and, should it fail, of the restored old one: both
    unused in the sandbox, since a (name, attempt) is reserved for the sandbox's lifetime by
    some runtimes even after removal."""
    return old_attempt + 1, old_attempt + 2


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a hot restart did. ``succeeded`` or the ``failed_step`` and a ``reason`` that says
    what state the container was left in."""

    succeeded: bool
    reason: str
    sandbox_id: str
    container: str
    image: str
    duration_s: float
    old_container_id: str = ""
    old_image: str = ""
    new_container_id: str = ""
    failed_step: Step | None = None
    old_stopped: bool = False  # the old container was stopped (or its state is unknown)
    old_was_running: bool = True  # the old container ran when the restart began
    # the old configuration again, after a failure: running if it ran before, else created
    restored_container_id: str = ""
    dropped_config_keys: tuple[str, ...] = ()  # config keys not carried to the new container

    @property
    def old_running(self) -> bool:
        """Whether the workload still runs its old version (untouched or restored)."""
        return (
            not self.succeeded
            and self.old_was_running
            and (not self.old_stopped or bool(self.restored_container_id))
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "succeeded": self.succeeded,
            "reason": self.reason,
            "sandboxId": self.sandbox_id,
            "container": self.container,
            "image": self.image,
            "durationSeconds": round(self.duration_s, 3),
            "oldContainerId": self.old_container_id,
            "oldImage": self.old_image,
            "newContainerId": self.new_container_id,
            "oldStopped": self.old_stopped,
            "oldWasRunning": self.old_was_running,
        }
        if self.failed_step is not None:
            out["failedStep"] = self.failed_step.value
        if self.restored_container_id:
            out["restoredContainerId"] = self.restored_container_id
        if self.dropped_config_keys:
            out["droppedConfigKeys"] = list(self.dropped_config_keys)
        return out


def failure_reason(
    step: Step,
    error: str,
    *,
    runtime_gone: bool,
    old_stopped: bool,
    restored: bool,
    restore_error: str = "",
    stop_uncertain: bool = False,
    was_running: bool = True,
) -> str:
    """One sentence (or three) that tells an operator what failed and what is running now."""
    what = {
        Step.FIND: "finding the container",
        Step.PULL: "pre-pulling the new image",
        Step.STOP: "stopping the old container",
        Step.REMOVE: "removing the old container",
        Step.CREATE: "creating the new container",
        Step.START: "starting the new container",
    }[step]
    head = (
        f"the container runtime became unreachable while {what}: {error}"
        if runtime_gone
        else f"{what} failed: {error}"
    )
    if not old_stopped:
        return f"{head}; the old container was left running, untouched"
    if restored and not was_running:
        return (
            f"{head}; the old container, which was not running, was created again with its old "
            "config and left stopped"
        )
    if restored:
        return f"{head}; the old container had been stopped and was restarted with its old config"
    tail = (
        "; the old container may have been stopped (its state is unknown)"
        if stop_uncertain
        else "; the old container had already been stopped"
    )
    if restore_error:
        tail += f" and restarting its old config failed: {restore_error}"
    elif runtime_gone:
        tail += " and could not be restarted (runtime unreachable)"
    return head + tail
