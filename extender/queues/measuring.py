"""Measuring a job's throughput profile live (the ramp-up profiler: a job's throughput measured
at each GPU count as it grows): a job's throughput read from its own metric while it runs at
different GPU counts, its :class:`~extender.queues.profiling.Profile` (and so its scaling
factors) from those readings, and the readings kept on the job's workload, so that a restart
does not lose them.

A job declares its metric on its pods, ``tidelease.io/throughput-query``: PromQL giving one
series, the samples/s of the whole job (``sum(rate(trainer_samples_total{job="x"}[1m]))``).
The queues controller calls :meth:`Profiler.observe` every pass with the GPUs the job holds;
a reading is taken at most every ``every_s`` and only at a count not measured yet:

* At each count (as the paper's profiler): the readings since the count last changed count, the
  first 2 are warm-up and dropped, the mean of the next 3 is the job's throughput at that count
  (exactly 3, as the paper's 5 batches; later readings at a measured count are not taken: a job is
  profiled once). A count left before its 5th reading starts over when the job comes back. The
  query's rate window should be at most the warm-up, 2 x ``every_s`` (default 30 s).
* Measured counts are kept on the job's workload (its Deployment or StatefulSet), annotation
  ``tidelease.io/throughput-measured``: ``"1:100,2:190,3:270"`` (GPUs:samples/s, 6
  significant digits, at most :data:`MAX_GPUS` entries), written with a merge patch when a
  count is measured, read back by the next leader before it writes.
* The profile a job's view gets (:func:`choose`): the measured one once it reaches as far as the
  job's ``tidelease.io/throughput`` annotation does (or as far as the paper's profiler goes, twice
  the request, if that is sooner); before that the annotation; without an annotation any measured
  profile of 2 counts or more; else none (linear: every GPU worth the same).

Gaps: a job that never ran at some counts (replicas of 2 GPUs give 2, 4, 6; a job admitted
at 2 never ran at 1) gets straight lines between its measured counts and, below the lowest, a
straight line from zero (linear speedup before the bottleneck, as the paper observes): the
profile is exact where measured and never mixes in the annotation, whose samples/s may come
from other hardware or another batch size.

Reference: cornucopia 4.3, Algorithm 1, eq. 1 (docs/references.md).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter

from common import contract
from common.errors import Conflict, InvalidInput, NotFound, Unavailable
from extender.queues.profiling import WARMUP_BATCHES, Profile

if TYPE_CHECKING:
    from common.kubeclient import KubeClient

log = logging.getLogger(__name__)

KEPT: Final = 3  # readings averaged after the warm-up (cornucopia: 5 batches, 2 warm-up)
MAX_GPUS: Final = 128  # counts past this are not measured (keeps the annotation small)
MAX_STORED_CHARS: Final = 4096
DIGITS: Final = 6  # significant digits kept (and stored)

Outcome = Literal["warmup", "kept", "measured"]


# --- the measurements of one job (pure) ---


def _quantized(value: float) -> float:
    return float(f"{value:.{DIGITS}g}")


@dataclass(frozen=True, slots=True)
class Measurements:
    """A job's measured throughput (samples/s) by GPU count, and the readings of the count it
    runs at now (since it changed; warm-up included) while that count is not measured yet."""

    measured: Mapping[int, float] = field(default_factory=dict)
    gpus: int = 0  # the count of the current run (0: none yet)
    readings: tuple[float, ...] = ()

    def at(self, gpus: int) -> Measurements:
        """The job runs at ``gpus`` now: a new run when the count changed."""
        return self if gpus == self.gpus else Measurements(self.measured, gpus)

    @property
    def wants_reading(self) -> bool:
        return 1 <= self.gpus <= MAX_GPUS and self.gpus not in self.measured

    def add(self, value: float) -> tuple[Measurements, Outcome]:
        """One reading at the current count (which :attr:`wants_reading`); InvalidInput for a
        value that is no throughput (not finite, or not positive)."""
        if not math.isfinite(value) or value <= 0.0:
            raise InvalidInput(f"throughput {value} samples/s: want a positive number")
        if not self.wants_reading:
            raise InvalidInput(f"{self.gpus} GPUs: no reading wanted")
        readings = (*self.readings, value)
        if len(readings) <= WARMUP_BATCHES:
            return Measurements(self.measured, self.gpus, readings), "warmup"
        if len(readings) < WARMUP_BATCHES + KEPT:
            return Measurements(self.measured, self.gpus, readings), "kept"
        kept = readings[WARMUP_BATCHES:]
        measured = {**self.measured, self.gpus: _quantized(sum(kept) / len(kept))}
        return Measurements(measured, self.gpus), "measured"

    def merged(self, stored: Mapping[int, float]) -> Measurements:
        """With counts read back from the workload (those measured here win)."""
        return Measurements({**stored, **self.measured}, self.gpus, self.readings)


# --- the profile a job gets (pure) ---


def measured_profile(measured: Mapping[int, float]) -> Profile:
    """Throughput at 1 .. the highest measured count: exact where measured, straight lines
    between measured counts, a straight line from zero below the lowest; empty (no profile)
    with fewer than 2 counts."""
    if len(measured) < 2:
        return Profile()
    points = [(0, 0.0), *sorted(measured.items())]
    out: list[float] = []
    for (a, ta), (b, tb) in itertools.pairwise(points):
        out.extend(ta + (tb - ta) * (g - a) / (b - a) for g in range(a + 1, b))
        out.append(tb)
    return Profile(tuple(out))


Source = Literal["measured", "annotated", "linear"]


def choose(
    measured: Mapping[int, float], annotated: Profile, request: int
) -> tuple[Profile, Source]:
    """The profile a job's view gets, and where it comes from: measured once it reaches as far
    as the annotation (or twice the request, where the profiler stops, if sooner); else the
    annotation; else measured with 2 counts or more; else linear (no profile)."""
    m = measured_profile(measured)
    if m.max_gpus >= 2:
        enough = min(2 * max(request, 1), annotated.max_gpus)
        if m.max_gpus >= enough:
            return m, "measured"
    if annotated.max_gpus:
        return annotated, "annotated"
    return Profile(), "linear"


def profile(measured: Mapping[int, float], annotated: Profile, request: int) -> Profile:
    """:func:`choose`'s profile."""
    return choose(measured, annotated, request)[0]


