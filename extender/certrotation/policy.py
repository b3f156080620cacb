"""What the certificate rotation does with each of its Secrets: pure decisions with reasons.

Three Secrets in the release namespace (templates/extender-tls.yaml), made in the cluster so that
``helm template`` renders the same output every time:

- the CA (``tidelease-extender-ca``): made when absent, then kept. kube-scheduler reads its
  ``caFile`` once at start and its copy sits on the control-plane hosts, so a new CA would need
  both refreshed by hand: it is never replaced here, and lives long (ten years by default);
  its end is alerted on (TideleaseCertificateExpiring) long before.
- the serving certificate (``tidelease-extender-tls``): renewed once ``renew_fraction`` (2/3)
  of its life has passed; the extender reads the Secret volume's new files without a restart
  (common/httpserving.TLSContext.follow), so the swap drops no connection.
- kube-scheduler's client certificate (``tidelease-scheduler-client``): renewed the same way in
  the Secret; kube-scheduler reloads its client certificate files at each new connection
  (client-go's cachingCertificateLoader), but those files are copies an admin makes on the
  hosts (docs/install.md), so it lives longer (a year) and the extender reports the end of the
  one kube-scheduler actually presents (tidelease_extender_tls_not_after_timestamp_seconds
  {certificate="client"}), alerted on 30 days before.

A leaf is (re)issued when absent, unreadable, its key does not match, not signed by the CA held
now, naming other DNS names than wanted, or due.
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass

from common.certificates import Facts, Usage

CA_SECRET = "tidelease-extender-ca"
SERVING_SECRET = "tidelease-extender-tls"
CLIENT_SECRET = "tidelease-scheduler-client"
CA_CN = "tidelease-extender-ca"
SERVING_CN = "tidelease-extender"
CLIENT_CN = "tidelease-scheduler-client"


@dataclass(frozen=True, slots=True)
class LeafSpec:
    secret: str
    cn: str
    usage: Usage
    life: datetime.timedelta
    dns_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RotationSettings:
    namespace: str
    dns_names: tuple[str, ...]
    ca_life: datetime.timedelta = datetime.timedelta(days=3650)
    serving_life: datetime.timedelta = datetime.timedelta(days=90)
    client_life: datetime.timedelta = datetime.timedelta(days=365)
    renew_fraction: float = 2 / 3
    interval_s: float = 300.0

    def leaves(self) -> tuple[LeafSpec, ...]:
        return (
            LeafSpec(SERVING_SECRET, SERVING_CN, Usage.SERVER, self.serving_life, self.dns_names),
            LeafSpec(CLIENT_SECRET, CLIENT_CN, Usage.CLIENT, self.client_life),
        )

    def validate(self) -> list[str]:
        problems = []
        if not self.namespace:
            problems.append("namespace must be given")
        if not self.dns_names:
            problems.append("dns_names must name the extender's Service")
        for name in ("ca_life", "serving_life", "client_life"):
            if getattr(self, name) <= datetime.timedelta(0):
                problems.append(f"{name} must be positive")
        if not 0 < self.renew_fraction < 1:
            problems.append("renew_fraction must be between 0 and 1")
        if self.interval_s <= 0:
            problems.append("interval_s must be positive")
        return problems


class Action(enum.Enum):
    KEEP = "keep"
    ISSUE = "issue"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str


@dataclass(frozen=True, slots=True)
class HeldLeaf:
    """What a leaf Secret holds, as read: its certificate's facts (None: unreadable), whether
    its key matches, whether the CA held now signed it."""

    facts: Facts | None
    key_matches: bool
    signed_by_ca: bool


def renew_at(facts: Facts, fraction: float) -> datetime.datetime:
    """When a certificate is due: once ``fraction`` of its life has passed."""
    return facts.not_before + (facts.not_after - facts.not_before) * fraction


def decide_ca(held: Facts | None, *, readable: bool) -> Decision:
    """Make the CA when there is none; never replace one (module docstring)."""
    if held is None and not readable:
        return Decision(Action.KEEP, "unreadable: left for an admin (not replaced)")
    if held is None:
        return Decision(Action.ISSUE, "absent")
    return Decision(Action.KEEP, "present")


def decide_leaf(
    held: HeldLeaf | None, spec: LeafSpec, *, now: datetime.datetime, fraction: float
) -> Decision:
    if held is None:
        return Decision(Action.ISSUE, "absent")
    facts = held.facts
    if facts is None:
        return Decision(Action.ISSUE, "unreadable")
    if not held.key_matches:
        return Decision(Action.ISSUE, "key does not match the certificate")
    if not held.signed_by_ca:
        return Decision(Action.ISSUE, "not signed by the CA")
    if facts.subject_cn != spec.cn:
        return Decision(Action.ISSUE, f"names CN={facts.subject_cn}, not {spec.cn}")
    if sorted(facts.dns_names) != sorted(spec.dns_names):
        return Decision(Action.ISSUE, "DNS names changed")
    if now >= facts.not_after:
        return Decision(Action.ISSUE, "expired")
    if now >= renew_at(facts, fraction):
        return Decision(Action.ISSUE, "due")
    return Decision(Action.KEEP, "valid")
