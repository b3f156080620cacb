"""X.509 for tidelease's own TLS: the CA and the leaf certificates made in the cluster
(extender/certrotation), and the client identity the extender admits (common/httpserving).

Keys are ECDSA P-256. A serving certificate carries serverAuth only and a client certificate
clientAuth only, so that neither can stand in for the other; the CA signs certificates and
nothing else (pathLen 0).
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.errors import InvalidInput

# Issued certificates start this long before "now", so that a node whose clock lags a little
# does not refuse a certificate just made; a tenth of the life at most, so that the backdate
# does not make a short-lived certificate due for renewal (2/3 of notBefore..notAfter) as
# soon as it is made.
BACKDATE = datetime.timedelta(minutes=5)


def backdate(life: datetime.timedelta) -> datetime.timedelta:
    return min(BACKDATE, life / 10)


class Usage(enum.Enum):
    SERVER = "server"
    CLIENT = "client"


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its key, PEM."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rotation and the metrics need to know of one certificate."""

    subject_cn: str
    issuer_cn: str
    dns_names: tuple[str, ...]
    not_before: datetime.datetime
    not_after: datetime.datetime
    serial: int


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def issue_ca(cn: str, *, now: datetime.datetime, life: datetime.timedelta) -> Issued:
    """A self-signed CA that signs leaf certificates only."""
    key = ec.generate_private_key(ec.SECP256R1())
    pub = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(pub)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate(life))
        .not_valid_after(now + life)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_leaf(
    ca: Issued,
    cn: str,
    *,
    usage: Usage,
    now: datetime.datetime,
    life: datetime.timedelta,
    dns_names: tuple[str, ...] = (),
) -> Issued:
    """A certificate signed by ``ca``, for a server (serverAuth, its DNS names) or a client
    (clientAuth); never both. Its life ends no later than the CA's."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise InvalidInput("the CA key is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    pub = key.public_key()
    eku = (
        ExtendedKeyUsageOID.SERVER_AUTH
        if usage is Usage.SERVER
        else ExtendedKeyUsageOID.CLIENT_AUTH
    )
    not_after = min(now + life, ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(pub)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate(life))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _cn(name: x509.Name) -> str:
    attrs = name.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


def _facts(cert: x509.Certificate) -> Facts:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns = ()
    return Facts(
        subject_cn=_cn(cert.subject),
        issuer_cn=_cn(cert.issuer),
        dns_names=dns,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        serial=cert.serial_number,
    )


def facts(pem: bytes) -> Facts:
    """The first certificate of ``pem``; InvalidInput if there is none."""
    try:
        return _facts(x509.load_pem_x509_certificate(pem))
    except ValueError as e:
        raise InvalidInput(f"not a PEM certificate: {e}") from e


def all_facts(pem: bytes) -> tuple[Facts, ...]:
    """Every certificate of a bundle (a CA file may hold more than one)."""
    try:
        return tuple(_facts(c) for c in x509.load_pem_x509_certificates(pem))
    except ValueError as e:
        raise InvalidInput(f"not a PEM bundle: {e}") from e


def signed_by(leaf_pem: bytes, ca_pem: bytes) -> bool:
    """Whether ``ca_pem``'s key signed ``leaf_pem``."""
    try:
        leaf = x509.load_pem_x509_certificate(leaf_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether ``key_pem`` is the private key of ``cert_pem``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    return cert.public_key() == key.public_key()


def client_refusal(der: bytes, names: tuple[str, ...]) -> str | None:
    """Why a client certificate (DER, already verified against the client CA) is not one the
    server admits, or None: it must be for client authentication only (clientAuth, and not
    serverAuth: a serving certificate is no client certificate) and, when ``names`` are given,
    name one of them as its subject's common name."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return "unreadable certificate"
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return "no extended key usage (clientAuth required)"
    if ExtendedKeyUsageOID.CLIENT_AUTH not in eku:
        return "not a client certificate (no clientAuth usage)"
    if ExtendedKeyUsageOID.SERVER_AUTH in eku:
        return "a serving certificate (serverAuth usage) is not admitted as a client"
    cn = _cn(cert.subject)
    if names and cn not in names:
        return f"subject CN={cn!r} is not one of {', '.join(names)}"
    return None


def der_not_after(der: bytes) -> float:
    """When a DER certificate ends, Unix seconds."""
    return x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp()
