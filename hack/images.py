#!/usr/bin/env python3
"""Build tidelease's local test images as docker-archive tarballs, from the host's static busybox.

No registry is reachable from the test machines, so the images that a local containerd or a real
kubelet runs are made here: one layer holding /bin/busybox and a few of its applets, and an image
config naming the command. The tarballs import with ``ctr -n k8s.io images import``; an image
named ``local/app:v1`` is stored as ``docker.io/local/app:v1``. Builds are deterministic (fixed
mtimes), so the same busybox gives the same image ids run after run.

usage: hack/images.py OUT_DIR [NAME ...]  (default: every image of IMAGES; one path per line)

The images of EXTRA (large ones, for benchmarks) are built only when named.

The same archive writer packs images from root filesystem directories (hack/build-image.sh:
the tidelease image and the local kube-scheduler image):

usage: hack/images.py pack --out FILE --mtime EPOCH --tag NAME --layer DIR[=WHAT] ...
           [--gzip] [--user U] [--entrypoint JSON] [--cmd JSON] [--env K=V] [--label K=V]
           [--workdir DIR]   (prints the image id: the digest of the image config)

Each directory becomes one layer (its contents, not itself), written reproducibly: entries in
sorted order, every mtime EPOCH, owners and modes as on disk, no user or group names.

usage: hack/images.py debindex DIR SUITE   (writes DIR/Packages and DIR/Release: DIR's .deb
           files as a flat apt repository of SUITE, for hack/build-image.sh --same-inputs)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

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


def _add_file(tar: tarfile.TarFile, name: str, path: Path) -> None:
    with path.open("rb") as f:
        tar.addfile(_entry(name, tarfile.REGTYPE, 0o644, size=path.stat().st_size), f)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _gzip(src: Path, dst: Path) -> None:
    """Compress reproducibly: no name and a zero mtime in the gzip header."""
    with (
        src.open("rb") as f,
        dst.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
    ):
        shutil.copyfileobj(f, gz, 1 << 20)


def write_archive(
    path: Path,
    layers: Sequence[bytes | Path],
    config: dict[str, object],
    tags: Sequence[str],
    *,
    gzip_layers: bool = False,
) -> str:
    """Write a docker-archive tarball (what ``ctr images import`` and ``docker load`` take) at
    ``path``; its image id, the digest of the image config.

    ``layers`` are uncompressed layer tarballs, bytes or files, bottom first; ``config`` is the
    image config without ``rootfs``, which is added here from the layers' digests. With
    ``gzip_layers`` the layers are stored gzip-compressed (reproducibly: the image id, which
    names only uncompressed digests, does not depend on the compressor). Written to a temporary
    file first, so that ``path`` is either absent or whole.
    """
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".archive-") as tmp:
        files = []
        for i, layer in enumerate(layers):
            if isinstance(layer, bytes):
                file = Path(tmp) / f"{i}.tar"
                file.write_bytes(layer)
                layer = file
            files.append(layer)
        diff_ids = [_sha256(f) for f in files]
        stored = files
        if gzip_layers:
            stored = [Path(tmp) / f"{i}.tar.gz" for i in range(len(files))]
            for src, dst in zip(files, stored, strict=True):
                _gzip(src, dst)
        data = json.dumps(
            {**config, "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]}},
            sort_keys=True,
        ).encode()
        config_id = hashlib.sha256(data).hexdigest()
        names = [f"{d}/layer.tar" for d in diff_ids]
        manifest = [{"Config": f"{config_id}.json", "RepoTags": list(tags), "Layers": names}]
        tmp_path = Path(tmp) / "archive.tar"
        with tarfile.open(tmp_path, "w") as tar:
            _add(tar, f"{config_id}.json", data)
            for name, file in zip(names, stored, strict=True):
                _add_file(tar, name, file)
            _add(tar, "manifest.json", json.dumps(manifest).encode())
        tmp_path.replace(path)
    return f"sha256:{config_id}"


def build(image: Image, layer: bytes, out: Path) -> Path:
    """Write ``image`` as a docker-archive tarball under ``out``; its path."""
    layers = [layer] + ([_padding(image)] if image.padding_mib else [])
    config: dict[str, object] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": list(image.cmd), "Env": list(image.env)},
    }
    path = out / (image.name.replace("/", "_").replace(":", "_") + ".tar")
    write_archive(path, layers, config, [image.name])
    return path


# ---------------------------------------------------------------------------------------------
# Images from root filesystem directories (hack/build-image.sh).
# ---------------------------------------------------------------------------------------------


def _walk(root: Path, rel: str = "") -> Iterator[tuple[Path, str]]:
    """Every path under ``root`` with its name relative to it: sorted, parents first."""
    with os.scandir(root / rel if rel else root) as entries:
        ordered = sorted(entries, key=lambda e: e.name)
    for entry in ordered:
        name = f"{rel}/{entry.name}" if rel else entry.name
        yield Path(entry.path), name
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(root, name)


def write_layer(root: Path, out: BinaryIO, *, mtime: int) -> None:
    """The contents of ``root`` as a reproducible layer tarball: sorted entries, every mtime
    ``mtime``, numeric owners and modes as on disk (no names), hard links kept. Anything but
    directories, regular files and symbolic links is refused (a rootfs' /dev stays empty: the
    runtime fills it)."""
    first: dict[tuple[int, int], str] = {}  # (device, inode) of a hard-linked file: its name
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, name in _walk(root):
            st = path.lstat()
            info = tarfile.TarInfo(name)
            info.mode = stat.S_IMODE(st.st_mode)
            info.uid, info.gid = st.st_uid, st.st_gid
            info.uname = info.gname = ""
            info.mtime = mtime
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in first:
                    info.type = tarfile.LNKTYPE
                    info.linkname = first[key]
                    tar.addfile(info)
                    continue
                first[key] = name
                info.size = st.st_size
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                raise ValueError(f"{path}: not a directory, regular file or symbolic link")


def _rfc3339(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _pairs(values: Sequence[str], what: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise SystemExit(f"images.py pack: {what} must be KEY=VALUE: {value!r}")
        pairs.append((key, rest))
    return pairs


def _json_list(value: str) -> list[str]:
    parsed = json.loads(value)
    if not isinstance(parsed, list) or not all(isinstance(v, str) for v in parsed):
        raise argparse.ArgumentTypeError(f"not a JSON list of strings: {value}")
    return parsed


def pack(argv: list[str]) -> int:
    """``hack/images.py pack``: an image from root filesystem directories, one layer each."""
    parser = argparse.ArgumentParser(prog="hack/images.py pack", description=pack.__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the archive to write")
    parser.add_argument("--mtime", type=int, required=True, help="every mtime; the created time")
    parser.add_argument("--tag", action="append", required=True, help="repository:tag")
    parser.add_argument("--layer", action="append", required=True, help="DIR[=what made it]")
    parser.add_argument("--gzip", action="store_true", help="store the layers gzip-compressed")
    parser.add_argument("--user", help="the default user, uid[:gid]")
    parser.add_argument("--entrypoint", type=_json_list, help='JSON, e.g. ["/bin/app"]')
    parser.add_argument("--cmd", type=_json_list, help='JSON, e.g. ["--help"]')
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--workdir", help="the working directory")
    args = parser.parse_args(argv)

    created = _rfc3339(args.mtime)
    runtime: dict[str, object] = {"Env": [f"{k}={v}" for k, v in _pairs(args.env, "--env")]}
    if args.label:
        runtime["Labels"] = dict(_pairs(args.label, "--label"))
    for key, value in (
        ("User", args.user),
        ("Entrypoint", args.entrypoint),
        ("Cmd", args.cmd),
        ("WorkingDir", args.workdir),
    ):
        if value is not None:
            runtime[key] = value
    layers, history = [], []
    with tempfile.TemporaryDirectory(dir=args.out.parent, prefix=".layers-") as tmp:
        for i, spec in enumerate(args.layer):
            root, _, what = spec.partition("=")
            if not Path(root).is_dir():
                raise SystemExit(f"images.py pack: not a directory: {root}")
            layer = Path(tmp) / f"{i}.tar"
            with layer.open("wb") as f:
                write_layer(Path(root), f, mtime=args.mtime)
            layers.append(layer)
            history.append({"created": created, "created_by": what or f"layer {i}"})
        config: dict[str, object] = {
            "architecture": "amd64",
            "os": "linux",
            "created": created,
            "config": runtime,
            "history": history,
        }
        print(write_archive(args.out, layers, config, args.tag, gzip_layers=args.gzip))
    return 0


def deb_index(debs: Path) -> str:
    """The ``Packages`` index of a flat apt repository holding the ``.deb`` files of ``debs``:
    each package's control fields (``dpkg-deb --field``) with its file name, size and SHA256."""
    stanzas = []
    for deb in sorted(debs.glob("*.deb")):
        control = subprocess.run(
            ["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True
        ).stdout.rstrip("\n")
        digest = hashlib.sha256(deb.read_bytes()).hexdigest()
        size = deb.stat().st_size
        stanzas.append(f"{control}\nFilename: ./{deb.name}\nSize: {size}\nSHA256: {digest}\n")
    return "\n".join(stanzas)


def deb_release(suite: str, packages: bytes) -> str:
    """The ``Release`` file of a flat repository of ``suite`` whose index is ``packages``:
    mmdebstrap picks the essential packages of the suite it is given by archive or codename."""
    digest = hashlib.sha256(packages).hexdigest()
    return (
        f"Origin: tidelease\nLabel: tidelease\nSuite: {suite}\nCodename: {suite}\n"
        f"Architectures: amd64 all\nSHA256:\n {digest} {len(packages)} Packages\n"
    )


def debindex(argv: list[str]) -> int:
    """``hack/images.py debindex DIR SUITE``: DIR/Packages and DIR/Release for the .deb files
    in DIR, a flat apt repository of SUITE."""
    parser = argparse.ArgumentParser(prog="hack/images.py debindex", description=debindex.__doc__)
    parser.add_argument("dir", type=Path)
    parser.add_argument("suite")
    args = parser.parse_args(argv)
    index = deb_index(args.dir).encode()
    if not index:
        print(f"images.py debindex: no .deb files in {args.dir}", file=sys.stderr)
        return 1
    (args.dir / "Packages").write_bytes(index)
    (args.dir / "Release").write_text(deb_release(args.suite, index))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["pack"]:
        return pack(argv[1:])
    if argv[:1] == ["debindex"]:
        return debindex(argv[1:])
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
