"""Hot restart in place vs re-creating the pod sandbox, and the prelaunch window W predicted vs
measured, on a real containerd (hack/containerd.sh, started here unless --socket is given).

Hot restart: the app container of a running sandbox restarted on the other image (app:v1 <->
app:v2) with :func:`nodeagent.hotrestart.insandbox.hot_restart`, timed until the pod answers
the new version over HTTP. Recreate: the sandbox stopped and removed, a new one run with the app
on the other image, timed until it answers (a new pod IP each time). Medians of --runs each.

Prelaunch (weflex eq. 1-3): the bandwidths are measured on calibration objects (an image
import, a file copy, a read into memory) and W predicted for other, larger objects, then
measured: the image "pull" is an import of a docker-archive tarball into containerd (no
registry is reachable), the checkpoint download a file copy, the "GPU load" a read into memory
(B_gpu stands for the host-to-device copy on a machine without GPUs). Cold node: nothing
cached (eta = 0); warm node: both present (eta = 1).

    python -m benchmarks.bench_hot_restart [--runs 7] [--ckpt-mib 256] [--socket SOCK] [--smoke]

Target (issue 6): hot restart at least 2x faster than recreate. ``--smoke``: 2 runs of each and
a 32 MiB checkpoint (the images stay those of hack/images.py), to check that the benchmark still
works.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common.prelaunch import Bandwidths, PrelaunchInputs, prelaunch_window
from nodeagent.cri import api_pb2 as pb
from nodeagent.cri.client import GrpcRuntime
from nodeagent.hotrestart.insandbox import hot_restart
from nodeagent.hotrestart.planning import RestartSettings

ROOT = Path(__file__).resolve().parents[1]
APP = {"v1": "docker.io/local/app:v1", "v2": "docker.io/local/app:v2"}
MIB = 1 << 20


@contextmanager
def containerd(base: Path) -> Iterator[dict[str, str]]:
    state = base / "ctrd"
    env = {**os.environ, "TL_CTRD_PARENT_PID": str(os.getpid())}
    log = (base / "containerd.log").open("w")
    proc = subprocess.Popen(
        [str(ROOT / "hack" / "containerd.sh"), "-D", str(state)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not (state / "containerd.env").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"containerd did not start; see {base / 'containerd.log'}")
            time.sleep(0.1)
        lines = (state / "containerd.env").read_text().splitlines()
        yield dict(line.split("=", 1) for line in lines if "=" in line)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return str(reply.read().decode().strip())
    except (urllib.error.URLError, OSError):
        return None


async def answers(ip: str, version: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while await asyncio.to_thread(_get, f"http://{ip}:8080/version") != version:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{ip} did not answer {version} within {within_s} s")
        await asyncio.sleep(0.005)


def sandbox_config(cgroup: str, name: str, logs: Path) -> pb.PodSandboxConfig:
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="bench"),
        hostname=name,
        log_directory=str(logs),
        linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"{cgroup}/{name}"),
    )


def app_config(version: str, data: Path) -> pb.ContainerConfig:
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app"),
        image=pb.ImageSpec(image=APP[version]),
        mounts=[pb.Mount(container_path="/www/data", host_path=str(data))],
        log_path="app.log",
    )


async def start_pod(
    rt: GrpcRuntime, config: pb.PodSandboxConfig, version: str, data: Path
) -> tuple[str, str]:
    sid = await rt.run_sandbox(config)
    cid = await rt.create_container(sid, app_config(version, data), config)
    await rt.start_container(cid)
    ip = (await rt.sandbox_status(sid)).ip
    await answers(ip, version)
    return sid, ip


async def remove(rt: GrpcRuntime, sid: str) -> None:
    await rt.stop_sandbox(sid)
    await rt.remove_sandbox(sid)


async def bench_restarts(rt: GrpcRuntime, cgroup: str, work: Path, runs: int) -> None:
    logs, data = work / "logs", work / "data"
    logs.mkdir()
    data.mkdir()
    settings = RestartSettings(stop_timeout_s=10)

    hot: list[float] = []
    config = sandbox_config(cgroup, "hot", logs)
    sid, ip = await start_pod(rt, config, "v1", data)
    pause_pid = (await rt.sandbox_status(sid)).pid
    try:
        for i in range(runs):
            version = "v2" if i % 2 == 0 else "v1"
            t = time.perf_counter()
            out = await hot_restart(
                rt, sandbox_id=sid, container="app", image=APP[version], settings=settings
            )
            if not out.succeeded:
                raise RuntimeError(out.reason)
            await answers(ip, version)
            hot.append(time.perf_counter() - t)
        after = await rt.sandbox_status(sid)
        assert (after.ip, after.pid) == (ip, pause_pid), "the sandbox changed"
    finally:
        await remove(rt, sid)

    recreate: list[float] = []
    ips = set()
    sid, ip = await start_pod(rt, sandbox_config(cgroup, "re0", logs), "v1", data)
    try:
        for i in range(runs):
            version = "v2" if i % 2 == 0 else "v1"
            t = time.perf_counter()
            await remove(rt, sid)
            sid = ""
            sid, ip = await start_pod(rt, sandbox_config(cgroup, f"re{i + 1}", logs), version, data)
            recreate.append(time.perf_counter() - t)
            ips.add(ip)
    finally:
        if sid:
            await remove(rt, sid)

    h, r = statistics.median(hot), statistics.median(recreate)
    print(f"hot restart in place   median {h * 1000:7.1f} ms  ({runs} runs, same IP and pause PID)")
    print(
        f"recreate the sandbox   median {r * 1000:7.1f} ms  ({runs} runs, {len(ips)} distinct IPs)"
    )
    print(f"ratio recreate / hot   {r / h:5.2f}x   (target >= 2x)")
    print(f"  hot runs (ms):      {' '.join(f'{x * 1000:.0f}' for x in hot)}")
    print(f"  recreate runs (ms): {' '.join(f'{x * 1000:.0f}' for x in recreate)}")


def ctr_import(sock: str, tarball: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        [
            "ctr",
            "--address",
            sock,
            "--namespace",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            "overlayfs",
            str(tarball),
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t


def copy_file(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    with src.open("rb") as fin, dst.open("wb") as fout:
        shutil.copyfileobj(fin, fout, 8 * MIB)
        fout.flush()
        os.fsync(fout.fileno())
    return time.perf_counter() - t


def load(path: Path) -> float:
    t = time.perf_counter()
    with path.open("rb") as f:
        while f.read(8 * MIB):
            pass
    return time.perf_counter() - t


def write_random(path: Path, mib: int) -> None:
    with path.open("wb") as f:
        for _ in range(mib):
            f.write(os.urandom(MIB))


@dataclass(frozen=True)
class Prepared:
    links: Bandwidths
    big_img: Path
    image_bytes: int
    checkpoint_bytes: int
    store: Path
    local: Path


def prepare_prelaunch(sock: str, work: Path, ckpt_mib: int) -> Prepared:
    """The objects, and the bandwidths measured on the small ones (a checkpoint a quarter of
    the size, at least 1 MiB)."""
    calib_mib = max(1, ckpt_mib // 4)
    images = work / "images"
    built = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "images.py"), str(images), "bulk-a", "bulk-b"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    calib_img, big_img = Path(built[0]), Path(built[1])
    store, local = work / "store", work / "local"
    store.mkdir()
    local.mkdir()
    write_random(store / "calib.ckpt", calib_mib)
    write_random(store / "model.ckpt", ckpt_mib)
    b_reg = calib_img.stat().st_size / ctr_import(sock, calib_img)
    b_stor = (calib_mib * MIB) / copy_file(store / "calib.ckpt", local / "calib.ckpt")
    b_gpu = (calib_mib * MIB) / load(local / "calib.ckpt")
    print(
        f"calibrated: image import {b_reg / MIB:.0f} MiB/s, checkpoint copy "
        f"{b_stor / MIB:.0f} MiB/s, load {b_gpu / MIB:.0f} MiB/s (B_net: local, unbounded)"
    )
    links = Bandwidths(net=float("inf"), registry=b_reg, storage=b_stor, gpu=b_gpu)
    return Prepared(links, big_img, big_img.stat().st_size, ckpt_mib * MIB, store, local)


async def bench_prelaunch(rt: GrpcRuntime, sock: str, prep: Prepared) -> None:
    links, big_img, store, local = prep.links, prep.big_img, prep.store, prep.local
    s_img, s_ckpt = prep.image_bytes, prep.checkpoint_bytes

    def predicted(hit: float) -> tuple[float, float, float]:
        w = prelaunch_window(
            PrelaunchInputs(
                image_bytes=s_img,
                checkpoint_bytes=s_ckpt,
                image_hit=hit,
                checkpoint_hit=hit,
                bandwidths=links,
            )
        )
        return w.image_s, w.checkpoint_s, w.window_s

    # Cold: the image imported and the checkpoint copied and loaded, in parallel.
    async def image_cold() -> float:
        return await asyncio.to_thread(ctr_import, sock, big_img)

    async def ckpt_cold() -> float:
        copy = await asyncio.to_thread(copy_file, store / "model.ckpt", local / "model.ckpt")
        return copy + await asyncio.to_thread(load, local / "model.ckpt")

    t = time.perf_counter()
    m_img, m_ckpt = await asyncio.gather(image_cold(), ckpt_cold())
    m_w = time.perf_counter() - t
    p_img, p_ckpt, p_w = predicted(0.0)
    print(f"cold node ({s_img / MIB:.0f} MiB image, {s_ckpt / MIB:.0f} MiB checkpoint, eta = 0):")
    print(f"  T_img  predicted {p_img:6.2f} s  measured {m_img:6.2f} s")
    print(f"  T_ckpt predicted {p_ckpt:6.2f} s  measured {m_ckpt:6.2f} s")
    print(f"  W      predicted {p_w:6.2f} s  measured {m_w:6.2f} s")

    # Warm: both present; the image is checked (ImageStatus), the checkpoint loaded.
    async def image_warm() -> float:
        t0 = time.perf_counter()
        status = await rt.image_status("docker.io/local/bulk:b")
        assert status is not None
        return time.perf_counter() - t0

    t = time.perf_counter()
    m_img, m_ckpt = await asyncio.gather(
        image_warm(), asyncio.to_thread(load, local / "model.ckpt")
    )
    m_w = time.perf_counter() - t
    p_img, p_ckpt, p_w = predicted(1.0)
    print("warm node (both cached, eta = 1):")
    print(f"  T_img  predicted {p_img:6.2f} s  measured {m_img:6.2f} s")
    print(f"  T_ckpt predicted {p_ckpt:6.2f} s  measured {m_ckpt:6.2f} s")
    print(f"  W      predicted {p_w:6.2f} s  measured {m_w:6.2f} s")


async def main_async(args: argparse.Namespace, facts: dict[str, str], work: Path) -> None:
    async with GrpcRuntime(facts["TL_CTRD_SOCK"], timeout_s=30) as rt:
        print(f"runtime: {await rt.version()}")
        await bench_restarts(rt, facts["TL_CTRD_CGROUP"], work, args.runs)
        if not args.no_prelaunch:
            prep = await asyncio.to_thread(
                prepare_prelaunch, facts["TL_CTRD_SOCK"], work, args.ckpt_mib
            )
            await bench_prelaunch(rt, facts["TL_CTRD_SOCK"], prep)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7, help="runs of each kind (median; >= 5)")
    p.add_argument("--socket", help="an existing containerd's CRI socket (default: start one)")
    p.add_argument("--cgroup", default="/tidelease-bench", help="with --socket: cgroup parent")
    p.add_argument("--no-prelaunch", action="store_true", help="skip the prelaunch part")
    p.add_argument("--ckpt-mib", type=int, default=256, help="prelaunch: the checkpoint's size")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, to check it still runs")
    args = p.parse_args(argv)
    if args.smoke:  # the smoke sizes, unless given
        p.set_defaults(runs=2, ckpt_mib=32)
        args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-hot-restart-") as tmp:
        work = Path(tmp)
        if args.socket:
            facts = {"TL_CTRD_SOCK": args.socket, "TL_CTRD_CGROUP": args.cgroup}
            asyncio.run(main_async(args, facts, work))
        else:
            with containerd(work) as facts:
                asyncio.run(main_async(args, facts, work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
