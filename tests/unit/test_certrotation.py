"""The certificate rotation's decisions (extender/certrotation/policy.py) as a table, then the
controller over the fake Secrets (extender/certrotation/testing.py) with an injected clock:
what it writes, what it keeps, and that it never replaces the CA."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from prometheus_client import CollectorRegistry

from common import certificates
from common.certificates import Facts, Usage
from common.errors import Conflict
from extender.certrotation.controller import Rotation, RotationMetrics
from extender.certrotation.policy import (
    CA_SECRET,
    CLIENT_CN,
    CLIENT_SECRET,
    SERVING_CN,
    SERVING_SECRET,
    Action,
    HeldLeaf,
    LeafSpec,
    RotationSettings,
    decide_ca,
    decide_leaf,
)
from extender.certrotation.testing import FakeSecrets

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
SVC = ("tidelease-extender.tidelease-system.svc",)
SERVING = LeafSpec(SERVING_SECRET, SERVING_CN, Usage.SERVER, 90 * DAY, SVC)


def facts(
    *, cn: str = SERVING_CN, dns: tuple[str, ...] = SVC, start: datetime.datetime = T0
) -> Facts:
    return Facts(cn, "tidelease-extender-ca", dns, start, start + 90 * DAY, serial=1)


def held(**changes: object) -> HeldLeaf:
    return dataclasses.replace(HeldLeaf(facts(), key_matches=True, signed_by_ca=True), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "now", "action", "reason"),
    [
        pytest.param(None, T0, Action.ISSUE, "absent", id="absent"),
        pytest.param(held(facts=None), T0, Action.ISSUE, "unreadable", id="unreadable"),
        pytest.param(held(key_matches=False), T0, Action.ISSUE, "key", id="mismatched-key"),
        pytest.param(held(signed_by_ca=False), T0, Action.ISSUE, "CA", id="another-ca"),
        pytest.param(
            held(facts=facts(cn="tidelease-agent")), T0, Action.ISSUE, "CN=", id="another-cn"
        ),
        pytest.param(
            held(facts=facts(dns=("other.svc",))), T0, Action.ISSUE, "DNS", id="other-dns-names"
        ),
        pytest.param(held(facts=facts(dns=())), T0, Action.ISSUE, "DNS", id="no-dns-names"),
        pytest.param(held(), T0 + 59 * DAY, Action.KEEP, "valid", id="before-two-thirds"),
        pytest.param(held(), T0 + 60 * DAY, Action.ISSUE, "due", id="at-two-thirds"),
        pytest.param(held(), T0 + 89 * DAY, Action.ISSUE, "due", id="past-two-thirds"),
        pytest.param(held(), T0 + 91 * DAY, Action.ISSUE, "expired", id="expired"),
        pytest.param(held(), T0, Action.KEEP, "valid", id="fresh"),
    ],
)
def test_decide_leaf(
    state: HeldLeaf | None, now: datetime.datetime, action: Action, reason: str
) -> None:
    decision = decide_leaf(state, SERVING, now=now, fraction=2 / 3)
    assert decision.action is action
    assert reason in decision.reason


def test_dns_names_in_another_order_are_the_same() -> None:
    names = ("b.svc", "a.svc")
    spec = dataclasses.replace(SERVING, dns_names=names)
    state = held(facts=facts(dns=tuple(reversed(names))))
    assert decide_leaf(state, spec, now=T0, fraction=2 / 3).action is Action.KEEP


@pytest.mark.parametrize(
    ("present", "readable", "action"),
    [
        pytest.param(False, True, Action.ISSUE, id="absent-made"),
        pytest.param(True, True, Action.KEEP, id="present-kept"),
        pytest.param(False, False, Action.KEEP, id="unreadable-never-replaced"),
    ],
)
def test_decide_ca(present: bool, readable: bool, action: Action) -> None:
    ca = facts(cn="tidelease-extender-ca", dns=()) if present else None
    assert decide_ca(ca, readable=readable).action is action


def test_a_short_life_is_not_due_as_soon_as_made() -> None:
    """The backdate (clock skew) is a tenth of the life at most: a certificate of a minute is
    not past two thirds of notBefore..notAfter when made."""
    ca = certificates.issue_ca("ca", now=T0, life=DAY)
    leaf = certificates.issue_leaf(
        ca, SERVING_CN, usage=Usage.SERVER, now=T0, life=datetime.timedelta(minutes=1)
    )
    made = certificates.facts(leaf.cert_pem)
    assert made.not_before == T0 - datetime.timedelta(seconds=6)
    spec = dataclasses.replace(SERVING, life=datetime.timedelta(minutes=1), dns_names=())
    state = HeldLeaf(made, key_matches=True, signed_by_ca=True)
    assert decide_leaf(state, spec, now=T0, fraction=2 / 3).action is Action.KEEP
    later = decide_leaf(state, spec, now=T0 + datetime.timedelta(seconds=45), fraction=2 / 3)
    assert (later.action, later.reason) == (Action.ISSUE, "due")


# The controller over the fake Secrets.


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime.datetime:
        return self.now


def rotation(
    secrets: FakeSecrets, clock: Clock, **settings: object
) -> tuple[Rotation, CollectorRegistry]:
    registry = CollectorRegistry()
    chosen = RotationSettings(namespace="tidelease-system", dns_names=SVC)
    chosen = dataclasses.replace(chosen, **settings)  # type: ignore[arg-type]
    return Rotation(secrets, chosen, RotationMetrics.create(registry), clock), registry


def serial(secrets: FakeSecrets, name: str) -> int:
    return certificates.facts(secrets.data[name]["tls.crt"]).serial


async def test_an_empty_namespace_gets_the_ca_and_both_leaves() -> None:
    secrets, clock = FakeSecrets(), Clock()
    rot, registry = rotation(secrets, clock)
    await rot.step()
    assert set(secrets.data) == {CA_SECRET, SERVING_SECRET, CLIENT_SECRET}
    ca = secrets.data[CA_SECRET]["tls.crt"]
    for name, cn in ((SERVING_SECRET, SERVING_CN), (CLIENT_SECRET, CLIENT_CN)):
        data = secrets.data[name]
        assert data["ca.crt"] == ca
        assert certificates.signed_by(data["tls.crt"], ca)
        assert certificates.key_matches(data["tls.crt"], data["tls.key"])
        assert certificates.facts(data["tls.crt"]).subject_cn == cn
    assert certificates.facts(secrets.data[SERVING_SECRET]["tls.crt"]).dns_names == SVC
    # The serving Secret carries the CA's certificate, never its key.
    assert secrets.data[CA_SECRET]["tls.key"] not in secrets.data[SERVING_SECRET].values()
    ends = registry.get_sample_value(
        "tidelease_certificate_not_after_timestamp_seconds", {"secret": SERVING_SECRET}
    )
    assert ends == (T0 + 90 * DAY).timestamp()
    writes = secrets.writes
    await rot.step()
    assert secrets.writes == writes  # nothing due: nothing written


async def test_past_two_thirds_a_leaf_is_renewed_and_the_ca_kept() -> None:
    secrets, clock = FakeSecrets(), Clock()
    rot, registry = rotation(secrets, clock)
    await rot.step()
    ca, serving, client = (serial(secrets, n) for n in (CA_SECRET, SERVING_SECRET, CLIENT_SECRET))
    clock.now = T0 + 59 * DAY
    await rot.step()
    assert serial(secrets, SERVING_SECRET) == serving
    clock.now = T0 + 61 * DAY
    await rot.step()
    assert serial(secrets, SERVING_SECRET) != serving
    assert serial(secrets, CLIENT_SECRET) == client  # a year: not due
    assert serial(secrets, CA_SECRET) == ca
    issued = registry.get_sample_value(
        "tidelease_certificate_issued_total", {"secret": SERVING_SECRET, "reason": "due"}
    )
    assert issued == 1


def spoil_key(secrets: FakeSecrets) -> None:
    other = certificates.issue_ca("x", now=T0, life=DAY)
    secrets.data[SERVING_SECRET]["tls.key"] = other.key_pem


def spoil_cert(secrets: FakeSecrets) -> None:
    secrets.data[SERVING_SECRET]["tls.crt"] = b"-----BEGIN CERTIFICATE-----\nnope\n"


def another_ca(secrets: FakeSecrets) -> None:
    other = certificates.issue_ca("tidelease-extender-ca", now=T0, life=10 * DAY)
    leaf = certificates.issue_leaf(
        other, SERVING_CN, usage=Usage.SERVER, now=T0, life=90 * DAY, dns_names=SVC
    )
    secrets.data[SERVING_SECRET] = {
        "tls.crt": leaf.cert_pem,
        "tls.key": leaf.key_pem,
        "ca.crt": other.cert_pem,
    }


def stale_ca_file(secrets: FakeSecrets) -> None:
    other = certificates.issue_ca("tidelease-extender-ca", now=T0, life=10 * DAY)
    secrets.data[SERVING_SECRET]["ca.crt"] = other.cert_pem


def another_name(secrets: FakeSecrets) -> None:
    ca = certificates.Issued(secrets.data[CA_SECRET]["tls.crt"], secrets.data[CA_SECRET]["tls.key"])
    leaf = certificates.issue_leaf(
        ca, "tidelease-agent", usage=Usage.SERVER, now=T0, life=90 * DAY, dns_names=SVC
    )
    secrets.data[SERVING_SECRET].update({"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem})


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        pytest.param(spoil_key, "key does not match the certificate", id="mismatched-key"),
        pytest.param(spoil_cert, "unreadable", id="unreadable"),
        pytest.param(another_ca, "not signed by the CA", id="signed-by-another-ca"),
        pytest.param(stale_ca_file, "not signed by the CA", id="ca-crt-not-the-ca"),
        pytest.param(
            another_name, "names CN=tidelease-agent, not tidelease-extender", id="another-cn"
        ),
    ],
)
async def test_a_spoiled_serving_secret_is_reissued_by_the_ca_held(spoil, reason: str) -> None:  # type: ignore[no-untyped-def]
    secrets, clock = FakeSecrets(), Clock()
    rot, registry = rotation(secrets, clock)
    await rot.step()
    ca = secrets.data[CA_SECRET]["tls.crt"]
    spoil(secrets)
    await rot.step()
    data = secrets.data[SERVING_SECRET]
    assert data["ca.crt"] == ca
    assert certificates.signed_by(data["tls.crt"], ca)
    assert certificates.key_matches(data["tls.crt"], data["tls.key"])
    assert certificates.facts(data["tls.crt"]).subject_cn == SERVING_CN
    assert secrets.data[CA_SECRET]["tls.crt"] == ca
    issued = registry.get_sample_value(
        "tidelease_certificate_issued_total", {"secret": SERVING_SECRET, "reason": reason}
    )
    assert issued == 1


async def test_new_dns_names_reissue_the_serving_certificate_only() -> None:
    secrets, clock = FakeSecrets(), Clock()
    rot, _ = rotation(secrets, clock)
    await rot.step()
    client = serial(secrets, CLIENT_SECRET)
    names = (*SVC, "tidelease.example.com")
    rot, _ = rotation(secrets, clock, dns_names=names)
    await rot.step()
    assert certificates.facts(secrets.data[SERVING_SECRET]["tls.crt"]).dns_names == names
    assert serial(secrets, CLIENT_SECRET) == client


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param({"tls.crt": b"garbage", "tls.key": b"garbage"}, id="unreadable"),
        pytest.param("other-key", id="key-of-another-ca"),
    ],
)
async def test_the_ca_is_never_replaced(spoil: object) -> None:
    secrets, clock = FakeSecrets(), Clock()
    rot, _ = rotation(secrets, clock)
    await rot.step()
    if spoil == "other-key":
        other = certificates.issue_ca("x", now=T0, life=DAY)
        secrets.data[CA_SECRET]["tls.key"] = other.key_pem
    else:
        assert isinstance(spoil, dict)
        secrets.data[CA_SECRET] = dict(spoil)
    held = dict(secrets.data[CA_SECRET])
    leaves = {n: dict(secrets.data[n]) for n in (SERVING_SECRET, CLIENT_SECRET)}
    writes = secrets.writes
    clock.now = T0 + 80 * DAY  # the serving certificate is due, but nothing can sign it
    await rot.step()
    assert secrets.writes == writes
    assert secrets.data[CA_SECRET] == held
    assert {n: secrets.data[n] for n in leaves} == leaves


async def test_an_old_ca_is_kept_and_a_leaf_ends_with_it() -> None:
    secrets, clock = FakeSecrets(), Clock()
    rot, _ = rotation(secrets, clock, ca_life=100 * DAY)
    await rot.step()
    ca = serial(secrets, CA_SECRET)
    clock.now = T0 + 95 * DAY
    await rot.step()
    assert serial(secrets, CA_SECRET) == ca
    serving = certificates.facts(secrets.data[SERVING_SECRET]["tls.crt"])
    assert serving.not_after == T0 + 100 * DAY  # no later than the CA's end


async def test_a_lost_race_is_a_conflict_and_the_next_step_settles() -> None:
    secrets, clock = FakeSecrets(), Clock()
    rot, _ = rotation(secrets, clock)
    await rot.step()
    clock.now = T0 + 61 * DAY
    real_get = secrets.get

    async def stale_get(name: str) -> tuple[dict[str, bytes], str] | None:
        got = await real_get(name)
        if got is None or name != SERVING_SECRET:
            return got
        return got[0], "0"  # another writer replaced it since

    secrets.get = stale_get  # type: ignore[method-assign]
    with pytest.raises(Conflict):
        await rot.step()
    secrets.get = real_get  # type: ignore[method-assign]
    before = serial(secrets, SERVING_SECRET)
    await rot.step()
    assert serial(secrets, SERVING_SECRET) != before
