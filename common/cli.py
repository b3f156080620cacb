"""The ``tidelease`` command: one entry point, a subcommand per component."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from common.errors import InvalidInput
from common.logsetup import setup_logging

log = logging.getLogger("tidelease")


def _extender(args: argparse.Namespace) -> int:
    from extender.running import run_extender
    from extender.settings import load_settings
    from extender.snapshot import load_snapshot

    settings = load_settings(
        file=args.config,
        overrides={
            "host": args.host,
            "port": args.port,
            "snapshot": args.snapshot,
            "kubeconfig": args.kubeconfig,
        },
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if settings.snapshot is not None:
            store = load_snapshot(settings.snapshot)
            log.info("offline mode: serving the objects of %s", settings.snapshot)
            await run_extender(store=store, settings=settings, stop=stop, drain_s=0.0)
            return
        from extender.kubestore import KubeStore

        kube = await KubeStore.connect(settings.kubeconfig, settings.agent_namespace)
        try:
            await run_extender(store=kube, settings=settings, stop=stop)
        finally:
            await kube.close()

    asyncio.run(main())
    return 0


def _demo(args: argparse.Namespace) -> int:
    from extender.demo import run_demo

    asyncio.run(run_demo())
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    """Write the demo cluster as a List, a starting point for --snapshot files."""
    import yaml

    from extender.demo import demo_objects

    yaml.safe_dump(
        {"apiVersion": "v1", "kind": "List", "items": demo_objects()}, sys.stdout, sort_keys=False
    )
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidelease", description="Elastic GPU leasing on Kubernetes")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    p.add_argument("--log-json", action="store_true", help="one JSON object per log line")
    sub = p.add_subparsers(dest="command", required=True)

    ext = sub.add_parser("extender", help="run the kube-scheduler extender")
    ext.add_argument("--config", type=Path, help="settings file (YAML)")
    ext.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    ext.add_argument("--port", type=int, help="port to listen on (default 8888)")
    ext.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    ext.add_argument(
        "--snapshot",
        type=Path,
        help="offline mode: serve the objects of this YAML/JSON List instead of an API server",
    )
    ext.set_defaults(run=_extender)

    demo = sub.add_parser("demo", help="serve a built-in cluster and replay a day of tides")
    demo.set_defaults(run=_demo)

    snap = sub.add_parser("demo-snapshot", help="print the demo cluster as a List for --snapshot")
    snap.set_defaults(run=_snapshot)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup_logging(args.log_level, json_format=args.log_json)
    try:
        code: int = args.run(args)
    except InvalidInput as e:
        for problem in e.problems:
            print(f"tidelease: {problem}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
