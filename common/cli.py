"""The ``tidelease`` command: one entry point that dispatches to each side's subcommands.

The control plane (extender/main.py) and the node agent (nodeagent/main.py) each register their
subcommands through the ``tidelease.commands`` entry point group (pyproject.toml), so nothing in
``common`` imports either side: a node agent image could ship without the extender's code.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

from common.errors import InvalidInput
from common.logsetup import FORMATS, setup_logging

GROUP = "tidelease.commands"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidelease", description="Elastic GPU leasing on Kubernetes")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text, or json: one JSON object per line, with the verb or controller and the "
        "object it concerns",
    )
    p.add_argument("--log-json", action="store_true", help=argparse.SUPPRESS)  # the old flag
    sub = p.add_subparsers(dest="command", required=True)
    found = sorted(entry_points(group=GROUP), key=lambda ep: ep.name)
    if not found:
        raise SystemExit(f"tidelease: no commands registered ({GROUP}); is tidelease installed?")
    for ep in found:
        ep.load()(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if getattr(args, "passes_extra", False):
        args.rest = extra + args.rest  # the command parses its own options
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    setup_logging(args.log_level, json_format=args.log_json or args.log_format == "json")
    try:
        code: int = args.run(args)
    except InvalidInput as e:
        for problem in e.problems:
            print(f"tidelease: {problem}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
