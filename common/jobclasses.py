"""Job classes of the shared queues (cornucopia 3.1), read from pod annotations. Pure.

``tidelease.io/job-class: interactive | batch`` (default batch: cornucopia accepts no unlabeled
job; a missing label is treated as the class that is never favoured) and
``tidelease.io/elastic: "false"`` (model-parallel and other jobs that must run on exactly the
GPUs they ask for; default elastic). Three classes follow: interactive, batch and non-elastic
(a non-elastic job is queued by its job class but never scaled, and is preempted whole).
``tidelease.io/throughput`` is the job's scaling profile. The filter reports bad values of all
three (``class_problems``); the planner reads them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

from common import contract


class JobKind(enum.Enum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class JobClass:
    kind: JobKind = JobKind.BATCH
    elastic: bool = True

    @property
    def label(self) -> str:
        """interactive, batch or non-elastic: the class names of the issue and the docs."""
        if not self.elastic:
            return "non-elastic"
        return self.kind.value


_BOOLS = {"true": True, "false": False}


def job_class(annotations: Mapping[str, str]) -> tuple[JobClass, list[str]]:
    """The class a pod's annotations give its job, with every problem found (defaults then)."""
    problems: list[str] = []
    raw_kind = annotations.get(contract.ANN_JOB_CLASS)
    kind = JobKind.BATCH
    if raw_kind is not None:
        try:
            kind = JobKind(raw_kind.strip().lower())
        except ValueError:
            problems.append(
                f"annotation {contract.ANN_JOB_CLASS}: invalid value {raw_kind!r} "
                "(want interactive or batch)"
            )
    raw_elastic = annotations.get(contract.ANN_ELASTIC)
    elastic = True
    if raw_elastic is not None:
        value = _BOOLS.get(raw_elastic.strip().lower())
        if value is None:
            problems.append(
                f"annotation {contract.ANN_ELASTIC}: invalid value {raw_elastic!r} "
                "(want true or false)"
            )
        else:
            elastic = value
    return JobClass(kind, elastic), problems


def parse_throughput(raw: str) -> tuple[tuple[float, ...], list[str]]:
    """``tidelease.io/throughput``: samples/s at 1, 2, ... GPUs (``"100,190,270"``), with the
    problems found (then no profile)."""
    try:
        values = tuple(float(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        return (), [
            f"annotation {contract.ANN_THROUGHPUT}: invalid value {raw!r} (want samples/s at "
            "1, 2, ... GPUs: non-negative numbers separated by commas)"
        ]
    return values, []


def class_problems(annotations: Mapping[str, str]) -> list[str]:
    """Every problem with a pod's job-class, elastic and throughput annotations."""
    problems = job_class(annotations)[1]
    raw = annotations.get(contract.ANN_THROUGHPUT)
    if raw is not None:
        problems += parse_throughput(raw)[1]
    return problems
