"""Typed values shared by the extender and the node agent. Pure.

Everything here is plain data: frozen dataclasses, enums and ``NewType`` ids. Parsing from
Kubernetes objects lives in :mod:`common.objects` and :mod:`common.podrequest`; decisions live in
``extender.scheduler.placement`` and friends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple, NewType

from common.topology import Link, NodeTopology

NodeName = NewType("NodeName", str)
GpuUuid = NewType("GpuUuid", str)
PodUid = NewType("PodUid", str)
# A job's identity: "namespace/job" (common.tenancy.job_key). Owners are namespaced jobs, so a
# pod is "own" only to devices its namespace's job lent.
JobKey = NewType("JobKey", str)


class Tier(enum.IntEnum):
    """Reliability tier of a device, from its availability over the accounting window.

    Ordered so that ``Tier.HA > Tier.MA > Tier.LA``: a device satisfies a requirement ``r`` when
    ``device.tier >= r``.
    """

    LA = 1  # below 97 % available
    MA = 2  # 97 % up to 100 %
    HA = 3  # 100 %


class Health(enum.Enum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class Priority(enum.Enum):
    """tidelease's two priority classes: high-priority (HP) jobs, such as online training, are
    never preempted; low-priority (LP) jobs may be, to give GPUs back to HP jobs (weflex 3.5)."""

    HIGH = "high"
    LOW = "low"


class DeviceClass(NamedTuple):
    """What placement needs to know of a device, apart from its identity.

    Devices with the same class are interchangeable for placement (which devices a pod may
    take: weflex Algorithm 1), which lets a node summarise its devices as counts per class. A
    NamedTuple, so that hashing and comparing (the hot path of every filter call) run in C.
    """

    gpu_type: str
    tier: Tier
    healthy: bool
    owner: JobKey | None = None  # right-of-return tag: the job ("namespace/job") that lent it
    standby: bool = False  # reserved to backfill reclaims
    # The replica (lent group) of the owner that lent this device and takes it back; None for a
    # device tagged with the job alone (any of its replicas may take it back).
    replica: str | None = None


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU, identified by (node, index, type) and by its UUID."""

    node: NodeName
    index: int
    uuid: GpuUuid
    cls: DeviceClass

    @property
    def gpu_type(self) -> str:
        return self.cls.gpu_type

    @property
    def tier(self) -> Tier:
        return self.cls.tier


@dataclass(frozen=True, slots=True)
class Holder:
    """The pod a device is allocated to, as recorded in the allocation ledger."""

    pod_uid: PodUid
    namespace: str
    name: str
    priority: Priority
    pod_priority: int  # the pod's spec.priority (PriorityClass value)
    owner: JobKey | None = None
    gang: str | None = None  # its gang (common.gangs.gang_of): evicted together

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What a pod asks of tidelease, parsed once from its spec and annotations."""

    namespace: str
    name: str
    uid: PodUid
    gpus: int
    priority: Priority = Priority.LOW
    pod_priority: int = 0
    owner: JobKey | None = None
    min_tier: Tier = Tier.LA
    gpu_type: str | None = None
    # Set by the cluster view (ClusterState.with_reclaim), never by the pod: its namespace's
    # GpuLease for its owner is reclaiming and the pod belongs to the lease's workload.
    reclaim: bool = False
    # The lent group this pod takes back (a StatefulSet replica's own name, set while its
    # lease reclaims): it may use only the owner's devices tagged for this replica. None: any
    # group its lease takes back (``lent_groups``: a Deployment's pods have no identity across
    # scale-ups, they take the groups back as a set), or, with none named, any of the owner's.
    lent_group: str | None = None
    lent_groups: frozenset[str] = frozenset()
    # Set by the cluster view with ``reclaim``: the lease's reclaim is Degraded ReclaimOverdue,
    # so its pods stop waiting for their groups' nodes (extender.scheduler.returning).
    reclaim_overdue: bool = False
    checkpoint: str | None = None
    images: frozenset[str] = field(default_factory=frozenset)
    # Jobs whose lease is reclaiming now (set by the cluster view, not by the pod): a borrower
    # may not take the devices they lent, or its replacement would take them back from under
    # the reclaim every time one is evicted.
    reclaiming_owners: frozenset[JobKey] = frozenset()
    # The pod's controlling owner reference (kind, name), e.g. ("StatefulSet", "recsys"):
    # what ties it to a GpuLease's workload.
    controller: tuple[str, str] | None = None
    priority_class: str = ""  # spec.priorityClassName
    # tidelease.io/lent-only: a borrower that takes devices lent by online jobs only (Kueue's
    # workloads admitted against lent capacity, extender.kueue); a restriction, no privilege.
    lent_only: bool = False
    # The pod's gang (common.gangs.gang_of), None when it runs alone: a gang's pods are placed
    # together or not at all, and evicted together.
    gang: str | None = None
    # tidelease.io/gpu-topology: the loosest link allowed between any two of its GPUs (None:
    # any); a restriction, no privilege (extender.scheduler.placement.topology_refusal).
    gpu_topology: Link | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def holder(self) -> Holder:
        return Holder(
            pod_uid=self.uid,
            namespace=self.namespace,
            name=self.name,
            priority=self.priority,
            pod_priority=self.pod_priority,
            owner=self.owner,
            gang=self.gang,
        )


class NodeCache(NamedTuple):
    """What a node holds locally: checkpoints and container images. A job restarted on a node
    that holds both skips their download and starts in seconds (weflex 3.3)."""

    images: frozenset[str] = frozenset()
    checkpoints: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node's devices and cache, as published by its agent and tagged by the controller."""

    node: NodeName
    devices: tuple[Device, ...]
    cache: NodeCache = field(default_factory=NodeCache)
    # How its devices are connected (status.topology), None when its agent published none.
    topology: NodeTopology | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    """Devices on one node held by one pod: an entry of that node's allocation ledger."""

    holder: Holder
    devices: tuple[GpuUuid, ...]
    since: str = ""  # RFC 3339 time the allocation was recorded
