"""The soak's deliberate bugs (tests/soak/mutations.py), patched into a tidelease process at
start: Python imports ``sitecustomize`` from PYTHONPATH before anything else. Only the
``tidelease extender`` and ``tidelease controllers`` processes are touched, only when
``TIDELEASE_SOAK_MUTATION`` names a mutation; anything else this directory is on the path of
(a helper script, a Python without tidelease's packages) is left alone."""

from __future__ import annotations

import os
import sys


def _patch(name: str) -> None:
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
    else:
        raise SystemExit(f"sitecustomize: no mutation {name!r}")
    print(f"tidelease soak mutation {name!r} in pid {os.getpid()}", file=sys.stderr, flush=True)


_name = os.environ.get("TIDELEASE_SOAK_MUTATION", "")
_ours = any(a in ("extender", "controllers") for a in sys.argv[1:4])
if _name and _ours and os.path.basename(sys.argv[0]) == "tidelease":
    _patch(_name)
