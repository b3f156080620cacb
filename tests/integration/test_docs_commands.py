"""The install commands the docs give, as written (issue 38): every shell block of README.md and
docs/*.md is read, and each `helm install` or `helm upgrade` of tidelease's chart is rendered
with exactly its own arguments (`helm template` in place of install: the same chart, namespace,
`--set` and `-f` values; REGISTRY, the placeholder for the admin's registry, given a name), so a
value the docs name that the chart no longer takes, or a values file that moved, fails here; the
`hack/` scripts and values files they name exist. (The GPU Operator's own chart, named by its
repository, is rendered by tests/integration/test_gpu_operator_recipe.py.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.chart import CHART, ROOT, helm, kube_version

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^ *```(sh|bash)\s*$")
CHART_PATH = "manifests/charts/tidelease"
DROPPED = {"--create-namespace", "--reuse-values", "--wait", "--atomic"}


def commands(doc: Path) -> list[list[str]]:
    """The commands of the doc's shell blocks, one argv each (continuations joined, comments
    and prompts dropped)."""
    out: list[list[str]] = []
    block: list[str] | None = None
    for line in doc.read_text().splitlines():
        if block is None:
            if FENCE.match(line):
                block = []
            continue
        if line.strip().startswith("```"):
            text = "\n".join(block).replace("\\\n", " ")
            for logical in text.splitlines():
                argv = shlex.split(logical.strip().removeprefix("$ "), comments=True)
                if argv:
                    out.append(argv)
            block = None
            continue
        block.append(line)
    return out


def chart_commands() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        for argv in commands(doc):
            helm_install = argv[:1] == ["helm"] and argv[1:2] in (["install"], ["upgrade"])
            if helm_install and CHART_PATH in argv:
                found.append((f"{doc.relative_to(ROOT)}: {shlex.join(argv)}", argv))
    return found


CHART_COMMANDS = chart_commands()


def test_the_docs_give_the_install_commands_this_test_reads() -> None:
    docs = {name.split(":")[0] for name, _ in CHART_COMMANDS}
    assert {"README.md", "docs/install.md", "docs/gpu-operator.md", "docs/operating.md"} <= docs
    assert len(CHART_COMMANDS) >= 6


@pytest.mark.parametrize("argv", [c for _, c in CHART_COMMANDS], ids=[n for n, _ in CHART_COMMANDS])
def test_a_documented_install_renders_as_written(argv: list[str]) -> None:
    release, chart, *rest = argv[2:]
    assert chart == CHART_PATH
    args = [a.replace("REGISTRY/", "registry.example/") for a in rest if a not in DROPPED]
    for i, a in enumerate(args):
        if a == "-f":
            assert (ROOT / args[i + 1]).is_file(), f"values file {args[i + 1]}"
    out = helm(
        "template", release, str(CHART), "--kube-version", kube_version(), *args, check=False
    )
    assert out.returncode == 0, out.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(out.stdout) if d}
    assert {"DaemonSet", "Deployment"} <= kinds


def test_the_scripts_the_docs_run_exist() -> None:
    named = {argv[0] for doc in DOCS for argv in commands(doc) if argv[0].startswith("hack/")}
    assert {"hack/demo.sh", "hack/test.sh", "hack/build-image.sh"} <= named
    for script in named:
        path = ROOT / script
        assert path.is_file(), script
        assert path.stat().st_mode & 0o111, f"{script} is not executable"