# --- the stored form: tidelease.io/throughput-measured (pure) ---


def encode(measured: Mapping[int, float]) -> str:
    """``"1:100,2:190,3:270"``: GPUs:samples/s by count."""
    return ",".join(f"{g}:{t:.{DIGITS}g}" for g, t in sorted(measured.items()))


def decode(raw: str) -> dict[int, float]:
    """The counts an annotation stores; InvalidInput with every problem found."""
    if len(raw) > MAX_STORED_CHARS:
        raise InvalidInput(f"{len(raw)} characters, want at most {MAX_STORED_CHARS}")
    out: dict[int, float] = {}
    problems = []
    for entry in raw.split(",") if raw else []:
        gpus, sep, value = entry.partition(":")
        try:
            g, t = int(gpus), float(value)
        except ValueError:
            g, t = 0, math.nan
        if not sep or not 1 <= g <= MAX_GPUS or not math.isfinite(t) or t <= 0.0:
            problems.append(f"entry {entry!r:.40} (want GPUS:SAMPLES_PER_S, 1 to {MAX_GPUS} GPUs)")
        elif g in out:
            problems.append(f"{g} GPUs given twice")
        else:
            out[g] = _quantized(t)
    if problems:
        raise InvalidInput(problems)
    return out


# --- reading the metric, keeping the measurements ---


class ThroughputReader(Protocol):
    """One instant PromQL query: the planner's ``PrometheusSource`` is one (the wiring passes it;
    extender.queues does not import the planner). Unavailable when Prometheus cannot be
    reached; InvalidInput for an unusable answer (an error, no data, several series)."""

    async def instant(self, query: str, at_s: float, what: str) -> float: ...


class NullReader:
    """No Prometheus configured: nothing is measured (annotations and linear profiles only)."""

    async def instant(self, query: str, at_s: float, what: str) -> float:
        raise Unavailable(f"{what}: no Prometheus configured")


def object_path(workload_path: str) -> str:
    """The workload object's path (the scale subresource's is accepted too)."""
    return workload_path.removesuffix("/scale")


