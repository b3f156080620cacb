"""Certificates that end within a test, renewed while a client keeps connecting.

The rotation (extender/certrotation) runs over Secrets (the fake ones, or the API server's);
each Secret is written into a directory the way the kubelet writes a Secret volume (files
behind a ``..data`` link swapped atomically); the extender's TLS listener follows its files
(common/httpserving.TLSContext.follow); and a client, as kube-scheduler does, opens a new TLS
connection for every call, its client certificate files read again each time and its CA file
read once. ``swap`` runs them until the test has outlived the first certificates (and seen two
renewals of the serving one); the tests (tests/integration/test_certificate_swap.py,
tests/apiserver/test_certificate_swap.py) assert that not one call failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import shutil
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from common import certificates
from common.certificates import Facts
from common.httpserving import Limits, ListenerStats, ServerTLS, TLSContext, listen
from extender.certrotation.controller import Rotation, RotationMetrics, Secrets
from extender.certrotation.policy import (
    CA_SECRET,
    CLIENT_CN,
    CLIENT_SECRET,
    SERVING_SECRET,
    RotationSettings,
)

SVC = "tidelease-extender.tidelease-system.svc"
SECOND = datetime.timedelta(seconds=1)


class SecretVolume:
    """A Secret mounted as the kubelet mounts it: the data in a fresh timestamped directory,
    ``..data`` pointed at it by an atomic rename, each key a link through ``..data``."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True)
        self.root = root
        self._n = 0

    def write(self, data: dict[str, bytes]) -> None:
        self._n += 1
        fresh = self.root / f"..2026_{self._n:04d}"
        fresh.mkdir()
        for key, value in data.items():
            (fresh / key).write_bytes(value)
        link = self.root / "..data"
        old = link.resolve() if link.is_symlink() else None
        (self.root / "..data_tmp").symlink_to(fresh.name)
        os.replace(self.root / "..data_tmp", link)
        for key in data:
            if not (self.root / key).is_symlink():
                (self.root / key).symlink_to(f"..data/{key}")
        if old is not None:
            shutil.rmtree(old)

    def path(self, key: str) -> Path:
        return self.root / key


async def sync(secrets: Secrets, name: str, volume: SecretVolume) -> None:
    """The kubelet's sync of one Secret volume (and the admin's copy to a control-plane host,
    for the client certificate): the Secret's data written again whenever it changed."""
    written = None
    while True:
        held = await secrets.get(name)
        if held is not None and held[1] != written:
            volume.write(held[0])
            written = held[1]
        await asyncio.sleep(0.05)


@dataclass
class SchedulerClient:
    """kube-scheduler's side of the extender's HTTPS: its CA file read once at start, its
    client certificate files read again for every new connection (client-go keeps the pair
    it had when a read finds the two files mid-swap)."""

    cert: Path
    key: Path
    ca_pem: bytes
    _context: ssl.SSLContext | None = None
    served: dict[int, datetime.datetime] = field(default_factory=dict)  # serial -> notAfter
    calls: int = 0
    failures: list[str] = field(default_factory=list)

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        try:
            context.load_cert_chain(str(self.cert), str(self.key))
        except (ssl.SSLError, OSError):
            assert self._context is not None, "the first read must succeed"
            return self._context
        self._context = context
        return context

    async def call(self, port: int) -> None:
        self.calls += 1
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=self.context(), server_hostname=SVC
            )
        except (ssl.SSLError, OSError) as e:
            self.failures.append(f"connect: {e!r}")
            return
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            served = certificates.facts(ssl.DER_cert_to_PEM_cert(der).encode())
            if not answer.startswith(b"HTTP/1.1 200") or not answer.endswith(b"ok"):
                self.failures.append(f"answer: {answer[:80]!r}")
            elif served.not_after <= datetime.datetime.now(datetime.UTC):
                self.failures.append(f"served an ended certificate {served.serial}")
            else:
                self.served[served.serial] = served.not_after
        except (ssl.SSLError, OSError, TimeoutError) as e:
            self.failures.append(f"request: {e!r}")
        finally:
            writer.close()
            with contextlib.suppress(ssl.SSLError, OSError):
                await writer.wait_closed()


