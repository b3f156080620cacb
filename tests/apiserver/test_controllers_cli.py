"""`tidelease controllers` as a process: the controllers leader-elected on their Leases, probes
and /metrics (for allowed tokens) on a port of their own, a clean stop on SIGTERM that leaves
the Leases to a successor; the extender process holds none of them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from common import builders
from common.errors import Conflict, NotFound
from common.kubeclient import KubeClient
from tests.apiserver.conftest import ApiServer
from tests.polling import eventually
from tests.ports import free_port

pytestmark = pytest.mark.apiserver

NS = "tidelease-system"
LEASES = ("tidelease-leasing-controller", "tidelease-prewarm-controller")


def get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()
    except OSError:
        return 0, ""


async def holders(kube: KubeClient) -> dict[str, str]:
    out = {}
    for name in LEASES:
        with contextlib.suppress(NotFound):
            lease = await kube.json(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}"
            )
            out[name] = (lease.get("spec") or {}).get("holderIdentity") or ""
    return out


async def start(
    apiserver: ApiServer, identity: str, port: int, log: Path | None = None
) -> asyncio.subprocess.Process:
    """``tidelease controllers`` as ``identity``; its log to ``log`` (else nowhere)."""
    err = log.open("wb") if log is not None else asyncio.subprocess.DEVNULL
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "common.cli", "controllers", "--kubeconfig",
            str(apiserver.kubeconfig), "--probe-host", "127.0.0.1", "--probe-port", str(port),
            "--leasing-controller", "--prewarm-controller",
            env={"POD_NAME": identity, "TIDELEASE_EXTENDER_METRICS_AUTH": "true", "PATH": ""},
            stderr=err,
        )  # fmt: skip
    finally:
        if log is not None:
            err.close()  # type: ignore[union-attr]


async def test_the_controllers_process_leads_serves_its_metrics_and_hands_over_on_sigterm(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    kube = await KubeClient.connect(apiserver.kubeconfig)
    with contextlib.suppress(Conflict):
        await kube.json("POST", "/api/v1/namespaces", body=builders.namespace(NS))
    first_port, second_port = free_port(), free_port()
    first = await start(apiserver, "controllers-a", first_port)
    second: asyncio.subprocess.Process | None = None
    try:

        async def led_by_first() -> dict[str, str] | None:
            held = await holders(kube)
            return held if set(held.values()) == {"controllers-a"} and len(held) == 2 else None

        await eventually(led_by_first, within_s=60)
        base = f"http://127.0.0.1:{first_port}"

        async def ready() -> bool:
            return await asyncio.to_thread(get, f"{base}/readyz") == (200, "ok")

        await eventually(ready, within_s=30)
        # /metrics: refused without a token, served to the admin's.
        status, _ = await asyncio.to_thread(get, f"{base}/metrics")
        assert status == 401
        status, text = await asyncio.to_thread(get, f"{base}/metrics", apiserver.token)
        assert status == 200
        assert "# HELP tidelease_leasing_reclaims_total " in text
        assert "# HELP tidelease_prewarm_directives_written_total " in text
        assert "tidelease_extender_requests_total" not in text  # the verbs are elsewhere

        # A second replica waits; the first stops on SIGTERM and the second takes both Leases.
        log = tmp_path / "controllers-b.log"
        second = await start(apiserver, "controllers-b", second_port, log)

        async def waits_for_both() -> bool:  # it found each Lease held, and said so
            text = log.read_text() if log.exists() else ""
            return all(
                f"controllers-b waits for {name}, held by controllers-a" in text for name in LEASES
            )

        await eventually(waits_for_both, within_s=60)
        assert set((await holders(kube)).values()) == {"controllers-a"}
        first.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        assert await asyncio.wait_for(first.wait(), 15) == 0
        assert time.monotonic() - stopped_at < 15  # the pod's grace period

        async def led_by_second() -> dict[str, str] | None:
            held = await holders(kube)
            return held if set(held.values()) == {"controllers-b"} else None

        await eventually(led_by_second, within_s=30)
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
        await kube.close()


async def test_with_no_controller_switched_on_it_says_so_and_exits_2(
    apiserver: ApiServer,
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "common.cli", "controllers", "--kubeconfig",
        str(apiserver.kubeconfig), stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    text = err.decode()
    assert "no controller enabled" in text
    assert "Traceback" not in text
