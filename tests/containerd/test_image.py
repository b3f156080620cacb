"""The images of hack/build-image.sh on a real containerd, run through CRI as a kubelet would.

The tidelease image is built (or taken from the script's cache, keyed by the commit and the
tree's state), imported into the session's containerd and run: ``tidelease --help`` exits 0
under the image's own entrypoint; the process runs as uid 65532; there is no compiler, no pip,
no test tool, no matplotlib, no apt list and no documentation beyond the copyright files. A
second build of the same tree (``--rebuild``) gives the same image id: the recipe is
reproducible. The local kube-scheduler image runs its binary as 65532 too.

A cold build takes about three minutes on two cores, the rebuild about a minute and a half;
docs/image.md has the figures.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeagent.cri import api_pb2 as pb
from nodeagent.cri.client import GrpcRuntime
from nodeagent.cri.runtime import ContainerState, ContainerStatus
from tests.containerd.conftest import ROOT, Containerd, remove_sandbox, sandbox_config
from tests.polling import eventually

pytestmark = pytest.mark.containerd

BUILD = ROOT / "hack" / "build-image.sh"
UID = 65532
PYTHON = "/opt/tidelease/bin/python"

# Run by the image's Python: what the image holds, as JSON.
FACTS = r"""
import glob, importlib.util, json, os, pwd, shutil
site = glob.glob("/opt/tidelease/lib/python3*/site-packages")[0]
print(json.dumps({
    "uid": os.getuid(),
    "gid": os.getgid(),
    "user": pwd.getpwuid(os.getuid()).pw_name,
    "home": os.path.expanduser("~"),
    "on_path": {t: shutil.which(t) for t in (
        "cc", "gcc", "c++", "g++", "clang", "make", "pip", "pip3", "pytest", "apt-get")},
    "compilers": sorted(
        glob.glob("/usr/bin/*gcc*") + glob.glob("/usr/bin/*g++*") + glob.glob("/usr/bin/clang*")
        + glob.glob("/usr/lib/gcc/*/*/cc1*")),
    "modules": {m: importlib.util.find_spec(m) is not None for m in (
        "pip", "pytest", "hypothesis", "mypy", "ruff", "matplotlib", "numpy", "scipy",
        "extender", "nodeagent")},
    "pip_anywhere": sorted(
        glob.glob("/usr/lib/python3*/**/pip", recursive=True)
        + glob.glob(site + "/pip") + glob.glob(site + "/pip-*")),
    "test_suites": sorted(glob.glob(site + "/numpy/**/tests", recursive=True)
        + glob.glob(site + "/scipy/**/tests", recursive=True)),
    "apt_lists": os.listdir("/var/lib/apt/lists") if os.path.isdir("/var/lib/apt/lists") else [],
    "docs": sorted({os.path.basename(p) for p in glob.glob("/usr/share/doc/*/*")}),
    "man": os.listdir("/usr/share/man") if os.path.isdir("/usr/share/man") else [],
}))
"""


@dataclass(frozen=True)
class Archive:
    path: Path
    image_id: str  # sha256:<digest of the image config>
    tags: tuple[str, ...]
    config: dict[str, Any]

    @property
    def ref(self) -> str:
        """The last tag as containerd names it (tidelease:v -> docker.io/library/tidelease:v)."""
        tag = self.tags[-1]
        first = tag.split("/", 1)[0]
        if "/" in tag and ("." in first or ":" in first):
            return tag
        return f"docker.io/{tag}" if "/" in tag else f"docker.io/library/{tag}"


def read_archive(path: Path) -> Archive:
    """The image id, tags and config of a docker-archive tarball."""
    with tarfile.open(path) as tar:
        manifest_file = tar.extractfile("manifest.json")
        assert manifest_file is not None
        manifest = json.load(manifest_file)
        assert len(manifest) == 1, manifest
        config_file = tar.extractfile(manifest[0]["Config"])
        assert config_file is not None
        data = config_file.read()
    digest = hashlib.sha256(data).hexdigest()
    assert manifest[0]["Config"] == f"{digest}.json", "the config is not named by its digest"
    return Archive(path, f"sha256:{digest}", tuple(manifest[0]["RepoTags"]), json.loads(data))


def build(*args: str) -> Archive:
    """hack/build-image.sh ARGS: the archive it printed."""
    proc = subprocess.run(
        [str(BUILD), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=1200,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"hack/build-image.sh {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stderr[-6000:]}",
            pytrace=False,
        )
    return read_archive(Path(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def tidelease_image(containerd: Containerd) -> Archive:
    """The tidelease image of this tree, imported into the session's containerd."""
    return build("--import", containerd.sock)


@dataclass(frozen=True)
class Run:
    status: ContainerStatus
    output: str


def _log_text(path: Path) -> str:
    """The messages of a CRI log file (``<time> <stream> <P|F> <message>`` lines)."""
    text = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 3)
        text.append((parts[3] if len(parts) == 4 else "") + ("\n" if parts[2] == "F" else ""))
    return "".join(text)


