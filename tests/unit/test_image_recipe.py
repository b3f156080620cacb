"""The two recipes of the tidelease image say the same: hack/build-image.sh (built here, from
Debian's packages with mmdebstrap) and the Containerfile (built elsewhere, from
debian:bookworm-slim). Both files are read as text; nothing is built.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "hack" / "build-image.sh").read_text()
CONTAINERFILE = (ROOT / "Containerfile").read_text()


def _script_var(name: str) -> str:
    """A scalar assignment of the script, ``NAME=value`` (comments dropped)."""
    found = re.search(rf"^{name}=(\S+)", SCRIPT, re.MULTILINE)
    assert found, f"hack/build-image.sh sets no {name}"
    return found.group(1)


def _script_array(name: str) -> list[str]:
    """An array assignment of the script, ``NAME=(a b c)``, one line or several."""
    found = re.search(rf"^{name}=\((.*?)\)$", SCRIPT, re.MULTILINE | re.DOTALL)
    assert found, f"hack/build-image.sh sets no array {name}"
    return shlex.split(found.group(1), comments=True)


def _instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in CONTAINERFILE.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def _runtime_stage() -> list[tuple[str, str]]:
    """The instructions of the last stage: the image that ships."""
    instructions = _instructions()
    last = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last + 1 :]


def _one(op: str) -> str:
    found = [arg for o, arg in _runtime_stage() if o == op]
    assert len(found) == 1, f"the runtime stage has {len(found)} {op} instructions"
    return found[0]


def _apt_packages(run: str) -> set[str]:
    words = shlex.split(run)
    start = words.index("--no-install-recommends") + 1
    end = words.index("&&", start) if "&&" in words[start:] else len(words)
    return set(words[start:end])


def test_debian_packages_agree() -> None:
    runs = [arg for op, arg in _runtime_stage() if op == "RUN" and "apt-get install" in arg]
    assert len(runs) == 1, "the runtime stage installs its Debian packages in one RUN"
    assert _apt_packages(runs[0]) == set(_script_array("TL_IMAGE_PACKAGES"))


def test_both_start_from_the_same_debian_release() -> None:
    suite = _script_var("TL_IMAGE_SUITE")
    base = re.search(r"^ARG DEBIAN=(\S+)$", CONTAINERFILE, re.MULTILINE)
    assert base, "the Containerfile names its base in ARG DEBIAN"
    assert base.group(1).endswith(f"debian:{suite}-slim")


def test_user_agrees() -> None:
    uid = _script_var("TL_IMAGE_UID")
    user = _script_var("TL_IMAGE_USER")
    assert uid == "65532"
    assert _one("USER") == f"{uid}:{uid}"
    useradd = next(arg for op, arg in _runtime_stage() if op == "RUN" and "useradd" in arg)
    assert f"--uid {uid}" in useradd
    assert f"--gid {uid}" in useradd
    assert f"groupadd --gid {uid} {user}" in useradd
    assert useradd.split("&&")[1].split()[-1] == user
    assert _one("WORKDIR") == f"/home/{user}"
    assert '--workdir "/home/${TL_IMAGE_USER}"' in SCRIPT


def test_entrypoint_and_virtualenv_agree() -> None:
    venv = _script_var("TL_IMAGE_VENV")
    entrypoint = _script_var("TL_IMAGE_ENTRYPOINT")
    assert entrypoint == f"{venv}/bin/tidelease"
    assert json.loads(_one("ENTRYPOINT")) == [entrypoint]
    assert json.loads(_one("CMD")) == ["--help"]
    assert "--cmd '[\"--help\"]'" in SCRIPT
    copies = [arg for op, arg in _runtime_stage() if op == "COPY"]
    assert copies == [f"--from=builder {venv} {venv}"]


def test_environment_agrees() -> None:
    venv = _script_var("TL_IMAGE_VENV")
    script = [e.replace("${TL_IMAGE_VENV}", venv) for e in _script_array("TL_IMAGE_ENV")]
    assert shlex.split(_one("ENV")) == script


def test_label_keys_agree() -> None:
    def keys(text: str) -> set[str]:
        return set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", text))

    assert keys(_one("LABEL")) == keys(SCRIPT)
    assert {"version", "revision", "source"} <= {k.rsplit(".", 1)[1] for k in keys(SCRIPT)}


def test_the_same_requirement_without_extras() -> None:
    """Both install tidelease alone from wheels: not dev (tests, linters), not plots."""
    requirement = _script_var("TL_IMAGE_REQUIREMENT")
    installs = re.findall(r"--find-links\s+\S+\s+(\S+)", CONTAINERFILE)
    assert installs == [requirement]
    assert requirement == "tidelease"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"])
    for extra in ("dev", "plots"):
        assert extra in project["optional-dependencies"]
        for dep in project["optional-dependencies"][extra]:
            name = re.split(r"[<>=\[ ;]", dep)[0]
            assert name not in runtime, f"{name} (extra {extra}) is a runtime dependency too"


@pytest.mark.parametrize("tool", ["gcc", "build-essential", "python3-pip", "python3-dev"])
def test_no_compiler_or_pip_in_the_runtime_stage(tool: str) -> None:
    runtime = " ".join(arg for _, arg in _runtime_stage())
    assert tool not in runtime.split()
    assert tool not in _script_array("TL_IMAGE_PACKAGES")