class Profiler:
    """The measurements of every profiled job, by job key; readings through ``reader``."""

    def __init__(
        self, reader: ThroughputReader, *, registry: CollectorRegistry, every_s: float = 30.0
    ) -> None:
        self.reader, self.every_s = reader, every_s
        self.jobs: dict[str, Measurements] = {}
        self._read_at: dict[str, float] = {}
        self._loaded: set[str] = set()
        self._stored: dict[str, str] = {}  # the annotation as last read or written
        self.readings = Counter(
            "tidelease_queues_profiler_readings",
            "Throughput readings of the ramp-up profiler, by outcome (warmup, kept, measured: "
            "used; unavailable, invalid, error: not).",
            ["outcome"],
            registry=registry,
        )

    def measured(self, job_key: str) -> Mapping[int, float]:
        return self.jobs[job_key].measured if job_key in self.jobs else {}

    def profile(self, job_key: str, annotated: Profile, request: int) -> Profile:
        """The profile of a job's view (:func:`choose`)."""
        return profile(self.measured(job_key), annotated, request)

    def forget(self, job_key: str) -> None:
        """A job gone: its measurements stay on its workload only."""
        self.jobs.pop(job_key, None)
        self._read_at.pop(job_key, None)
        self._stored.pop(job_key, None)
        self._loaded.discard(job_key)

    async def observe(self, job_key: str, query: str, gpus: int, now: float) -> None:
        """The job runs at ``gpus`` now: one reading of ``query`` if one is wanted. Errors are
        logged and counted, never raised."""
        m = self.jobs.get(job_key, Measurements()).at(gpus)
        self.jobs[job_key] = m
        if not m.wants_reading or now - self._read_at.get(job_key, -math.inf) < self.every_s:
            return
        self._read_at[job_key] = now
        what = f"throughput query of job {job_key}"
        try:
            value = await self.reader.instant(query, now, what)
        except Unavailable as e:
            self.readings.labels("unavailable").inc()
            log.warning("profiler: job %s: %s", job_key, e)
            return
        except InvalidInput as e:  # an error reply, no data, several series
            self.readings.labels("invalid").inc()
            log.warning("profiler: job %s at %d GPU(s): %s", job_key, gpus, e)
            return
        except Exception:  # a reader's bug: logged, the controller's pass goes on
            self.readings.labels("error").inc()
            log.exception("profiler: job %s: reading failed", job_key)
            return
        m = self.jobs.get(job_key, Measurements())
        if m.gpus != gpus or not m.wants_reading:  # moved (or loaded) meanwhile: no use
            return
        try:
            m, outcome = m.add(value)
        except InvalidInput as e:
            self.readings.labels("invalid").inc()
            log.warning("profiler: job %s at %d GPU(s): %s", job_key, gpus, e)
            return
        self.jobs[job_key] = m
        self.readings.labels(outcome).inc()
        if outcome == "measured":
            log.info(
                "profiler: job %s: %.6g samples/s at %d GPU(s)", job_key, m.measured[gpus], gpus
            )

    async def load(self, kube: KubeClient, job_key: str, workload_path: str) -> bool:
        """Read the job's measured counts back from its workload, once; False when it could not
        be read (the next call tries again). Bad stored data is ignored, with a log line."""
        if job_key in self._loaded:
            return True
        path = object_path(workload_path)
        try:
            obj = await kube.json("GET", path)
        except (NotFound, Unavailable, InvalidInput) as e:
            log.warning("profiler: job %s: workload %s not read: %s", job_key, path, e)
            return False
        raw = str(((obj.get("metadata") or {}).get("annotations") or {}).get(
            contract.ANN_THROUGHPUT_MEASURED, ""
        ))  # fmt: skip
        try:
            stored = decode(raw)
        except InvalidInput as e:
            log.warning(
                "profiler: job %s: annotation %s on %s ignored: %s",
                job_key, contract.ANN_THROUGHPUT_MEASURED, path, e,
            )  # fmt: skip
            stored = {}
        self.jobs[job_key] = self.jobs.get(job_key, Measurements()).merged(stored)
        self._stored[job_key] = raw
        self._loaded.add(job_key)
        return True

    async def save(self, kube: KubeClient, job_key: str, workload_path: str) -> bool:
        """Write the job's measured counts on its workload when they changed (after reading
        what is there: a restart never overwrites what it has not read); whether it wrote."""
        if not await self.load(kube, job_key, workload_path):
            return False
        raw = encode(self.measured(job_key))
        if not raw or raw == self._stored.get(job_key):
            return False
        path = object_path(workload_path)
        patch = {"metadata": {"annotations": {contract.ANN_THROUGHPUT_MEASURED: raw}}}
        try:
            await kube.json("PATCH", path, body=patch, content_type="application/merge-patch+json")
        except (NotFound, Unavailable, InvalidInput, Conflict) as e:
            log.warning("profiler: job %s: workload %s not written: %s", job_key, path, e)
            return False
        self._stored[job_key] = raw
        return True
