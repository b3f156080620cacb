"""The direct CRI path of a hot restart, for pod sandboxes no kubelet manages.

:func:`hot_restart` replaces one named container of a sandbox by one running a new image, with
the same configuration otherwise, inside the same sandbox: same pod IP and network namespace,
same pause process, same volumes. Order and failure semantics:

1. find the container (by name; the running one, else the latest attempt) and read its
   configuration (the caller's, or the runtime's verbose status) and the sandbox's;
2. pre-pull the new image (``IfNotPresent`` by default): on failure nothing was touched;
3. stop the old container with a grace period, remove it;
4. create the new container in the sandbox, start it.

A failure after the stop re-creates the old configuration (``restore_on_failure``), so the
workload runs its old version again; the outcome says so. A runtime that becomes unreachable
mid-way is reported as such, with what is known of the old container (a restore is still tried,
in case the runtime is back, and its failure reported).

Where a kubelet manages the pod, do not use this: the kubelet would see its container vanish and
recreate it. Use :mod:`nodeagent.hotrestart.podwatch` (the kubelet restarts the container).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from common.errors import NotFound, TideleaseError, Unavailable
from nodeagent.cri import api_pb2 as pb
from nodeagent.cri.runtime import ContainerState, ContainerSummary, Runtime
from nodeagent.hotrestart.planning import (
    Outcome,
    RestartSettings,
    Step,
    failure_reason,
    needs_pull,
    next_attempts,
    replacement,
)

log = logging.getLogger(__name__)


def pick(containers: tuple[ContainerSummary, ...], name: str) -> ContainerSummary | None:
    """The container named ``name``: the running one, else the one of the latest attempt."""
    named = [c for c in containers if c.name == name]
    running = [c for c in named if c.state is ContainerState.RUNNING]
    pool = running or named
    return max(pool, key=lambda c: c.attempt) if pool else None


async def ensure_image(
    runtime: Runtime,
    image: str,
    settings: RestartSettings,
    sandbox: pb.PodSandboxConfig | None = None,
) -> bool:
    """Make ``image`` present; whether a pull was needed. Raises what the runtime raised."""
    present = await runtime.image_status(image) is not None
    if not needs_pull(present, settings.pull_policy):
        return False
    await runtime.pull_image(image, sandbox)
    return True


async def hot_restart(
    runtime: Runtime,
    *,
    sandbox_id: str,
    container: str,
    image: str,
    settings: RestartSettings | None = None,
    config: pb.ContainerConfig | None = None,
    sandbox_config: pb.PodSandboxConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Restart ``container`` of ``sandbox_id`` on ``image``; never raises for runtime errors:
    the outcome says what happened."""
    settings = settings or RestartSettings()
    start = clock()
    found: ContainerSummary | None = None
    step = Step.FIND
    old_stopped = stop_uncertain = False
    was_running = True
    new_id = ""
    dropped: tuple[str, ...] = ()
    old_config: pb.ContainerConfig | None = None
    restore_config: pb.ContainerConfig | None = None
    sb_config: pb.PodSandboxConfig | None = None
    restore_attempt = 0

    def outcome(**kw: object) -> Outcome:
        return Outcome(
            sandbox_id=sandbox_id,
            container=container,
            image=image,
            duration_s=clock() - start,
            old_container_id=found.id if found else "",
            old_image=found.image if found else "",
            old_stopped=old_stopped,
            old_was_running=was_running,
            dropped_config_keys=dropped,
            **kw,  # type: ignore[arg-type]
        )

    try:
        found = pick(await runtime.list_containers(sandbox_id), container)
        if found is None:
            await runtime.sandbox_status(sandbox_id)  # NotFound names a missing sandbox
            return outcome(
                succeeded=False,
                failed_step=step,
                reason=f"no container named {container!r} in sandbox {sandbox_id}; "
                "nothing was changed",
            )
        status = await runtime.container_status(found.id)
        sandbox = await runtime.sandbox_status(sandbox_id)
        old_config = config if config is not None else status.config
        # A restore runs what the old container ran, as the runtime recorded it.
        restore_config = status.config if status.config is not None else old_config
        sb_config = sandbox_config if sandbox_config is not None else sandbox.config
        if config is None:
            dropped = status.unknown_config_keys
        if old_config is None or sb_config is None:
            return outcome(
                succeeded=False,
                failed_step=step,
                reason="the runtime does not report the container's or the sandbox's "
                "configuration; pass them; nothing was changed",
            )
        new_attempt, restore_attempt = next_attempts(max(found.attempt, status.attempt))
        new_config = replacement(old_config, image, new_attempt)

        step = Step.PULL
        await ensure_image(runtime, image, settings, sb_config)

        step = Step.STOP
        was_running = found.state is ContainerState.RUNNING
        if was_running:
            stop_uncertain = True
            old_stopped = True
            await runtime.stop_container(found.id, settings.stop_timeout_s)
            stop_uncertain = False
        else:
            old_stopped = True  # it was not running to begin with
        step = Step.REMOVE
        await runtime.remove_container(found.id)
        step = Step.CREATE
        new_id = await runtime.create_container(sandbox_id, new_config, sb_config)
        step = Step.START
        await runtime.start_container(new_id)
        log.info(
            "hot restart of %s in sandbox %s: %s -> %s (%s)",
            container,
            sandbox_id[:12],
            found.id[:12],
            new_id[:12],
            image,
        )
        return outcome(succeeded=True, reason="restarted on the new image", new_container_id=new_id)
    except TideleaseError as e:
        gone = isinstance(e, Unavailable)
        if step is Step.FIND and isinstance(e, NotFound):
            return outcome(succeeded=False, failed_step=step, reason=f"{e}; nothing was changed")
        restored_id, restore_error = "", ""
        if (
            old_stopped
            and settings.restore_on_failure
            and found is not None
            and restore_config is not None
            and sb_config is not None
        ):
            restored_id, restore_error = await _restore(
                runtime,
                sandbox_id,
                found.id,
                new_id,
                restore_config,
                sb_config,
                restore_attempt,
                start=was_running,
            )
        reason = failure_reason(
            step,
            str(e),
            runtime_gone=gone,
            old_stopped=old_stopped,
            restored=bool(restored_id),
            restore_error=restore_error,
            stop_uncertain=stop_uncertain,
            was_running=was_running,
        )
        log.warning("hot restart of %s in sandbox %s failed: %s", container, sandbox_id, reason)
        return outcome(
            succeeded=False,
            failed_step=step,
            reason=reason,
            new_container_id=new_id,
            restored_container_id=restored_id,
        )


async def _restore(
    runtime: Runtime,
    sandbox_id: str,
    old_id: str,
    new_id: str,
    old_config: pb.ContainerConfig,
    sb_config: pb.PodSandboxConfig,
    attempt: int,
    *,
    start: bool,
) -> tuple[str, str]:
    """Best effort: remove what the failed restart left, create the old configuration again and
    start it if the old container ran (a container that was not running stays so).
    (restored container id, "") or ("", why not)."""
    try:
        for leftover in (new_id, old_id):
            if leftover:
                with contextlib.suppress(NotFound):
                    await runtime.remove_container(leftover)
        again = replacement(old_config, old_config.image.image, attempt)
        restored = await runtime.create_container(sandbox_id, again, sb_config)
        if start:
            await runtime.start_container(restored)
    except TideleaseError as e:
        return "", str(e)
    log.info("sandbox %s: old container configuration restored as %s", sandbox_id, restored)
    return restored, ""
