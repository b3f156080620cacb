"""The installed command: offline mode serves a snapshot; SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from extender.demo import demo_objects
from tests.ports import free_port


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("extender did not become ready")


def test_extender_snapshot_mode(tmp_path: Path) -> None:
    snap = tmp_path / "cluster.yaml"
    snap.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": demo_objects()}))
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "common.cli",
            "extender",
            "--snapshot",
            str(snap),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        pod = {
            "metadata": {"name": "p", "namespace": "d", "uid": "u"},
            "spec": {
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]
            },
        }
        req = urllib.request.Request(
            f"{url}/filter",
            data=json.dumps({"Pod": pod, "NodeNames": ["gpu-node-1", "gpu-node-3"]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            reply = json.loads(r.read())
        assert reply["NodeNames"] == ["gpu-node-1"]
        assert "unhealthy" in reply["FailedAndUnresolvableNodes"]["gpu-node-3"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def test_bad_snapshot_is_a_clear_error(tmp_path: Path) -> None:
    snap = tmp_path / "bad.yaml"
    snap.write_text(
        "kind: List\nitems:\n- kind: GpuNode\n  metadata: {name: n}\n  status:\n"
        "    devices: [{index: 0, uuid: u, type: H20, tier: SUPER}]\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "common.cli", "extender", "--snapshot", str(snap)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert "status.devices[0].tier must be one of LA, MA, HA" in res.stderr


def test_startup_errors_exit_2_with_one_line_each(tmp_path: Path) -> None:
    """A port in use, a host that does not resolve, a kubeconfig that is not one: exit 2 and
    one clear line on stderr, no traceback."""
    snap = tmp_path / "demo.yaml"
    snap.write_text(yaml.safe_dump({"kind": "List", "items": demo_objects()}))
    bad_kubeconfig = tmp_path / "kubeconfig"
    bad_kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [oops\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cases = {
            "port in use": (
                ["--snapshot", str(snap), "--host", "127.0.0.1", "--port", str(port)],
                f"cannot listen on 127.0.0.1:{port}",
            ),
            "bad host": (
                ["--snapshot", str(snap), "--host", "no-such-host.invalid", "--port", "0"],
                "cannot listen on no-such-host.invalid:0",
            ),
            "bad kubeconfig": (
                ["--kubeconfig", str(bad_kubeconfig), "--port", "0"],
                f"kubeconfig {bad_kubeconfig}",
            ),
        }
        for what, (args, message) in cases.items():
            res = subprocess.run(
                [sys.executable, "-m", "common.cli", "extender", *args],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode == 2, (what, res.stderr)
            assert "Traceback" not in res.stderr, (what, res.stderr)
            lines = [ln for ln in res.stderr.splitlines() if ln.startswith("tidelease: ")]
            assert len(lines) == 1, (what, res.stderr)
            assert message in lines[0], (what, lines[0])


def test_bad_agent_and_orchestrator_flags_exit_2_with_every_problem_at_once() -> None:
    """The real command, as the DaemonSet and the Deployment run it: non-finite times, numbers
    that are not whole, ports out of range; every one named on its own line, no traceback."""
    cases = {
        "agent": (
            ["--node", "n", "--cycle", "nan", "--quiet-period", "inf", "--fake-gpus", "2.5",
             "--hot-restart-timeout=-1", "--cache-dir", "/nonexistent/cache",
             "--cache-port", "70000", "--cache-partial-ttl", "inf",
             "--device-plugin-dir", "relative"],
            ["--fake-gpus: want a whole number, got '2.5'",
             "--quiet-period: want a finite number, got 'inf'",
             "--cycle: want a finite number, got 'nan'",
             "--hot-restart-timeout: want a positive number of seconds, got '-1'",
             "--cache-port: want a port in 0..65535, got 70000",
             "--cache-partial-ttl: want a finite number, got inf",
             "device plugin: plugin_dir relative is not an absolute path"],
        ),
        "orchestrator": (
            ["--max-parallel", "2.5", "--metrics-port", "65536", "--dry-run"],
            ["--max-parallel: want a whole number, got '2.5'",
             "--metrics-port: want a port in 0..65535, got '65536'"],
        ),
    }  # fmt: skip
    for command, (args, problems) in cases.items():
        res = subprocess.run(
            [sys.executable, "-m", "common.cli", command, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONWARNINGS": "error"},
        )
        assert res.returncode == 2, (command, res.stderr)
        assert "Traceback" not in res.stderr, (command, res.stderr)
        assert res.stderr.splitlines() == [f"tidelease: {p}" for p in problems], command