async def run_once(
    runtime: GrpcRuntime,
    ctrd: Containerd,
    tmp: Path,
    name: str,
    image: str,
    *,
    command: tuple[str, ...] = (),
    args: tuple[str, ...] = (),
) -> Run:
    """One container in a sandbox of its own, run to its end; its status and output."""
    logs = tmp / f"{name}-logs"
    logs.mkdir()
    config = sandbox_config(ctrd, name, logs)
    sandbox_id = await runtime.run_sandbox(config)
    try:
        container = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image=image),
            command=list(command),
            args=list(args),
            log_path=f"{name}.log",
        )
        container_id = await runtime.create_container(sandbox_id, container, config)
        await runtime.start_container(container_id)

        async def exited() -> ContainerStatus | None:
            status = await runtime.container_status(container_id)
            return status if status.state is ContainerState.EXITED else None

        status = await eventually(exited, within_s=60)
        return Run(status, _log_text(logs / f"{name}.log"))
    finally:
        await remove_sandbox(runtime, sandbox_id)


def test_the_image_is_described(tidelease_image: Archive) -> None:
    config = tidelease_image.config["config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["/opt/tidelease/bin/tidelease"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] in tidelease_image.tags[0]
    assert len(labels["org.opencontainers.image.revision"]) == 40
    version = labels["org.opencontainers.image.version"]
    short = tidelease_image.tags[1].split(":", 1)[1].removeprefix(f"{version}-")
    assert labels["org.opencontainers.image.revision"].startswith(short.removesuffix("-dirty"))
    # Nothing of the build machine: a clone's remote can be a local path, so no source label
    # unless the builder names one (and then the cache key names it too).
    assert "org.opencontainers.image.source" not in labels
    assert len(tidelease_image.config["rootfs"]["diff_ids"]) == 2  # Debian, then /opt/tidelease


async def test_help_exits_0_under_the_images_entrypoint(
    tidelease_image: Archive, runtime: GrpcRuntime, containerd: Containerd, tmp_path: Path
) -> None:
    info = await runtime.image_status(tidelease_image.ref)
    assert info is not None
    assert info.id == tidelease_image.image_id  # containerd runs what the archive holds

    run = await run_once(
        runtime, containerd, tmp_path, "tl-help", tidelease_image.ref, args=("--help",)
    )

    assert run.status.exit_code == 0, run.output
    assert run.output.startswith("usage: tidelease"), run.output
    for command in ("extender", "agent", "orchestrator", "simulate"):
        assert command in run.output


async def test_runs_as_65532_without_compilers_pip_or_test_tools(
    tidelease_image: Archive, runtime: GrpcRuntime, containerd: Containerd, tmp_path: Path
) -> None:
    run = await run_once(
        runtime,
        containerd,
        tmp_path,
        "tl-facts",
        tidelease_image.ref,
        command=(PYTHON, "-c", FACTS),
    )

    assert run.status.exit_code == 0, run.output
    facts = json.loads(run.output)
    assert (facts["uid"], facts["gid"], facts["user"]) == (UID, UID, "tidelease")
    assert facts["home"] == "/home/tidelease"
    assert facts["on_path"] == dict.fromkeys(facts["on_path"])  # none of them
    assert facts["compilers"] == []
    assert facts["pip_anywhere"] == []
    assert facts["modules"] == {
        "pip": False,
        "pytest": False,
        "hypothesis": False,
        "mypy": False,
        "ruff": False,
        "matplotlib": False,  # the optional extra "plots"
        "numpy": True,
        "scipy": True,
        "extender": True,
        "nodeagent": True,
    }
    assert facts["test_suites"] == []
    assert facts["apt_lists"] == []
    assert set(facts["docs"]) == {"copyright"}
    assert facts["man"] == []


def test_the_same_tree_and_inputs_give_the_same_image_id(tmp_path: Path) -> None:
    """Two builds from scratch of this tree: the second from the Debian packages and wheels of
    the first (``--same-inputs``), so that what Debian or the package index published in
    between (a stable update between two builds of one test run broke an earlier form of this
    test, which compared with the session's image) stays out. Inputs equal, so the same config
    and image id; the layers byte for byte the same."""
    first = build("--rebuild", "-o", str(tmp_path / "first.tar"))
    again = build("--rebuild", "--same-inputs", "-o", str(tmp_path / "again.tar"))

    assert again.config["rootfs"] == first.config["rootfs"]
    assert again.config == first.config
    assert again.image_id == first.image_id
    assert again.tags == first.tags
    assert (tmp_path / "again.tar").read_bytes() == (tmp_path / "first.tar").read_bytes()


async def test_the_kube_scheduler_image_runs_its_binary_as_65532(
    runtime: GrpcRuntime, containerd: Containerd, tmp_path: Path
) -> None:
    image = build("kube-scheduler", "--import", containerd.sock)
    assert image.config["config"]["User"] == f"{UID}:{UID}"
    assert image.config["config"]["Entrypoint"] == ["/usr/local/bin/kube-scheduler"]
    assert len(image.config["rootfs"]["diff_ids"]) == 1
    version = image.tags[0].rsplit(":", 1)[1]
    assert image.tags == (f"tidelease.local/kube-scheduler:{version}",)

    run = await run_once(runtime, containerd, tmp_path, "ks", image.ref, args=("--version",))

    assert run.status.exit_code == 0, run.output
    assert run.output.strip() == f"Kubernetes {version}"
