"""The object and annotation contract: one place for every name users and components share. Pure.

README.md's "Pod annotations" and docs/reference.md's objects document these; change them
together.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "tidelease.io"

# --- pod annotations written by pod authors (or by tidelease controllers on their behalf) ---
ANN_PRIORITY: Final = f"{PREFIX}/priority"  # high | low (default low)
ANN_OWNER: Final = f"{PREFIX}/owner"  # the job a pod belongs to (DNS-1123 subdomain)
ANN_RELIABILITY: Final = f"{PREFIX}/reliability"  # HA | MA | LA (default LA: any tier)
ANN_GPU_TYPE: Final = f"{PREFIX}/gpu-type"  # e.g. NVIDIA-H100-80GB (default: any type)
ANN_RECLAIM: Final = f"{PREFIX}/reclaim"  # "true" when the pod takes back lent devices
ANN_CHECKPOINT: Final = f"{PREFIX}/checkpoint"  # checkpoint id the pod loads at start
ANN_JOB_CLASS: Final = f"{PREFIX}/job-class"  # interactive | batch (default batch); planner
# "true": a borrower that takes lent GPUs only (never untagged ones); a restriction, it grants
# nothing. Kueue's admission check writes it on the pods of the workloads it admits.
ANN_LENT_ONLY: Final = f"{PREFIX}/lent-only"
# The loosest link allowed between any two of the pod's GPUs: nvlink | pcie-switch | host-bridge
# | numa-node (common.topology.REQUIREMENTS; default: any). A restriction, it grants nothing.
ANN_GPU_TOPOLOGY: Final = f"{PREFIX}/gpu-topology"
ANN_ELASTIC: Final = f"{PREFIX}/elastic"  # "false": fixed GPU count, preempted whole
ANN_THROUGHPUT: Final = f"{PREFIX}/throughput"  # samples/s at 1, 2, ... GPUs: "100,190,270"

# --- the shared queues live (docs/planner.md "Shared queues live") ---
ANN_WORKLOAD: Final = f"{PREFIX}/workload"  # Deployment/NAME: what the queues scale
ANN_MAX_REPLICAS: Final = f"{PREFIX}/max-replicas"  # the most replicas that workload grows to
SCHEDULING_GATE: Final = f"{PREFIX}/queue"  # on class-declaring GPU pods until released
# DRA mode: on an online job's pods until the leasing controller pinned its claim (docs/dra.md).
RECLAIM_GATE: Final = f"{PREFIX}/reclaim"
ANN_QUEUE: Final = f"{PREFIX}/queue"  # by the queues controller: the job's MLFQ queue, 1-3
ANN_QUEUE_REASON: Final = f"{PREFIX}/queue-reason"  # why the job is in that queue
# By the queues controller, with the gate's removal: its proof of the release, an HMAC of the
# pod's UID under the chart's key (common/queuerelease.py); the extender places no pod without.
ANN_QUEUE_RELEASED: Final = f"{PREFIX}/queue-released"
ANN_THROUGHPUT_QUERY: Final = f"{PREFIX}/throughput-query"  # PromQL: job's samples/s; on pods
ANN_THROUGHPUT_MEASURED: Final = f"{PREFIX}/throughput-measured"  # by the queues, on workload

# --- gangs: pods that run together or not at all (docs/gangs.md) ---
# A gang of the pod's own namespace, where the Workload API (spec.workloadRef) is not in use.
ANN_POD_GROUP: Final = f"{PREFIX}/pod-group"
# When the pod last saved its work (RFC 3339): the newest checkpoint is the cheapest victim.
ANN_CHECKPOINTED_AT: Final = f"{PREFIX}/checkpointed-at"

# --- pod annotations written by tidelease ---
ANN_DEVICES: Final = f"{PREFIX}/devices"  # comma-separated GPU UUIDs chosen at bind time
ANN_DEVICE_NODE: Final = f"{PREFIX}/devices-node"  # the node those devices are on
ANN_DEVICES_ASSIGNED: Final = f"{PREFIX}/devices-assigned"  # set by the device plugin: "true"
ANN_RECLAIM_NOTICE: Final = f"{PREFIX}/reclaim-notice"  # on a borrower: evicted after this time

# --- hot restart in place (docs/hot-restart.md) ---
ANN_HOT_RESTART: Final = f"{PREFIX}/hot-restart"  # "true": image changes restart in place
ANN_HOT_RESTART_IMAGE: Final = f"{PREFIX}/hot-restart-image"  # <container>=<image>, by the user
ANN_HOT_RESTART_REQUEST: Final = f"{PREFIX}/hot-restart-request"  # JSON, by the operator
ANN_HOT_RESTART_STATUS: Final = f"{PREFIX}/hot-restart-status"  # JSON, by the node agent

# --- prewarming ahead of a predicted scale-up (docs/hot-restart.md "Prewarming") ---
# On an online job's pod template, for the prelaunch window W (bytes; default: the settings').
ANN_IMAGE_BYTES: Final = f"{PREFIX}/image-bytes"  # total size of the template's images
ANN_CHECKPOINT_BYTES: Final = f"{PREFIX}/checkpoint-bytes"  # size of its checkpoint

# --- topology-aware orchestration (docs/orchestration.md) ---
LABEL_ORCHESTRATION: Final = f"{PREFIX}/orchestration"  # "job" on a job's ConfigMap
ANN_ORCHESTRATION_RECORDS: Final = f"{PREFIX}/orchestration-records"  # JSON, by the controller
LABEL_JOB: Final = f"{PREFIX}/job"  # on a job's pods: the job's name
LABEL_ROLE: Final = f"{PREFIX}/role"  # on a job's pods: launcher, worker, head, ...

# --- the live elastic planner, on a GpuLease (docs/planner.md "Live planner") ---
ANN_PLANNER: Final = f"{PREFIX}/planner"  # "true": the planner writes spec.desiredGPUs
ANN_PLANNER_TRAFFIC_QUERY: Final = f"{PREFIX}/planner-traffic-query"  # PromQL: input samples/s
ANN_PLANNER_WORKERS_QUERY: Final = f"{PREFIX}/planner-workers-query"  # PromQL: workers running
ANN_PLANNER_THROUGHPUT_QUERY: Final = f"{PREFIX}/planner-throughput-query"  # PromQL: samples/s
ANN_PLANNER_LAG_QUERY: Final = f"{PREFIX}/planner-lag-query"  # PromQL: lag, seconds (optional)
ANN_PLANNER_BACKLOG_QUERY: Final = f"{PREFIX}/planner-backlog-query"  # PromQL: samples waiting
ANN_PLANNER_LEAD_SECONDS: Final = f"{PREFIX}/planner-lead-seconds"  # prelaunch window W
ANN_PLANNER_FORM: Final = f"{PREFIX}/planner-form"  # sync | async (default sync)

# --- custom resources ---
GROUP: Final = PREFIX
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND_GPU_NODE: Final = "GpuNode"
# GpuNode status condition written by the node agent: True when every device is Healthy.
CONDITION_DEVICES_HEALTHY: Final = "DevicesHealthy"
PLURAL_GPU_NODE: Final = "gpunodes"
KIND_GPU_ALLOCATION: Final = "GpuAllocation"
PLURAL_GPU_ALLOCATION: Final = "gpuallocations"
KIND_GPU_LEASE: Final = "GpuLease"
PLURAL_GPU_LEASE: Final = "gpuleases"

# --- the node agent's heartbeat: a coordination.k8s.io Lease per node ---
AGENT_LEASE_PREFIX: Final = "tidelease-agent-"  # Lease name: tidelease-agent-<node>
AGENT_LABEL_KEY: Final = "app.kubernetes.io/name"
AGENT_LABEL_VALUE: Final = "tidelease-agent"
DEFAULT_AGENT_NAMESPACE: Final = "tidelease-system"

# --- resources ---
DEFAULT_GPU_RESOURCE: Final = "nvidia.com/gpu"
# Kueue (docs/kueue.md): the controllerName of tidelease's AdmissionChecks, and the check's
# name the example and the chart use (extender.controllers.kueueChecks).
KUEUE_CONTROLLER_NAME: Final = f"{PREFIX}/lent-gpus"
KUEUE_CHECK: Final = "tidelease-lent-gpus"
# On a GpuNode, by the Kueue check: its lent devices kept for admitted workloads not placed yet
# (common/keptmarks.py).
ANN_KEPT_FOR_KUEUE: Final = f"{PREFIX}/kept-for-kueue"

# --- Kubernetes' own annotations tidelease writes (a pod author may write them too) ---
# A ReplicaSet scaling down removes the pods of lowest cost first. The leasing controller sets it
# on the pods of a Deployment whose devices a scale-down lends, so that exactly those go.
ANN_POD_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
