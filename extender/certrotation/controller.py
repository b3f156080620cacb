"""The certificate rotation (policy.py): one leader-elected loop in ``tidelease controllers``
that reads the three Secrets, applies the decisions and exports when each certificate ends.

A Secret is created when absent (a create that loses a race is read again on the next step) and
replaced with its resourceVersion (a conflict, too). The CA's key is read here only: the
extender's pods mount the serving Secret, whose ``ca.crt`` is the CA's certificate alone.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge

from common import certificates
from common.certificates import Issued
from common.errors import InvalidInput, NotFound, TideleaseError
from extender.certrotation.policy import (
    CA_CN,
    CA_SECRET,
    Action,
    HeldLeaf,
    LeafSpec,
    RotationSettings,
    decide_ca,
    decide_leaf,
)

log = logging.getLogger(__name__)

LEASE_NAME = "tidelease-certificates"
NOT_AFTER = "tidelease.io/not-after"
Clock = Callable[[], datetime.datetime]


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Secrets(Protocol):
    """The Secrets of one namespace: data as bytes, None when absent."""

    async def get(self, name: str) -> tuple[dict[str, bytes], str] | None:
        """The Secret's data and resourceVersion."""
        ...

    async def put(self, name: str, data: dict[str, bytes], *, resource_version: str | None) -> None:
        """Create (``resource_version`` None) or replace. Raises Conflict when it lost a race."""
        ...


class KubeSecrets:
    def __init__(self, kube: Any, namespace: str, labels: dict[str, str] | None = None) -> None:
        self._kube = kube
        self._namespace = namespace
        self._labels = labels or {"app.kubernetes.io/name": "tidelease"}

    def _path(self, name: str = "") -> str:
        base = f"/api/v1/namespaces/{self._namespace}/secrets"
        return f"{base}/{name}" if name else base

    async def get(self, name: str) -> tuple[dict[str, bytes], str] | None:
        try:
            obj = await self._kube.json("GET", self._path(name))
        except NotFound:
            return None
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        return data, str(obj["metadata"].get("resourceVersion", ""))

    async def put(self, name: str, data: dict[str, bytes], *, resource_version: str | None) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": self._namespace, "labels": self._labels}
        cert = data.get("tls.crt")
        if cert:
            meta["annotations"] = {NOT_AFTER: certificates.facts(cert).not_after.isoformat()}
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        if resource_version is None:
            await self._kube.json("POST", self._path(), body=body)  # 409: Conflict
        else:
            meta["resourceVersion"] = resource_version
            await self._kube.json("PUT", self._path(name), body=body)


@dataclass(frozen=True, slots=True)
class RotationMetrics:
    not_after: Gauge
    renewals: Counter
    failures: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> RotationMetrics:
        return cls(
            not_after=Gauge(
                "tidelease_certificate_not_after_timestamp_seconds",
                "When the certificate in each of tidelease's TLS Secrets ends (Unix seconds).",
                ["secret"],
                registry=registry,
            ),
            renewals=Counter(
                "tidelease_certificate_issued_total",
                "Certificates issued by the rotation, by Secret and reason.",
                ["secret", "reason"],
                registry=registry,
            ),
            failures=Counter(
                "tidelease_certificate_rotation_failures_total",
                "Rotation steps that failed (the API server, a race); tried again.",
                registry=registry,
            ),
        )


