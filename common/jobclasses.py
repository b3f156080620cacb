"""Job classes of the shared queues, read from pod annotations. Pure.

A job says on its pods whether someone waits for it (interactive: debugging and trial runs,
served first) or not (batch: long training), and whether it can change its GPU count while it
runs (elastic) or needs exactly the GPUs it asks for:

``tidelease.io/job-class: interactive | batch`` (default batch: the queues' design assumes every
job is labelled; a missing label is treated as the class that is never favoured) and
``tidelease.io/elastic: "false"`` (model-parallel and other jobs that must run on exactly the
GPUs they ask for; default elastic). Three classes follow: interactive, batch and non-elastic
(a non-elastic job is queued by its job class but never scaled, and is preempted whole).
``tidelease.io/throughput`` is the job's scaling profile. Their rules are
common.annotationrules' (the filter and the admission policy report bad values); the planner
reads them here.

Reference: cornucopia 3.1 (docs/references.md).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from common import contract
from common.annotationrules import loose, problem, rule_of


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


def job_class(annotations: Mapping[str, str]) -> tuple[JobClass, list[str]]:
    """The class a pod's annotations give its job, with every problem found (defaults then)."""
    problems: list[str] = []
    raw_kind = annotations.get(contract.ANN_JOB_CLASS)
    kind = JobKind.BATCH
    if raw_kind is not None:
        if rule_of(contract.ANN_JOB_CLASS).accepts(raw_kind):
            kind = JobKind(loose(raw_kind))
        else:
            problems.append(problem(rule_of(contract.ANN_JOB_CLASS), raw_kind))
    raw_elastic = annotations.get(contract.ANN_ELASTIC)
    elastic = True
    if raw_elastic is not None:
        if rule_of(contract.ANN_ELASTIC).accepts(raw_elastic):
            elastic = loose(raw_elastic) == "true"
        else:
            problems.append(problem(rule_of(contract.ANN_ELASTIC), raw_elastic))
    return JobClass(kind, elastic), problems


def parse_throughput(raw: str) -> tuple[tuple[float, ...], list[str]]:
    """``tidelease.io/throughput``: samples/s at 1, 2, ... GPUs (``"100,190,270"``), with the
    problems found (then no profile)."""
    rule = rule_of(contract.ANN_THROUGHPUT)
    if not rule.accepts(raw):
        return (), [problem(rule, raw)]
    return tuple(float(v) for v in raw.split(",")), []
