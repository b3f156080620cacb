"""The pure parts of ``tidelease ctl``: device states, availability, tables and colour."""

from __future__ import annotations

import pytest

from extender.ctl import render
from extender.ctl.view import Counts, DeviceView, device_availability


def device(**kw: object) -> DeviceView:
    base: dict[str, object] = {
        "node": "n",
        "index": 0,
        "uuid": "GPU-0",
        "type": "H20",
        "tier": "HA",
        "health": "Healthy",
        "reason": "",
        "availability": None,
        "owner": None,
        "replica": None,
        "standby": False,
        "holder": None,
        "holder_priority": None,
    }
    return DeviceView(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "state"),
    [
        ({}, "free"),
        ({"health": "Unknown"}, "unusable"),
        ({"holder": "a/p", "holder_priority": "high"}, "held"),
        ({"holder": "a/p", "holder_priority": "low", "owner": "recsys"}, "borrowed"),
        # A device held stays held whatever its health: the pod has it.
        ({"holder": "a/p", "holder_priority": "low", "health": "Unhealthy"}, "borrowed"),
    ],
)
def test_a_device_is_in_one_state(kw: dict[str, object], state: str) -> None:
    assert device(**kw).state == state


def test_counts_split_standby_into_free_and_on_loan() -> None:
    c = Counts("H20", "HA")
    for d in (
        device(standby=True),
        device(standby=True, holder="a/b", holder_priority="low"),
        device(owner="recsys", holder="a/c", holder_priority="low"),
        device(health="Unhealthy"),
    ):
        c.add(d)
    got = (c.total, c.healthy, c.unhealthy, c.free, c.borrowed, c.lent)
    assert got == (4, 3, 1, 1, 2, 1)
    assert (c.standby_free, c.standby_on_loan) == (1, 1)


def test_availability_is_healthy_time_over_observed_time() -> None:
    assert device_availability([]) is None
    assert device_availability([(0.0, 90.0, True), (90.0, 100.0, False)]) == pytest.approx(0.9)
    # A gap (the agent down) is not observed, so not counted against the device.
    assert device_availability([(0.0, 50.0, True), (80.0, 100.0, True)]) == 1.0


def test_tables_align_and_colour_only_when_asked() -> None:
    rows = [("a", "Unhealthy", None), ("longer", "Healthy", 3)]
    plain = render.table(("NAME", "HEALTH", "N"), rows)
    assert plain == "NAME    HEALTH     N\na       Unhealthy  -\nlonger  Healthy    3\n"
    coloured = render.table(("NAME", "HEALTH", "N"), rows, colour=True)
    assert "\033[31mUnhealthy\033[0m" in coloured
    assert "\033[" not in plain


class _Refusing:
    """A store whose lists fail as the API server answers without the CRDs, or a user without
    the right to list."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def list_objects(self, kind: str) -> list[dict[str, object]]:
        raise self.error


async def test_missing_crds_and_permissions_are_named() -> None:
    from common.errors import InvalidInput, NotFound
    from extender.ctl.reading import _list

    with pytest.raises(NotFound, match=r"does not serve gpunodes\.tidelease\.io: are tidelease's"):
        await _list(_Refusing(NotFound("GET ...: HTTP 404: not found")), "GpuNode")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="not allowed to list GpuLease objects"):
        await _list(_Refusing(InvalidInput("GET ...: HTTP 403: forbidden")), "GpuLease")  # type: ignore[arg-type]
    # A missing built-in kind is not blamed on the CRDs.
    with pytest.raises(NotFound, match=r"^GET"):
        await _list(_Refusing(NotFound("GET ...: HTTP 404")), "Pod")  # type: ignore[arg-type]


class _BusyThenFine:
    """An API server that answers 429 twice (its storage initialising), then lists."""

    def __init__(self) -> None:
        self.calls = 0

    async def list_objects(self, kind: str) -> list[dict[str, object]]:
        from common.errors import TooManyRequests

        self.calls += 1
        if self.calls <= 2:
            raise TooManyRequests("GET ...: HTTP 429: storage is (re)initializing")
        return [{"kind": kind}]


async def test_a_busy_api_server_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.ctl import reading

    monkeypatch.setattr(reading, "RETRY_DELAYS_S", (0.0, 0.0, 0.0))
    store = _BusyThenFine()
    assert await reading._list(store, "GpuNode") == [{"kind": "GpuNode"}]  # type: ignore[arg-type]
    assert store.calls == 3
    never = _Refusing(reading.Unavailable("GET ...: HTTP 503"))
    with pytest.raises(reading.Unavailable):
        await reading._list(never, "GpuNode")  # type: ignore[arg-type]


def test_the_agents_namespace_is_found_from_their_leases() -> None:
    """``kubectl tidelease`` looks for the agents' heartbeat Leases rather than assuming the
    chart's default namespace: the namespace holding most of them, by name on a tie."""
    from common import contract
    from extender.ctl.reading import agent_namespace

    def lease(namespace: str, name: str) -> dict[str, object]:
        return {"metadata": {"namespace": namespace, "name": name}}

    agents = [lease("gpu-ops", f"{contract.AGENT_LEASE_PREFIX}n{i}") for i in range(3)]
    stray = [lease("other", f"{contract.AGENT_LEASE_PREFIX}n9"), lease("other", "unrelated")]
    assert agent_namespace(agents + stray) == "gpu-ops"
    assert agent_namespace([]) == contract.DEFAULT_AGENT_NAMESPACE
    tie = [
        lease("b", f"{contract.AGENT_LEASE_PREFIX}x"),
        lease("a", f"{contract.AGENT_LEASE_PREFIX}y"),
    ]
    assert agent_namespace(tie) == "a"
