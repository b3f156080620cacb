"""The ramp-up profiler live (extender.queues.measuring): a job's throughput metric read at 1..6
GPUs, with warm-up readings after each change, gives exactly the eq. 1 scaling factors of its
true throughput; the profile falls back from measured to the annotation to linear; the
measurements survive a restart through the workload's annotation, and bad stored data is
ignored with a log line. A fake reader and a fake API server in memory; the clock injected."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from common import contract
from common.errors import InvalidInput, NotFound, Unavailable
from common.kubeclient import KubeClient
from extender.queues.measuring import (
    Measurements,
    Profiler,
    Source,
    choose,
    decode,
    encode,
    measured_profile,
)
from extender.queues.profiling import Profile
from extender.queues.testing import FakeReader

QUERY = 'sum(rate(trainer_samples_total{job="resnet"}[1m]))'
JOB = "team-a/resnet"
WORKLOAD = "/apis/apps/v1/namespaces/team-a/deployments/resnet"
EVERY = 15.0
T0 = 1_700_000_000.0


def true_throughput(g: int) -> float:
    """Linear to 4 GPUs, then 20 samples/s more per GPU: the knee at 4."""
    return 100.0 * g if g <= 4 else 400.0 + 20.0 * (g - 4)


# Readings after a change of count: 2 of warm-up (far off: they would spoil a mean that kept
# them), then within 1% of the truth, averaging to it.
WARMUP = (0.3, 0.7)
STEADY = (0.99, 1.0, 1.01)


@dataclass
class Ramp:
    """A job run at ``counts`` in turn, each for ``per_count`` readings ``EVERY`` apart; its
    metric as Prometheus would answer at each time."""

    counts: tuple[int, ...]
    per_count: int = 5

    def start(self, i: int) -> float:
        return T0 + i * self.per_count * EVERY

    def at(self, t: float) -> tuple[int, int]:
        """(count, readings since the change) at time ``t``."""
        k = round((t - T0) / EVERY)
        return self.counts[k // self.per_count], k % self.per_count

    def metric(self, t: float) -> float:
        g, k = self.at(t)
        share = WARMUP[k] if k < len(WARMUP) else STEADY[(k - len(WARMUP)) % len(STEADY)]
        return true_throughput(g) * share

    async def run(self, profiler: Profiler) -> None:
        for i, g in enumerate(self.counts):
            for k in range(self.per_count):
                await profiler.observe(JOB, QUERY, g, self.start(i) + k * EVERY)


def sample(registry: CollectorRegistry, outcome: str) -> float:
    return (
        registry.get_sample_value("tidelease_queues_profiler_readings_total", {"outcome": outcome})
        or 0.0
    )


def made(ramp: Ramp | None = None) -> tuple[Profiler, FakeReader, CollectorRegistry]:
    registry = CollectorRegistry()
    reader = FakeReader({QUERY: ramp.metric} if ramp else {})
    return Profiler(reader, registry=registry, every_s=EVERY), reader, registry


# --- Algorithm 1 and eq. 1 ---


async def test_readings_at_1_to_6_gpus_give_the_eq1_factors() -> None:
    ramp = Ramp(counts=(1, 2, 3, 4, 5, 6))
    profiler, reader, registry = made(ramp)
    await ramp.run(profiler)

    truth = Profile(tuple(true_throughput(g) for g in range(1, 7)))
    got = profiler.profile(JOB, Profile(), request=3)
    assert profiler.measured(JOB) == {g: true_throughput(g) for g in range(1, 7)}
    assert got == truth
    for j in range(1, 7):
        assert got.scaling_factor(j) == truth.scaling_factor(j), j
    assert [got.scaling_factor(j) for j in range(1, 6)] == [1.0, 1.0, 1.0, 0.2, 0.2]
    assert reader.calls == 30
    assert (sample(registry, "warmup"), sample(registry, "kept")) == (12, 12)
    assert sample(registry, "measured") == 6


async def test_a_measured_count_is_not_read_again() -> None:
    ramp = Ramp(counts=(1, 1, 2, 2, 1), per_count=5)
    profiler, reader, _ = made(ramp)
    # 1 GPU for 10 readings: measured after 5, the next 5 not taken; the same at 2; back at 1.
    await ramp.run(profiler)
    assert reader.calls == 10
    assert profiler.measured(JOB) == {1: 100.0, 2: 200.0}


async def test_a_count_left_before_its_fifth_reading_starts_over() -> None:
    profiler, reader, _ = made()
    values = iter([50.0, 60.0, 200.0, 1.0, 1.0, 1.0, 1.0, 1.0, 7.0, 8.0, 190.0, 190.0, 190.0])
    reader.series[QUERY] = lambda t: next(values)
    t = T0
    for g in (2, 2, 2, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2):  # 2 GPUs: 3 readings, then away
        await profiler.observe(JOB, QUERY, g, t)
        t += EVERY
    # Back at 2 GPUs: 2 warm-up readings again (7 and 8), then 190 three times; the
    # readings of the first stay at 2 GPUs (50, 60, 200) are not in its mean.
    assert profiler.measured(JOB) == {1: 1.0, 2: 190.0}


async def test_readings_closer_than_every_s_are_not_taken() -> None:
    profiler, reader, _ = made(Ramp(counts=(1,)))
    for k in range(10):
        await profiler.observe(JOB, QUERY, 1, T0 + k * EVERY / 2)
    assert reader.calls == 5


@pytest.mark.parametrize(
    ("fail", "outcome"),
    [
        (Unavailable("prometheus: connection refused"), "unavailable"),
        (InvalidInput("throughput query: no data (empty vector)"), "invalid"),
        (RuntimeError("a reader's bug"), "error"),
    ],
    ids=["unavailable", "error-reply", "bug"],
)
async def test_reading_errors_are_counted_never_raised(
    fail: Exception, outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    profiler, reader, registry = made(Ramp(counts=(1,)))
    reader.fail = fail
    await profiler.observe(JOB, QUERY, 1, T0)
    assert sample(registry, outcome) == 1
    assert JOB in caplog.text
    assert profiler.measured(JOB) == {}


@pytest.mark.parametrize(
    "value", [0.0, -3.0, float("nan"), float("inf")], ids=["zero", "negative", "nan", "inf"]
)
async def test_a_value_that_is_no_throughput_is_not_a_reading(value: float) -> None:
    profiler, reader, registry = made()
    reader.series[QUERY] = lambda t: value
    await profiler.observe(JOB, QUERY, 1, T0)
    assert sample(registry, "invalid") == 1
    assert profiler.jobs[JOB].readings == ()


async def test_no_reading_without_gpus() -> None:
    profiler, reader, _ = made(Ramp(counts=(1,)))
    await profiler.observe(JOB, QUERY, 0, T0)
    assert reader.calls == 0


# --- which profile a job gets ---

ANNOTATED = Profile((100.0, 190.0, 270.0, 340.0))


@pytest.mark.parametrize(
    ("measured", "annotated", "requested", "source"),
    [
        ({1: 100.0, 2: 200.0, 3: 300.0}, Profile(), 4, "measured"),
        ({1: 100.0, 2: 200.0, 3: 300.0, 4: 320.0}, ANNOTATED, 4, "measured"),
        ({1: 100.0, 2: 200.0}, ANNOTATED, 1, "measured"),
        ({1: 100.0, 2: 200.0, 3: 300.0}, ANNOTATED, 4, "annotated"),
        ({1: 100.0}, ANNOTATED, 1, "annotated"),
        ({}, ANNOTATED, 1, "annotated"),
        ({1: 100.0}, Profile(), 1, "linear"),
        ({}, Profile(), 1, "linear"),
        ({2: 190.0, 4: 340.0}, Profile(), 2, "measured"),
    ],
    ids=[
        "measured-without-annotation",
        "measured-as-far-as-the-annotation",
        "measured-to-twice-the-request",
        "measured-short-of-the-annotation",
        "one-count-measured",
        "nothing-measured",
        "one-count-no-annotation",
        "nothing-at-all",
        "gaps-measured",
    ],
)
def test_profile_measured_then_annotated_then_linear(
    measured: Mapping[int, float], annotated: Profile, requested: int, source: Source
) -> None:
    got, where = choose(measured, annotated, requested)
    assert where == source
    want = {
        "measured": measured_profile(measured),
        "annotated": annotated,
        "linear": Profile(),
    }[source]
    assert got == want
    if source == "linear":
        assert [got.scaling_factor(j) for j in range(1, 8)] == [1.0] * 7


@pytest.mark.parametrize(
    ("measured", "throughput"),
    [
        ({1: 100.0, 2: 190.0, 3: 270.0}, (100.0, 190.0, 270.0)),
        ({2: 190.0, 4: 340.0, 6: 380.0}, (95.0, 190.0, 265.0, 340.0, 360.0, 380.0)),
        ({1: 100.0, 2: 190.0, 5: 400.0}, (100.0, 190.0, 260.0, 330.0, 400.0)),
        ({3: 300.0, 4: 320.0}, (100.0, 200.0, 300.0, 320.0)),
        ({2: 190.0}, ()),
    ],
    ids=["contiguous", "replicas-of-2-gpus", "a-gap", "never-below-3", "one-count"],
)
def test_gaps_are_straight_lines_and_linear_from_zero(
    measured: Mapping[int, float], throughput: tuple[float, ...]
) -> None:
    assert measured_profile(measured) == Profile(throughput)


# --- the stored form ---


@pytest.mark.parametrize(
    "measured",
    [{1: 100.0}, {1: 100.0, 2: 190.5, 3: 270.125}, {2: 1.23457e6, 128: 1e-3}],
    ids=["one", "three", "far"],
)
def test_the_stored_form_round_trips(measured: dict[int, float]) -> None:
    assert decode(encode(measured)) == measured


def test_the_stored_form_is_compact_and_bounded() -> None:
    assert encode({2: 190.0, 1: 100.0, 3: 270.123456789}) == "1:100,2:190,3:270.123"
    widest = encode({g: 123456.789 for g in range(1, 129)})
    assert decode(widest)[128] == 123457.0
    assert len(widest) < 2048


@pytest.mark.parametrize(
    "raw",
    [
        "1:100,x:3",
        "1:abc",
        "0:100",
        "129:1",
        "1:-5",
        "1:nan",
        "1:100,1:100",
        "100",
        "1:1," * 1200,
    ],
    ids=["count", "value", "zero-gpus", "too-many-gpus", "negative", "nan", "twice", "bare",
         "too-long"],
)  # fmt: skip
def test_bad_stored_data_is_refused(raw: str) -> None:
    with pytest.raises(InvalidInput):
        decode(raw)


@dataclass
class Kube:
    """A fake API server holding workload objects by path (what the Profiler uses of it)."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    patches: list[tuple[str, Any, str]] = field(default_factory=list)
    down: bool = False

    async def json(
        self, method: str, path: str, *, body: Any = None, content_type: str = ""
    ) -> dict[str, Any]:
        if self.down:
            raise Unavailable(f"{method} {path}: connection refused")
        if path not in self.objects:
            raise NotFound(f"{method} {path}: not found")
        obj = self.objects[path]
        if method == "PATCH":
            assert content_type == "application/merge-patch+json"
            self.patches.append((path, body, content_type))
            meta = obj.setdefault("metadata", {})
            meta.setdefault("annotations", {}).update(body["metadata"]["annotations"])
        return obj


