"""An orchestrated job: a ConfigMap labelled ``tidelease.io/orchestration=job`` holding the
framework's dependency file and the job's replica counts; its pods carry ``tidelease.io/job:
<ConfigMap name>`` and ``tidelease.io/role``. Parsed at the boundary into frozen values. Pure.

.. code-block:: yaml

    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: train-7
      labels: {tidelease.io/orchestration: job}
    data:
      dependencies.yaml: |   # a copy of manifests/orchestration/mpi.yaml, or your own
        ...
      replicas: |
        worker: 4
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from common import contract
from common.coercion import whole
from common.errors import InvalidInput
from extender.orchestration.graph import Dag
from extender.orchestration.records import ANN_RECORDS, Record, parse_records

LABEL_ORCHESTRATION: Final = contract.LABEL_ORCHESTRATION
JOB: Final = "job"  # the label's value on a job's ConfigMap
DATA_DEPENDENCIES: Final = "dependencies.yaml"
DATA_REPLICAS: Final = "replicas"
DISCOVERY_SUFFIX: Final = "-discover-hosts"
DISCOVERY_SCRIPT: Final = "discover_hosts.sh"
DISCOVERY_HOSTS: Final = "hosts"


@dataclass(frozen=True)
class JobRef:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def discovery_config_map(self) -> str:
        return f"{self.name}{DISCOVERY_SUFFIX}"


@dataclass(frozen=True)
class JobSpec:
    ref: JobRef
    dag: Dag
    replicas: Mapping[str, int]  # every role's expected count
    records: Mapping[str, Record]
    resource_version: str


def _shown(value: object) -> str:
    """A value for a message. A collection is never written out: YAML aliases let a few lines
    stand for billions of elements ("billion laughs"), which ``repr`` would expand."""
    if isinstance(value, list | dict | set):
        return "a mapping" if isinstance(value, dict) else f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_replicas(text: str | None, roles: Mapping[str, int | None]) -> dict[str, int]:
    """The job's counts over the file's defaults; every role must end with one."""
    problems = []
    given: dict[str, Any] = {}
    if text:
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InvalidInput(f"{DATA_REPLICAS}: not valid YAML: {e}") from None
        except RecursionError:  # PyYAML composes nested collections recursively
            raise InvalidInput(f"{DATA_REPLICAS}: not valid YAML: nested too deeply") from None
        except ValueError as e:  # an integer too long to convert (int's digit limit)
            raise InvalidInput(f"{DATA_REPLICAS}: not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise InvalidInput(f"{DATA_REPLICAS}: want a mapping of role to count")
        given = loaded or {}
    out: dict[str, int] = {}
    for role, count in given.items():
        if role not in roles:
            problems.append(f'{DATA_REPLICAS}.{role}: unknown role "{role}"')
        elif not whole(count) or count < 0:
            problems.append(
                f"{DATA_REPLICAS}.{role}: want a count of at least 0, got {_shown(count)}"
            )
        else:
            out[role] = count
    for role, default in roles.items():
        if role in given:
            continue
        if default is None:
            problems.append(
                f'{DATA_REPLICAS}: role "{role}" has no replica count (the dependency file '
                "gives none)"
            )
        else:
            out[role] = default
    if problems:
        raise InvalidInput(problems)
    return out


def job_ref(raw: Mapping[str, Any]) -> JobRef:
    meta = raw.get("metadata") or {}
    return JobRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid")))


def parse_job(raw: Mapping[str, Any], load_dag: Callable[[str], Dag]) -> JobSpec:
    """The job; InvalidInput with every problem, each prefixed by the data key it is in.
    ``load_dag`` is :func:`extender.orchestration.graph.load`, or a cache in front of it."""
    meta = raw.get("metadata") or {}
    data = raw.get("data") or {}
    text = data.get(DATA_DEPENDENCIES)
    if not text:
        raise InvalidInput(f"data.{DATA_DEPENDENCIES}: missing")
    try:
        dag = load_dag(str(text))
    except InvalidInput as e:
        raise InvalidInput([f"{DATA_DEPENDENCIES}: {p}" for p in e.problems]) from None
    replicas = parse_replicas(data.get(DATA_REPLICAS), dag.roles)
    records = parse_records((meta.get("annotations") or {}).get(ANN_RECORDS))
    return JobSpec(job_ref(raw), dag, replicas, records, str(meta.get("resourceVersion", "")))