class Rotation:
    def __init__(
        self,
        secrets: Secrets,
        settings: RotationSettings,
        metrics: RotationMetrics,
        clock: Clock = utcnow,
    ) -> None:
        self._secrets = secrets
        self._settings = settings
        self._metrics = metrics
        self._clock = clock

    async def _ca(self) -> Issued | None:
        held = await self._secrets.get(CA_SECRET)
        facts = None
        readable = True
        if held is not None:
            data, _ = held
            cert, key = data.get("tls.crt", b""), data.get("tls.key", b"")
            try:
                facts = certificates.facts(cert)
            except InvalidInput:
                facts = None
            readable = facts is not None and certificates.key_matches(cert, key)
            if not readable:
                facts = None
        decision = decide_ca(facts, readable=readable)
        if decision.action is Action.ISSUE:
            issued = certificates.issue_ca(CA_CN, now=self._clock(), life=self._settings.ca_life)
            await self._secrets.put(
                CA_SECRET,
                {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem},
                resource_version=None,
            )
            self._metrics.renewals.labels(CA_SECRET, decision.reason).inc()
            log.info("made the CA %s (%s)", CA_SECRET, decision.reason)
            return issued
        if held is None or facts is None:
            log.error("CA Secret %s: %s", CA_SECRET, decision.reason)
            return None
        self._metrics.not_after.labels(CA_SECRET).set(facts.not_after.timestamp())
        return Issued(held[0]["tls.crt"], held[0]["tls.key"])

    async def _leaf(self, ca: Issued, spec: LeafSpec) -> None:
        held = await self._secrets.get(spec.secret)
        state = None
        version = None
        if held is not None:
            data, version = held
            cert, key = data.get("tls.crt", b""), data.get("tls.key", b"")
            try:
                facts: certificates.Facts | None = certificates.facts(cert)
            except InvalidInput:
                facts = None
            state = HeldLeaf(
                facts=facts,
                key_matches=facts is not None and certificates.key_matches(cert, key),
                signed_by_ca=facts is not None
                and certificates.signed_by(cert, ca.cert_pem)
                and data.get("ca.crt") == ca.cert_pem,
            )
        now = self._clock()
        decision = decide_leaf(state, spec, now=now, fraction=self._settings.renew_fraction)
        if decision.action is Action.KEEP:
            assert state is not None
            assert state.facts is not None
            self._metrics.not_after.labels(spec.secret).set(state.facts.not_after.timestamp())
            return
        issued = certificates.issue_leaf(
            ca, spec.cn, usage=spec.usage, now=now, life=spec.life, dns_names=spec.dns_names
        )
        data = {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem, "ca.crt": ca.cert_pem}
        await self._secrets.put(spec.secret, data, resource_version=version)
        ends = certificates.facts(issued.cert_pem).not_after
        self._metrics.renewals.labels(spec.secret, decision.reason).inc()
        self._metrics.not_after.labels(spec.secret).set(ends.timestamp())
        log.info("issued %s (%s), valid until %s", spec.secret, decision.reason, ends.isoformat())

    async def step(self) -> None:
        """One pass over the three Secrets."""
        ca = await self._ca()
        if ca is None:
            return
        for spec in self._settings.leaves():
            await self._leaf(ca, spec)

    async def run(self) -> None:
        """Step every interval_s (sooner after a failure) until cancelled."""
        while True:
            delay = self._settings.interval_s
            try:
                await self.step()
            except TideleaseError as e:
                self._metrics.failures.inc()
                log.warning("certificate rotation step failed (tried again): %s", e)
                delay = min(delay, 5.0)
            await asyncio.sleep(delay)


def load_rotation_settings(path: Path) -> RotationSettings:
    """The rotation's settings file (the chart's ConfigMap key certificates.yaml)."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise InvalidInput(f"certificates settings {path}: {e}") from e
    if not isinstance(raw, dict):
        raise InvalidInput(f"certificates settings {path}: not a mapping")
    days = datetime.timedelta(days=1)
    known = {
        "namespace",
        "dnsNames",
        "caValidityDays",
        "servingValidityDays",
        "clientValidityDays",
        "renewFraction",
        "intervalSeconds",
    }
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidInput(f"certificates settings {path}: unknown keys {', '.join(unknown)}")
    try:
        settings = RotationSettings(
            namespace=str(raw.get("namespace", "")),
            dns_names=tuple(str(n) for n in raw.get("dnsNames") or ()),
            ca_life=float(raw.get("caValidityDays", 3650)) * days,
            serving_life=float(raw.get("servingValidityDays", 90)) * days,
            client_life=float(raw.get("clientValidityDays", 365)) * days,
            renew_fraction=float(raw.get("renewFraction", 2 / 3)),
            interval_s=float(raw.get("intervalSeconds", 300)),
        )
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"certificates settings {path}: {e}") from e
    problems = settings.validate()
    if problems:
        raise InvalidInput(f"certificates settings {path}: {'; '.join(problems)}")
    return settings