@dataclass(frozen=True, slots=True)
class Swap:
    """What happened: the client's calls, the listener's counts, the certificates before and
    after."""

    client: SchedulerClient
    stats: ListenerStats
    tls: TLSContext
    ca_before: bytes
    ca_after: bytes
    first_serving: Facts
    first_client: Facts
    last_client: Facts


async def _data(secrets: Secrets, name: str) -> dict[str, bytes]:
    held = await secrets.get(name)
    assert held is not None, f"no Secret {name}"
    return held[0]


async def swap(
    secrets: Secrets,
    tmp_path: Path,
    *,
    namespace: str = "tidelease-system",
    serving_life: datetime.timedelta = 8 * SECOND,
    client_life: datetime.timedelta = 12 * SECOND,
    timeout_s: float = 60.0,
) -> Swap:
    settings = RotationSettings(
        namespace=namespace,
        dns_names=(SVC,),
        ca_life=datetime.timedelta(days=1),
        serving_life=serving_life,
        client_life=client_life,
        interval_s=0.2,
    )
    rotation = Rotation(secrets, settings, RotationMetrics.create(CollectorRegistry()))
    await rotation.step()  # the install: the CA and both leaves
    ca_pem = (await _data(secrets, CA_SECRET))["tls.crt"]
    first_serving = certificates.facts((await _data(secrets, SERVING_SECRET))["tls.crt"])
    first_client = certificates.facts((await _data(secrets, CLIENT_SECRET))["tls.crt"])

    extender_volume = SecretVolume(tmp_path / "extender-tls")
    host_copy = SecretVolume(tmp_path / "control-plane-host")
    extender_volume.write(await _data(secrets, SERVING_SECRET))
    host_copy.write(await _data(secrets, CLIENT_SECRET))

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    files = ServerTLS(
        extender_volume.path("tls.crt"),
        extender_volume.path("tls.key"),
        extender_volume.path("ca.crt"),
        (CLIENT_CN,),
    )
    tls = TLSContext(files)
    client = SchedulerClient(host_copy.path("tls.crt"), host_copy.path("tls.key"), ca_pem)
    tasks = [
        asyncio.create_task(rotation.run()),
        asyncio.create_task(sync(secrets, SERVING_SECRET, extender_volume)),
        asyncio.create_task(sync(secrets, CLIENT_SECRET, host_copy)),
        asyncio.create_task(tls.follow(interval_s=0.1)),
    ]
    try:
        site = await listen(runner, "127.0.0.1", 0, limits=Limits(), tls=tls)
        port = runner.addresses[0][1]
        until = max(first_serving.not_after, first_client.not_after) + 2 * SECOND
        deadline = time.monotonic() + timeout_s
        while datetime.datetime.now(datetime.UTC) < until or len(client.served) < 3:
            assert time.monotonic() < deadline, f"served {len(client.served)} certificates"
            await client.call(port)
            if len(client.failures) >= 10:
                break  # the test reports them
            await asyncio.sleep(0.02)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.cleanup()
    return Swap(
        client=client,
        stats=site.stats,
        tls=tls,
        ca_before=ca_pem,
        ca_after=(await _data(secrets, CA_SECRET))["tls.crt"],
        first_serving=first_serving,
        first_client=first_client,
        last_client=certificates.facts((await _data(secrets, CLIENT_SECRET))["tls.crt"]),
    )


def assert_renewed_without_a_failed_call(result: Swap) -> None:
    client = result.client
    assert client.failures == [], f"{len(client.failures)} of {client.calls} calls failed"
    assert client.calls > 100
    assert result.first_serving.serial in client.served
    # The first serving certificate and at least two renewals, each served before its end (the
    # client refused none), for longer than the first one lasted.
    assert len(client.served) >= 3
    assert result.stats.unadmitted == 0
    assert result.tls.reloads >= 2
    # The client certificate was renewed too, and the extender admitted the new one.
    assert result.last_client.serial != result.first_client.serial
    assert result.tls.client_not_after is not None
    assert result.tls.client_not_after > result.first_client.not_after.timestamp()
    # The CA never changed: the client's CA, read once at start, verified every renewal.
    assert result.ca_after == result.ca_before
