"""Hooks for the tidelease processes a test or the soak runs, patched in at start: Python
imports ``sitecustomize`` from PYTHONPATH before anything else. Only the ``tidelease extender``,
``tidelease controllers`` and (for :data:`AGENT_MUTATIONS`) ``tidelease agent`` processes are
touched, and only when an environment variable asks; anything else this directory is on the
path of (a helper script, a Python without tidelease's packages) is left alone.

* ``TIDELEASE_SOAK_MUTATION=NAME``: a deliberate bug (tests/soak/mutations.py), for the soak's
  checkers to report; ``swap-in-cycle-2`` (the leasing controller records the second lend's
  first two groups with each other's devices) and ``standby-lower-tier`` (placement offers a
  reclaim standby devices of its type only below the tier it needs) are for the test suite's
  own mutation check (docs/development.md).
* ``TIDELEASE_TEST_CRASH_AT=POINT``: the process kills itself with SIGKILL (a real crash: no
  clean-up, no finally) the first time it passes POINT (:data:`CRASH_POINTS`), or
  ``in:SECONDS`` after it started, whatever it is doing then, after a line on stderr that says
  so. tests/e2e/test_leasing_crash.py starts it so, then again as it ran.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

# point -> (module, class, method, when): the process dies before or after that call.
CRASH_POINTS = {
    # the extender: between its ledger write and the Binding; after the Binding, unanswered
    "ledger-written": ("extender.cluster.kubestore", "KubeStore", "bind_pod", "before"),
    "bound": ("extender.cluster.kubestore", "KubeStore", "bind_pod", "after"),
    # the controllers: a lend's or reclaim's scale written; a lend's tags written (its status
    # not yet); a borrower told; a lease's status written
    "scaled": ("extender.leasing.kubeworld", "KubeWorld", "scale", "after"),
    "tags-set": ("extender.leasing.kubeworld", "KubeWorld", "set_tags", "after"),
    "noticed": ("extender.leasing.kubeworld", "KubeWorld", "notify", "after"),
    "status-written": ("extender.leasing.kubeworld", "KubeWorld", "write_status", "after"),
}

Async = Callable[..., Coroutine[Any, Any, Any]]


def _crash(point: str) -> None:
    import importlib

    def die() -> None:
        print(f"tidelease crash point {point!r} reached in pid {os.getpid()}", file=sys.stderr)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    if point.startswith("in:"):
        import threading

        timer = threading.Timer(float(point.removeprefix("in:")), die)
        timer.daemon = True
        timer.start()
        return
    module, cls_name, method, when = CRASH_POINTS[point]
    cls = getattr(importlib.import_module(module), cls_name)
    original: Async = getattr(cls, method)

    @functools.wraps(original)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        if when == "before":
            die()
        result = await original(*args, **kwargs)
        die()
        return result

    setattr(cls, method, wrapped)


def _mutate(name: str) -> None:
    if name == "skip-notice":
        from extender.leasing.kubeworld import KubeWorld

        async def notify(self: object, *args: object, **kwargs: object) -> None:
            return None

        KubeWorld.notify = notify  # type: ignore[method-assign]
    elif name == "skip-ledger":
        from extender.cluster.kubestore import KubeStore

        async def write_ledger(
            self: object, node: object, allocations: object, version: str
        ) -> str:
            return version or "1"

        KubeStore.write_ledger = write_ledger  # type: ignore[method-assign]
    elif name == "wrong-return":
        import dataclasses

        from extender.scheduler import admitting, binding, handlers

        original = admitting.placed_request

        def placed_request(*args: object, **kwargs: object) -> object:
            req = original(*args, **kwargs)  # type: ignore[arg-type]
            group = req.lent_group
            if group is not None:
                base, _, ordinal = group.rpartition("-")
                if ordinal.isdigit():
                    other = f"{base}-{int(ordinal) + 1}" if ordinal == "0" else f"{base}-0"
                    return dataclasses.replace(req, lent_group=other)
            return req

        for module in (handlers, binding):
            setattr(module, "placed_request", placed_request)  # noqa: B010 (a module's global)
    elif name in ("refuse-fours", "leak"):
        from extender.scheduler import handlers, wire

        filter_verb = handlers.ExtenderApp.filter
        kept: list[bytearray] = []

        async def filter_mutant(self: handlers.ExtenderApp, body: dict[str, object]) -> object:
            if name == "leak":
                kept.append(bytearray(256 * 1024))
            else:
                args = wire.parse_extender_args(body)
                try:
                    req = self._request(args.pod)
                except Exception:
                    req = None
                if req is not None and req.gpus == 4:
                    failed = dict.fromkeys(args.node_names, "tidelease: mutant refuses 4 GPUs")
                    return 200, wire.encoded_filter_result(args, [], failed, {})
            return await filter_verb(self, body)

        handlers.ExtenderApp.filter = filter_mutant  # type: ignore[method-assign,assignment]
    elif name == "swap-in-cycle-2":
        import dataclasses

        from extender.leasing import controller, decisions

        decide = decisions.decide

        def swapping(lease: Any, *args: Any) -> Any:
            action = decide(lease, *args)
            new = getattr(action, "status", None)
            if not (
                isinstance(action, decisions.WriteStatus)
                and new is not None
                and new.phase == "Lending"
                and lease.status.reclaims == 1
            ):
                return action
            added = [g for g in new.groups if g not in lease.status.groups]
            if len(added) < 2:
                return action
            a, b = added[:2]
            swap = {
                a: dataclasses.replace(a, devices=b.devices),
                b: dataclasses.replace(b, devices=a.devices),
            }
            groups = tuple(swap.get(g, g) for g in new.groups)
            return dataclasses.replace(action, status=dataclasses.replace(new, groups=groups))

        setattr(controller, "decide", swapping)  # noqa: B010 (a module's global)
    elif name == "standby-lower-tier":
        from extender.scheduler import placement

        verdict = placement.verdict

        def lower(cls: Any, req: Any) -> Any:
            if cls.standby and cls.healthy and req.reclaim and cls.gpu_type == req.gpu_type:
                # standby offered only below the tier asked for
                ok = cls.tier < req.min_tier
                return placement.Verdict.STANDBY if ok else placement.Verdict.STANDBY_RESERVED
            return verdict(cls, req)

        setattr(placement, "verdict", lower)  # noqa: B010 (a module's global)
    elif name == "split-gangs":
        import dataclasses

        from extender.gangs import controller as gangs
        from extender.leasing import decisions

        plan_reclaim = decisions.plan_reclaim

        def per_pod(owner: Any, reclaimed: Any, devices: Any, holders: Any, *rest: Any) -> Any:
            alone = {u: dataclasses.replace(h, gang=None) for u, h in holders.items()}
            return plan_reclaim(owner, reclaimed, devices, alone, *rest)

        def nobody(*args: object, **kwargs: object) -> tuple[object, ...]:
            return ()

        setattr(decisions, "plan_reclaim", per_pod)  # noqa: B010 (a module's global)
        setattr(gangs, "mates_to_evict", nobody)  # noqa: B010 (a module's global)
    elif name == "sticky-full":
        from pathlib import Path

        from nodeagent.cache import cachestore

        measured = cachestore.free_bytes
        full_once: list[bool] = []

        def stale(path: Path) -> int:
            if full_once:
                return 0
            free = measured(path)
            if free < 1 << 20:  # the disk seen full once is taken as full from then on
                full_once.append(True)
            return free

        setattr(cachestore, "free_bytes", stale)  # noqa: B010 (a module's global)
    elif name == "skip-release":
        from extender.queues import controller as queues

        def release_nothing(*args: object, **kwargs: object) -> list[object]:
            return []

        setattr(queues, "release", release_nothing)  # noqa: B010 (a module's global)
    else:
        raise SystemExit(f"sitecustomize: no mutation {name!r}")
    print(f"tidelease soak mutation {name!r} in pid {os.getpid()}", file=sys.stderr, flush=True)


# The mutations of the node agent's code; every other one is the extenders' and controllers'.
AGENT_MUTATIONS = frozenset({"sticky-full"})

_role = next((a for a in sys.argv[1:4] if a in ("extender", "controllers", "agent")), None)
if _role is not None and os.path.basename(sys.argv[0]) == "tidelease":
    _name = os.environ.get("TIDELEASE_SOAK_MUTATION", "")
    if _name and (_name in AGENT_MUTATIONS) == (_role == "agent"):
        _mutate(_name)
    if os.environ.get("TIDELEASE_TEST_CRASH_AT") and _role != "agent":
        _crash(os.environ["TIDELEASE_TEST_CRASH_AT"])
