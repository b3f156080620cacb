"""Whom the extender's HTTPS admits (common/httpserving.py, TLSContext.admit), in real TLS
handshakes on loopback: the scheduler's client certificate only; not the serving certificate
used as a client, not another name the same CA signed, not a certificate good for both."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from common import certificates
from common.certificates import Issued, Usage
from common.httpserving import GuardedSite, Limits, ServerTLS, TLSContext, listen

NAME = "tidelease-scheduler-client"
SVC = "tidelease-extender.tidelease-system.svc"
DAY = datetime.timedelta(days=1)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write(issued: Issued, into: Path, name: str) -> tuple[Path, Path]:
    into.mkdir(parents=True, exist_ok=True)
    cert, key = into / f"{name}.crt", into / f"{name}.key"
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)
    return cert, key


@dataclass(frozen=True, slots=True)
class Server:
    port: int
    ca: Path
    site: GuardedSite
    tls: TLSContext


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, ca: Issued) -> AsyncIterator[Server]:
    serving_cert = certificates.issue_leaf(
        ca, "tidelease-extender", usage=Usage.SERVER, now=now(), life=DAY, dns_names=(SVC,)
    )
    cert, key = write(serving_cert, tmp_path / "server", "tls")
    ca_file = tmp_path / "server" / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    tls = TLSContext(ServerTLS(cert, key, ca_file, (NAME,)))
    try:
        site = await listen(runner, "127.0.0.1", 0, limits=Limits(), tls=tls)
        yield Server(runner.addresses[0][1], ca_file, site, tls)
    finally:
        await runner.cleanup()


async def get(server: Server, cert: Path, key: Path) -> bytes:
    """GET / over TLS with this client certificate; what came back (b"" when closed)."""
    context = ssl.create_default_context(cafile=str(server.ca))
    context.load_cert_chain(str(cert), str(key))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=context, server_hostname=SVC
    )
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return await asyncio.wait_for(reader.read(), 5)
    except (ssl.SSLError, ConnectionError):
        return b""
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


def client_pair(ca: Issued, tmp_path: Path, cn: str, usage: Usage) -> tuple[Path, Path]:
    issued = certificates.issue_leaf(ca, cn, usage=usage, now=now(), life=DAY)
    return write(issued, tmp_path / "clients", f"{cn}-{usage.value}")


async def test_the_schedulers_client_certificate_is_admitted(tmp_path: Path) -> None:
    ca = certificates.issue_ca("tidelease-extender-ca", now=now(), life=10 * DAY)
    async with serving(tmp_path, ca) as server:
        answer = await get(server, *client_pair(ca, tmp_path, NAME, Usage.CLIENT))
        assert answer.startswith(b"HTTP/1.1 200")
        assert answer.endswith(b"ok")
        assert server.site.stats.unadmitted == 0
        assert server.tls.client_not_after is not None


@pytest.mark.parametrize(
    ("cn", "usage"),
    [
        pytest.param("tidelease-extender", Usage.SERVER, id="the-serving-certificate-as-client"),
        pytest.param(NAME, Usage.SERVER, id="the-right-name-for-serving-only"),
        pytest.param("tidelease-agent", Usage.CLIENT, id="another-name-the-ca-signed"),
    ],
)
async def test_other_certificates_of_the_same_ca_are_closed_before_http(
    tmp_path: Path, cn: str, usage: Usage
) -> None:
    ca = certificates.issue_ca("tidelease-extender-ca", now=now(), life=10 * DAY)
    async with serving(tmp_path, ca) as server:
        assert await get(server, *client_pair(ca, tmp_path, cn, usage)) == b""
        # The right one still gets in after.
        assert (await get(server, *client_pair(ca, tmp_path, NAME, Usage.CLIENT))).endswith(b"ok")


async def test_the_serving_certificate_itself_is_no_client(tmp_path: Path) -> None:
    ca = certificates.issue_ca("tidelease-extender-ca", now=now(), life=10 * DAY)
    async with serving(tmp_path, ca) as server:
        cert, key = server.tls.tls.cert_file, server.tls.tls.key_file
        assert await get(server, cert, key) == b""


@pytest.mark.parametrize(
    ("usages", "refused"),
    [
        pytest.param(("client",), None, id="client-only"),
        pytest.param(("server",), "no clientAuth", id="server-only"),
        pytest.param(("client", "server"), "serverAuth", id="both"),
        pytest.param((), "no extended key usage", id="none"),
    ],
)
def test_client_refusal_reads_the_usages(usages: tuple[str, ...], refused: str | None) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now() - DAY)
        .not_valid_after(now() + DAY)
    )
    oids = {"client": ExtendedKeyUsageOID.CLIENT_AUTH, "server": ExtendedKeyUsageOID.SERVER_AUTH}
    if usages:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([oids[u] for u in usages]), critical=False
        )
    from cryptography.hazmat.primitives.serialization import Encoding

    der = builder.sign(key, hashes.SHA256()).public_bytes(Encoding.DER)
    refusal = certificates.client_refusal(der, (NAME,))
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None
        assert refused in refusal
