"""Job classes of the shared queues (cornucopia 3.1), read from pod annotations.

``tidelease.io/job-class: interactive | batch`` (default batch: cornucopia accepts no unlabeled
job; a missing label is treated as the class that is never favoured) and
``tidelease.io/elastic: "false"`` (model-parallel and other jobs that must run on exactly the
GPUs they ask for; default elastic). Three classes follow: interactive, batch and non-elastic
(a non-elastic job is queued by its job class but never scaled, and is preempted whole).
"""

from __future__ import annotations

import enum
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
