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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