def workload(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "resnet", "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta}


def kube_of(fake: Kube) -> KubeClient:
    return cast(KubeClient, fake)


async def test_measurements_survive_a_restart_on_the_workload() -> None:
    ramp = Ramp(counts=(1, 2, 3))
    kube = Kube({WORKLOAD: workload()})
    profiler, _, _ = made(ramp)
    await ramp.run(profiler)
    assert await profiler.save(kube_of(kube), JOB, WORKLOAD)
    assert not await profiler.save(kube_of(kube), JOB, WORKLOAD)  # unchanged: not written
    assert len(kube.patches) == 1
    stored = kube.objects[WORKLOAD]["metadata"]["annotations"]
    assert stored == {contract.ANN_THROUGHPUT_MEASURED: "1:100,2:200,3:300"}

    restarted, reader, _ = made()
    assert await restarted.load(kube_of(kube), JOB, f"{WORKLOAD}/scale")
    assert restarted.measured(JOB) == profiler.measured(JOB)
    assert restarted.profile(JOB, Profile(), 2) == profiler.profile(JOB, Profile(), 2)
    # Measured counts are not read again after the restart.
    await restarted.observe(JOB, QUERY, 2, T0)
    assert reader.calls == 0


async def test_a_restart_reads_before_it_writes() -> None:
    kube = Kube({WORKLOAD: workload({contract.ANN_THROUGHPUT_MEASURED: "1:100,2:200"})})
    profiler, _, _ = made(Ramp(counts=(3,)))
    await Ramp(counts=(3,)).run(profiler)
    assert await profiler.save(kube_of(kube), JOB, WORKLOAD)
    stored = kube.objects[WORKLOAD]["metadata"]["annotations"]
    assert stored[contract.ANN_THROUGHPUT_MEASURED] == "1:100,2:200,3:300"


@pytest.mark.parametrize("raw", ["1:100,2:lots", "{}", "1:" * 3000], ids=["value", "json", "long"])
async def test_bad_stored_data_is_ignored_with_a_log_line(
    raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    kube = Kube({WORKLOAD: workload({contract.ANN_THROUGHPUT_MEASURED: raw})})
    profiler, _, _ = made()
    with caplog.at_level(logging.WARNING, logger="extender.queues.measuring"):
        assert await profiler.load(kube_of(kube), JOB, WORKLOAD)
    assert profiler.measured(JOB) == {}
    assert f"annotation {contract.ANN_THROUGHPUT_MEASURED} on {WORKLOAD} ignored" in caplog.text


async def test_an_unreadable_workload_is_read_again_and_not_written() -> None:
    kube = Kube({WORKLOAD: workload({contract.ANN_THROUGHPUT_MEASURED: "1:100,2:200"})}, down=True)
    profiler, _, _ = made(Ramp(counts=(3,)))
    await Ramp(counts=(3,)).run(profiler)
    assert not await profiler.load(kube_of(kube), JOB, WORKLOAD)
    assert not await profiler.save(kube_of(kube), JOB, WORKLOAD)
    assert kube.patches == []
    kube.down = False
    assert await profiler.save(kube_of(kube), JOB, WORKLOAD)
    assert profiler.measured(JOB) == {1: 100.0, 2: 200.0, 3: 300.0}


async def test_a_missing_workload_is_not_loaded() -> None:
    profiler, _, _ = made()
    assert not await profiler.load(kube_of(Kube()), JOB, WORKLOAD)
    assert not await profiler.save(kube_of(Kube()), JOB, WORKLOAD)


def test_measurements_are_values() -> None:
    m = Measurements().at(2)
    m2, outcome = m.add(50.0)
    assert (outcome, m.readings, m2.readings) == ("warmup", (), (50.0,))
    assert m2.at(2) is m2
    assert m2.at(3).readings == ()
