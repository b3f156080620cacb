"""Extender settings: one frozen tree with named defaults; CLI > environment > file > defaults."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common import contract
from common.coercion import coerce, finite
from common.errors import InvalidInput
from common.httpserving import ServerTLS
from common.keyfile import key_file
from common.model import Tier
from common.queryscope import DEFAULT_LABEL, valid_label
from common.tenancy import DEFAULT_ONLINE_PRIORITY_CLASS
from extender.scheduler.scoring import ScoreWeights

ENV_PREFIX = "TIDELEASE_EXTENDER_"


@dataclass(frozen=True, slots=True)
class ExtenderSettings:
    host: str = "0.0.0.0"
    port: int = 8888
    # /healthz, /readyz and /metrics on a port of their own (None: on the verbs' port), so the
    # verbs can listen on loopback only while the kubelet's probes and Prometheus reach these.
    probe_host: str = "0.0.0.0"
    probe_port: int | None = None
    # HTTPS on the verbs' port, with a client certificate from client_ca_file required (the
    # cluster-scheduler mode: kube-scheduler reaches the extender over the network). All three
    # or none; files that change (a rotated Secret) are read again without a restart.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    client_ca_file: Path | None = None
    # Of the client certificates client_ca_file's CA signed, those admitted: for client
    # authentication only (clientAuth, not serverAuth) and naming one of these as subject CN
    # (empty: any name). The chart's kube-scheduler client certificate by default.
    client_names: tuple[str, ...] = ("tidelease-scheduler-client",)
    # Open connections each listener accepts; past that, 503 and close (common.httpserving).
    max_connections: int = 256
    # /metrics only for a bearer token the API server authenticates (TokenReview) and allows
    # to get /metrics (SubjectAccessReview), as kube-scheduler's own metrics. Needs an API
    # server (not with snapshot). The chart turns it on.
    metrics_auth: bool = False
    # A series per GPU on /metrics (tidelease_cluster_gpu_info, labelled by UUID as the DCGM
    # exporter labels its own), for dashboards that join DCGM's figures with tidelease's.
    gpu_info_metric: bool = False
    gpu_resource: str = contract.DEFAULT_GPU_RESOURCE
    # The schedulers whose pods bind accepts (a pod's spec.schedulerName): the chart sets the
    # one of its mode. A bind for any other pod is refused, whoever calls.
    scheduler_names: tuple[str, ...] = ("default-scheduler", "tidelease-scheduler")
    # The PriorityClass of online pods (the chart's priorityClasses.online.name): like
    # tidelease.io/priority: high, only namespaces an admin granted may use it (common.tenancy).
    online_priority_class: str = DEFAULT_ONLINE_PRIORITY_CLASS
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    # A ledger write that loses a race is retried this many times before bind fails.
    bind_attempts: int = 8
    # An allocation whose pod was never bound is released after this long.
    reserve_ttl_s: float = 120.0
    # Devices held in memory for a gang's pod between its filter and its bind (the members wait
    # for each other at Permit: upstream's gang waits up to five minutes).
    gang_reserve_ttl_s: float = 300.0
    # An allocation whose pod is not (yet) in the cache is kept this long (watch lag).
    missing_grace_s: float = 30.0
    reap_interval_s: float = 10.0
    # /readyz fails once the API server has not answered (its own /readyz) for this long: the
    # watched view may be stale, and kube-scheduler should use a replica that still hears it.
    stale_after_s: float = 15.0
    # A bind that has not finished by then answers with the protocol's Error (kube-scheduler's
    # httpTimeout, 10 s in the chart, must not pass first: it would not say why).
    bind_timeout_s: float = 8.0
    # A node whose agent has not renewed its Lease for this long offers no devices.
    agent_timeout_s: float = 60.0
    agent_namespace: str = contract.DEFAULT_AGENT_NAMESPACE
    # Controllers this process runs (each leader-elected among the replicas), enabled alike by
    # a settings key or its flag (extender.main.CONTROLLERS).
    leasing_controller: bool = False
    hot_restart_operator: bool = False
    # `tidelease controllers --gang-controller`: a borrower gang whose member is disrupted
    # is evicted whole (extender/gangs).
    gang_controller: bool = False
    # `tidelease controllers --kueue-admission-check`: lent GPUs as capacity Kueue admits into
    # (extender/kueue; needs the leasing controller's view, so the leasing controller too).
    kueue_admission_check: bool = False
    # The AdmissionChecks (by name) the Kueue check decides for: of those naming its
    # controllerName, the others are marked not Active. The chart's admission policy lets the
    # controllers' token write only these checks' entries of a Workload's status
    # (extender.controllers.kueueChecks).
    kueue_checks: tuple[str, ...] = (contract.KUEUE_CHECK,)
    agent_conditions: bool = False
    queues_controller: bool = False
    # The shared queues (docs/planner.md "Shared queues live"): the starting thresholds that
    # move jobs between queues (demoted after running long, promoted after starving; cornucopia
    # 4.2), adapted every queue_adapt_every completions; a pass at least this often.
    queue_demote_interactive_s: float = 3600.0
    queue_demote_batch_s: float = 86400.0
    queue_promote_s: float = 43200.0
    queue_adapt_every: int = 1000
    queue_interval_s: float = 5.0
    # The key of the queues' release proofs (common/queuerelease.py), a file (the chart's
    # Secret, mounted): the queues controller signs each pod it releases with it, and the
    # extender places no tidelease.io/job-class pod without a valid proof. Read again when it
    # changes. None: the queues are off (no proofs written, none asked for).
    queue_release_key_file: Path | None = None
    # The Secret (in agent_namespace, the release's) holding that key: the queues controller
    # makes it with a new random key when it does not exist ("" : the admin provides the file).
    queue_release_secret: str = ""
    prewarm_controller: bool = False
    planner: bool = False
    # Tenant-supplied PromQL (a pod's tidelease.io/throughput-query, a GpuLease's planner
    # queries) is run only scoped to the object's namespace: this label="<namespace>" on every
    # selector (common/queryscope.py). The label Prometheus's series carry the namespace in.
    tenant_query_label: str = DEFAULT_LABEL
    # Test clusters only: every reclaim gives borrowers this many seconds of notice instead of
    # its lease's graceSeconds (which the CRD keeps at 30 or more). None: the leases' own.
    leasing_test_grace_s: int | None = None
    # A reclaim still under way this long after its borrowers' notice makes its GpuLease
    # Degraded (condition and log line; the alert TideleaseReclaimOverdue).
    reclaim_overdue_s: float = 120.0
    # GpuLeases the leasing controller steps at once (never one lease twice at once): at dawn
    # many leases reclaim together, and each step waits on an API write.
    leasing_workers: int = 16
    # DRA mode (docs/dra.md): the cluster allocates tidelease's GPUs through ResourceClaims.
    # The leasing controller then also reads which pod holds which device from the claims,
    # and pins the claim of an owner's returning replica (its pods carry the scheduling gate
    # tidelease.io/reclaim) to the devices the replica lent. The chart sets it with dra.enabled.
    dra: bool = False
    # Standby pool targets: "TYPE/TIER" -> devices, e.g. {"H20/HA": 16}. File only.
    standby: dict[str, int] = field(default_factory=dict)
    snapshot: Path | None = None
    kubeconfig: Path | None = None

    def standby_targets(self) -> dict[tuple[str, Tier], int]:
        out = {}
        for key, count in self.standby.items():
            gpu_type, _, tier = key.partition("/")
            out[(gpu_type, Tier[tier])] = count
        return out

    def server_tls(self) -> ServerTLS | None:
        if self.tls_cert_file is None or self.tls_key_file is None or self.client_ca_file is None:
            return None
        return ServerTLS(
            self.tls_cert_file, self.tls_key_file, self.client_ca_file, self.client_names
        )

    def queue_release_key(self) -> bytes | None:
        """The queues' release key (common/keyfile.py: read again when the file changes; b""
        while unreadable, which refuses every pod of the queues); None without the setting."""
        if self.queue_release_key_file is None:
            return None
        return key_file(self.queue_release_key_file).key()

    def validate(self) -> list[str]:
        """Every problem at once; empty when the settings are usable."""
        problems = []
        tls = {n: getattr(self, n) for n in ("tls_cert_file", "tls_key_file", "client_ca_file")}
        given = [n for n, v in tls.items() if v is not None]
        if given and len(given) < len(tls):
            missing = ", ".join(n for n in tls if n not in given)
            problems.append(f"{', '.join(given)} given without {missing}: HTTPS needs all three")
        problems.extend(f"{n} {v} is not a file" for n, v in tls.items() if v and not v.is_file())
        if self.metrics_auth and self.snapshot is not None:
            problems.append("metrics_auth needs an API server to review tokens, not a snapshot")
        if self.max_connections < 1:
            problems.append("max_connections must be at least 1")
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} is not in 0..65535")
        if self.probe_port is not None and not 0 <= self.probe_port <= 65535:
            problems.append(f"probe_port {self.probe_port} is not in 0..65535")
        if not self.gpu_resource or "/" not in self.gpu_resource:
            problems.append(f"gpu_resource {self.gpu_resource!r} is not an extended resource name")
        w = self.weights
        if min(w.cache, w.ownership, w.reliability, w.packing) < 0 or w.total <= 0:
            problems.append("score weights must be non-negative and not all zero")
        if not self.scheduler_names:
            problems.append("scheduler_names must name at least one scheduler")
        if self.bind_attempts < 1:
            problems.append("bind_attempts must be at least 1")
        if self.leasing_workers < 1:
            problems.append("leasing_workers must be at least 1")
        for name in (
            "reserve_ttl_s",
            "gang_reserve_ttl_s",
            "missing_grace_s",
            "reap_interval_s",
            "agent_timeout_s",
            "stale_after_s",
            "bind_timeout_s",
            "reclaim_overdue_s",
            "queue_demote_interactive_s",
            "queue_demote_batch_s",
            "queue_promote_s",
            "queue_interval_s",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive")
        release_key = self.queue_release_key_file
        # Not there yet is fine when the queues make its Secret (the mount fills in later; the
        # queues' pods wait meanwhile); otherwise it is a mistake.
        if release_key is not None and not self.queue_release_secret and not release_key.is_file():
            problems.append(f"queue_release_key_file {release_key} is not a file")
        if not valid_label(self.tenant_query_label):
            problems.append(
                f"tenant_query_label {self.tenant_query_label!r} is not a label name "
                "(letters, digits, _; not starting with __)"
            )
        if self.leasing_test_grace_s is not None and self.leasing_test_grace_s < 0:
            problems.append("leasing_test_grace_s must not be negative")
        for key, count in self.standby.items():
            gpu_type, _, tier = key.partition("/")
            if (
                not gpu_type
                or tier not in ("HA", "MA", "LA")
                or not isinstance(count, int)
                or (count < 0)
            ):
                problems.append(
                    f"standby: want TYPE/TIER: count (TIER HA, MA or LA), got {key!r}: {count!r}"
                )
        if self.snapshot is not None and not self.snapshot.is_file():
            problems.append(f"snapshot {self.snapshot} is not a file")
        return problems


_FIELD_TYPES: dict[str, type] = {
    "host": str,
    "port": int,
    "probe_host": str,
    "probe_port": int,
    "tls_cert_file": Path,
    "tls_key_file": Path,
    "client_ca_file": Path,
    "client_names": tuple,
    "max_connections": int,
    "metrics_auth": bool,
    "gpu_info_metric": bool,
    "gpu_resource": str,
    "scheduler_names": tuple,
    "online_priority_class": str,
    "bind_attempts": int,
    "reserve_ttl_s": float,
    "gang_reserve_ttl_s": float,
    "missing_grace_s": float,
    "reap_interval_s": float,
    "stale_after_s": float,
    "bind_timeout_s": float,
    "agent_timeout_s": float,
    "agent_namespace": str,
    "leasing_controller": bool,
    "hot_restart_operator": bool,
    "gang_controller": bool,
    "kueue_admission_check": bool,
    "kueue_checks": tuple,
    "agent_conditions": bool,
    "queues_controller": bool,
    "queue_demote_interactive_s": float,
    "queue_demote_batch_s": float,
    "queue_promote_s": float,
    "queue_adapt_every": int,
    "queue_interval_s": float,
    "queue_release_key_file": Path,
    "queue_release_secret": str,
    "prewarm_controller": bool,
    "planner": bool,
    "tenant_query_label": str,
    "leasing_test_grace_s": int,
    "reclaim_overdue_s": float,
    "leasing_workers": int,
    "dra": bool,
    "snapshot": Path,
    "kubeconfig": Path,
}


def _coerce(name: str, value: Any, problems: list[str]) -> Any:
    """``value`` (from YAML, a variable or a flag) as the setting's type, strictly
    (common/coercion.py): a problem is noted, and None returned, otherwise."""
    return coerce(name, _FIELD_TYPES[name], value, problems)


def load_settings(
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ExtenderSettings:
    """Merge defaults, a YAML file, ``TIDELEASE_EXTENDER_*`` variables and CLI overrides."""
    env = os.environ if env is None else env
    problems: list[str] = []
    values: dict[str, Any] = {}
    weights: dict[str, float] = {}
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise InvalidInput(f"settings file {file}: {e}") from e
        if not isinstance(loaded, dict):
            raise InvalidInput(f"settings file {file}: want a mapping at the top")
        for key, value in loaded.items():
            if key == "standby" and isinstance(value, dict):
                values["standby"] = {str(k): v for k, v in value.items()}
            elif key == "weights" and isinstance(value, dict):
                for wk, wv in value.items():
                    if wk not in {f.name for f in dataclasses.fields(ScoreWeights)}:
                        problems.append(f"settings file: unknown weight {wk!r}")
                    elif finite(wv):
                        weights[wk] = float(wv)
                    else:
                        problems.append(f"settings file: weight {wk} must be a number")
            elif key in _FIELD_TYPES:
                values[key] = _coerce(key, value, problems)
            else:
                problems.append(f"settings file: unknown setting {key!r}")
    for name in _FIELD_TYPES:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw:
            values[name] = _coerce(name, raw, problems)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = _coerce(name, value, problems)
    # Every problem at once: what could not be read, and what is wrong with the rest.
    settings = ExtenderSettings(
        **{k: v for k, v in values.items() if v is not None}, weights=ScoreWeights(**weights)
    )
    problems += settings.validate()
    if problems:
        raise InvalidInput(problems)
    return settings
