#!/usr/bin/env python3
"""Build tidelease's local test images as docker-archive tarballs, from the host's static busybox.

No registry is reachable from the test machines, so the images that a local containerd or a real
kubelet runs are made here: one layer holding /bin/busybox and a few of its applets, and an image
config naming the command. The tarballs import with ``ctr -n k8s.io images import``; an image
named ``local/app:v1`` is stored as ``docker.io/local/app:v1``. Builds are deterministic (fixed
mtimes), so the same busybox gives the same image ids run after run.

usage: hack/images.py OUT_DIR [NAME ...]  (default: every image of IMAGES; one path per line)

The images of EXTRA (large ones, for benchmarks) are built only when named.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

APPLETS = (
    *("sh", "cat", "date", "echo", "env", "grep", "hostname", "httpd", "id", "ip", "kill"),
    *("ls", "mkdir", "mount", "nc", "ps", "rm", "sleep", "test", "true", "false", "wget"),
)

# The app answers HTTP on :8080 with its version at /version, and exits promptly on SIGTERM (a
# PID 1 without a handler would ignore it and make every stop wait for its whole timeout).
_APP = (
    "trap 'exit 0' TERM INT; mkdir -p /www; echo {version} >/www/version; "
    "echo app {version} started; httpd -f -p 8080 -h /www & wait"
)


@dataclass(frozen=True)
class Image:
    name: str  # repository:tag, stored by containerd as docker.io/<name>
    cmd: tuple[str, ...]
    env: tuple[str, ...] = ("PATH=/bin",)
    padding_mib: int = 0  # a second layer of this many MiB of incompressible bytes
    seed: int = 0  # of the padding: distinct seeds, distinct content (no shared blobs)


IMAGES = {
    # The sandbox ("pause") image; containerd stops sandboxes with SIGKILL, so sleep will do.
    "pause": Image("local/pause:v1", ("/bin/sleep", "2147483647")),
    "app-v1": Image("local/app:v1", ("/bin/sh", "-c", _APP.format(version="v1"))),
    "app-v2": Image("local/app:v2", ("/bin/sh", "-c", _APP.format(version="v2"))),
}


# Built only when named: images whose size matters (the prelaunch benchmark's pulls).
EXTRA = {
    "bulk-a": Image("local/bulk:a", ("/bin/sleep", "3600"), padding_mib=32, seed=1),
    "bulk-b": Image("local/bulk:b", ("/bin/sleep", "3600"), padding_mib=96, seed=2),
}
KNOWN = {**IMAGES, **EXTRA}


def _entry(name: str, kind: bytes, mode: int, **extra: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = 0
    for key, value in extra.items():
        setattr(info, key, value)
    return info


def _layer(busybox: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "www"):
            tar.addfile(_entry(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
        data = busybox.read_bytes()
        tar.addfile(_entry("bin/busybox", tarfile.REGTYPE, 0o755, size=len(data)), io.BytesIO(data))
        for applet in APPLETS:
            tar.addfile(_entry(f"bin/{applet}", tarfile.SYMTYPE, 0o777, linkname="busybox"))
    return buf.getvalue()


def _padding(image: Image) -> bytes:
    """A layer holding /pad: ``padding_mib`` MiB of pseudo-random bytes, fixed by the seed."""
    data = random.Random(image.seed).randbytes(image.padding_mib << 20)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_entry("pad", tarfile.REGTYPE, 0o644, size=len(data)), io.BytesIO(data))
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_entry(name, tarfile.REGTYPE, 0o644, size=len(data)), io.BytesIO(data))


def build(image: Image, layer: bytes, out: Path) -> Path:
    """Write ``image`` as a docker-archive tarball under ``out``; its path."""
    layers = [layer] + ([_padding(image)] if image.padding_mib else [])
    layer_ids = [hashlib.sha256(data).hexdigest() for data in layers]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": list(image.cmd), "Env": list(image.env)},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{i}" for i in layer_ids]},
        },
        sort_keys=True,
    ).encode()
    config_id = hashlib.sha256(config).hexdigest()
    manifest = [
        {
            "Config": f"{config_id}.json",
            "RepoTags": [image.name],
            "Layers": [f"{i}/layer.tar" for i in layer_ids],
        }
    ]
    path = out / (image.name.replace("/", "_").replace(":", "_") + ".tar")
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        _add(tar, f"{config_id}.json", config)
        for layer_id, data in zip(layer_ids, layers, strict=True):
            _add(tar, f"{layer_id}/layer.tar", data)
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    tmp.replace(path)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("names", nargs="*", help=f"images to build (default: {', '.join(IMAGES)})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in KNOWN]
    if unknown:
        parser.error(f"unknown images: {', '.join(unknown)} (known: {', '.join(KNOWN)})")
    busybox = shutil.which("busybox")
    if busybox is None:
        print("busybox not found (install Debian's busybox-static)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    layer = _layer(Path(busybox))
    for name in args.names or IMAGES:
        print(build(KNOWN[name], layer, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
