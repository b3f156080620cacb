"""Certificates for tests, made with the openssl command: a CA, and server or client certificates
it signs. EC P-256 keys, so that making them takes milliseconds."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass(frozen=True, slots=True)
class Pair:
    cert: Path
    key: Path


def make_ca(directory: Path, name: str) -> Pair:
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl(
        *("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
        *("-keyout", str(pair.key), "-out", str(pair.cert), "-days", "2", "-subj", f"/CN={name}"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        cwd=directory,
    )
    return pair


def issue(
    ca: Pair,
    directory: Path,
    name: str,
    *,
    client: bool = False,
    sans: tuple[str, ...] = ("IP:127.0.0.1", "DNS:localhost"),
) -> Pair:
    """A certificate for ``name`` signed by ``ca``: a client one (clientAuth), or a server one
    for ``sans``."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    usage = "clientAuth" if client else "serverAuth"
    lines = ["basicConstraints=critical,CA:FALSE", f"extendedKeyUsage={usage}"]
    if not client:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        *("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
        *("-keyout", str(pair.key), "-out", str(csr), "-subj", f"/CN={name}"),
        cwd=directory,
    )
    _openssl(
        *("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key)),
        *("-CAcreateserial", "-out", str(pair.cert), "-days", "2", "-extfile", str(ext)),
        cwd=directory,
    )
    return pair
