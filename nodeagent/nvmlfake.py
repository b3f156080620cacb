"""A faithful stand-in for the NVML library, for tests and for GPU-less demos.

:class:`FakeNvml` has the functions of the ``pynvml`` module that tidelease uses, with the same
signatures, return shapes and the binding's own :class:`pynvml.NVMLError` subclasses (raised by
code, e.g. ``NVMLError_GpuIsLost``), so :class:`nodeagent.nvml.NvmlReader` runs unchanged on it.
What it models:

* init/shutdown (calls before ``nvmlInit`` fail with UNINITIALIZED; a missing driver fails init);
* per device and per call: NOT_SUPPORTED, or any other error code, injected at will;
* a lost GPU: every call on it fails with GPU_IS_LOST;
* critical XID events with their data, delivered only to devices registered on an event set,
  through a blocking ``nvmlEventSetWait_v2`` that times out with NVML_ERROR_TIMEOUT;
* volatile uncorrectable ECC counters, remapped rows (pending, failure), retired pages pending,
  clock-event (throttle) reason bits;
* topology: PCI bus ids, NUMA nodes, the PCIe tree (``nvmlDeviceGetTopologyCommonAncestor``) and
  NVLinks, each to a peer GPU or to an NVSwitch. A device placed in no layout answers
  NOT_SUPPORTED to the topology calls (and has no NVLink), as the fake always did.

Named factories build devices: :func:`full_gpu`, :func:`lost_gpu`, :func:`gpu_without_ecc`; and
whole nodes laid out as common servers are (:data:`LAYOUTS`, :func:`layout`):

* ``nvswitch-8``: 8 GPUs all on NVSwitches (18 links each), 2 NUMA nodes (GPUs 0-3, 4-7), 4
  PCIe switches (GPUs 0-1, 2-3, 4-5, 6-7), each below a host bridge of its own;
* ``pcie-2socket-8``: 8 PCIe GPUs without NVLink, 2 sockets (GPUs 0-3, 4-7) with one host bridge
  each, 2 PCIe switches per socket, 2 GPUs per switch;
* ``nvlink-pairs-4``: 4 GPUs, NVLink pairs 0-1 and 2-3 (4 links each), the pairs on different
  PCIe switches (each below a host bridge of its own) of one socket.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pynvml

NVMLError = pynvml.NVMLError

# constants the binding exposes and callers read from the module
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
NVML_NVLINK_DEVICE_TYPE_GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
NVML_TOPOLOGY_INTERNAL = pynvml.NVML_TOPOLOGY_INTERNAL
NVML_TOPOLOGY_SINGLE = pynvml.NVML_TOPOLOGY_SINGLE
NVML_TOPOLOGY_MULTIPLE = pynvml.NVML_TOPOLOGY_MULTIPLE
NVML_TOPOLOGY_HOSTBRIDGE = pynvml.NVML_TOPOLOGY_HOSTBRIDGE
NVML_TOPOLOGY_NODE = pynvml.NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = pynvml.NVML_TOPOLOGY_SYSTEM

# An NVLink's far end in FakeGpu.nvlinks: this, or a peer GPU's PCI bus id; None: link down.
NVSWITCH = "nvswitch"


@dataclass(frozen=True)
class FakePlace:
    """Where a device sits in its node's PCIe tree (ids are the layout's own numbers)."""

    numa_node: int | None  # None: NVML answers NOT_SUPPORTED for it
    host_bridge: int
    pcie_switch: int | None = None  # None: straight below the host bridge


@dataclass
class FakeGpu:
    """One device's state; tests change the fields to make things happen."""

    uuid: str
    name: str = "NVIDIA H20"
    minor: int = 0
    lost: bool = False
    ecc_uncorrected_volatile: int = 0
    rows_corrected: int = 0
    rows_uncorrected: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    retired_pages_pending: bool = False
    clock_event_reasons: int = 0
    unsupported: set[str] = field(default_factory=set)  # function names answering NOT_SUPPORTED
    failures: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    pci_bus_id: str = ""  # "00000000:BB:00.0"; full_gpu gives one from the index
    place: FakePlace | None = None  # None: no topology (NOT_SUPPORTED)
    # One entry per NVLink, by link number: NVSWITCH, a peer's pci_bus_id, or None (down).
    nvlinks: list[str | None] = field(default_factory=list)


def bus_id(bus: int, domain: int = 0) -> str:
    """An NVML PCI bus id (``busId``): 8 hex digits of domain, bus, device 0, function 0."""
    return f"{domain:08X}:{bus:02X}:00.0"


def full_gpu(index: int = 0, name: str = "NVIDIA H20") -> FakeGpu:
    """A healthy device with every feature supported (topology apart: see :func:`layout`)."""
    return FakeGpu(
        uuid=f"GPU-fake-{index:04d}-0000-0000-000000000000",
        name=name,
        minor=index,
        pci_bus_id=bus_id(0x10 + 0x10 * index),
    )


def lost_gpu(index: int = 0) -> FakeGpu:
    gpu = full_gpu(index)
    gpu.lost = True
    return gpu


def gpu_without_ecc(index: int = 0) -> FakeGpu:
    """A consumer-grade device: no ECC, no row remapping, no page retirement."""
    gpu = full_gpu(index, name="NVIDIA GeForce RTX 4090")
    gpu.unsupported |= {
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPagesPendingStatus",
    }
    return gpu


def _placed(gpus: list[FakeGpu], places: list[FakePlace]) -> list[FakeGpu]:
    for gpu, place in zip(gpus, places, strict=True):
        gpu.place = place
    return gpus


def _nvswitch_8(name: str) -> list[FakeGpu]:
    gpus = [full_gpu(i, name) for i in range(8)]
    for gpu in gpus:
        gpu.nvlinks = [NVSWITCH] * 18
    return _placed(gpus, [FakePlace(i // 4, i // 2, i // 2) for i in range(8)])


def _pcie_2socket_8(name: str) -> list[FakeGpu]:
    gpus = [full_gpu(i, name) for i in range(8)]
    return _placed(gpus, [FakePlace(i // 4, i // 4, i // 2) for i in range(8)])


def _nvlink_pairs_4(name: str) -> list[FakeGpu]:
    gpus = [full_gpu(i, name) for i in range(4)]
    for a, b in ((0, 1), (2, 3)):
        gpus[a].nvlinks = [gpus[b].pci_bus_id] * 4
        gpus[b].nvlinks = [gpus[a].pci_bus_id] * 4
    return _placed(gpus, [FakePlace(0, i // 2, i // 2) for i in range(4)])


LAYOUTS = {
    "nvswitch-8": _nvswitch_8,
    "pcie-2socket-8": _pcie_2socket_8,
    "nvlink-pairs-4": _nvlink_pairs_4,
}


def layout(name: str, gpu_name: str = "NVIDIA H20") -> list[FakeGpu]:
    """The GPUs of a node laid out as ``name`` (one of :data:`LAYOUTS`), indexes from 0."""
    try:
        return LAYOUTS[name](gpu_name)
    except KeyError:
        raise ValueError(f"no fake layout {name!r}: one of {', '.join(LAYOUTS)}") from None


@dataclass
class PciInfo:
    """The fields of pynvml.nvmlPciInfo_t that callers read (its busId is text, as there)."""

    busId: str
    domain: int
    bus: int
    device: int = 0


def _pci_info(bus: str) -> PciInfo:
    domain, bus_number, _ = bus.split(":")
    return PciInfo(bus, int(domain, 16), int(bus_number, 16))


def common_ancestor(a: FakePlace, b: FakePlace) -> int:
    """NVML's topology level of two devices placed at ``a`` and ``b``."""
    if a.host_bridge == b.host_bridge:
        if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
            return int(NVML_TOPOLOGY_SINGLE)
        return int(NVML_TOPOLOGY_HOSTBRIDGE)
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return int(NVML_TOPOLOGY_NODE)
    return int(NVML_TOPOLOGY_SYSTEM)


@dataclass
class EventData:
    """Same fields as pynvml.c_nvmlEventData_t."""

    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(eq=False)
class _Handle:
    gpu: FakeGpu


@dataclass(eq=False)
class _EventSet:
    registered: set[str] = field(default_factory=set)
    queue: list[EventData] = field(default_factory=list)


def _error(code: int) -> Exception:
    """The binding's own exception for an NVML return code (its subclass for that code)."""
    error: Exception = NVMLError(code)
    return error


class FakeNvml:
    """Module-like: pass it where the ``pynvml`` module is expected."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS
    NVML_NVLINK_DEVICE_TYPE_GPU = NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_TOPOLOGY_INTERNAL = NVML_TOPOLOGY_INTERNAL
    NVML_TOPOLOGY_SINGLE = NVML_TOPOLOGY_SINGLE
    NVML_TOPOLOGY_MULTIPLE = NVML_TOPOLOGY_MULTIPLE
    NVML_TOPOLOGY_HOSTBRIDGE = NVML_TOPOLOGY_HOSTBRIDGE
    NVML_TOPOLOGY_NODE = NVML_TOPOLOGY_NODE
    NVML_TOPOLOGY_SYSTEM = NVML_TOPOLOGY_SYSTEM

    def __init__(self, gpus: list[FakeGpu] | None = None, *, driver_loaded: bool = True) -> None:
        self.gpus = list(gpus if gpus is not None else [full_gpu(i) for i in range(8)])
        self.driver_loaded = driver_loaded
        self.initialized = 0
        self.calls = 0
        self._sets: list[_EventSet] = []
        self._cond = threading.Condition()
        self._handles: dict[int, _Handle] = {}  # one stable handle per device, as in NVML

    # --- test controls ---
    def gpu(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def inject_xid(self, index: int, xid: int) -> None:
        """A critical XID on a device, as the driver reports it."""
        gpu = self.gpus[index]
        with self._cond:
            for s in self._sets:
                if gpu.uuid in s.registered:
                    s.queue.append(EventData(self._handle(gpu), nvmlEventTypeXidCriticalError, xid))
            self._cond.notify_all()

    def _handle(self, gpu: FakeGpu) -> _Handle:
        handle = self._handles.get(id(gpu))
        if handle is None:
            handle = self._handles[id(gpu)] = _Handle(gpu)
        return handle

    # --- the binding's functions ---
    def _ready(self) -> None:
        self.calls += 1
        if not self.initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: _Handle, fn: str) -> FakeGpu:
        self._ready()
        gpu = handle.gpu
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if fn in gpu.failures:
            raise _error(gpu.failures[fn])
        return gpu

    def nvmlInit(self) -> None:
        if not self.driver_loaded:
            raise _error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._ready()
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._ready()
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self._handle(gpu)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        return self._device(handle, "nvmlDeviceGetMinorNumber").minor

    def nvmlDeviceGetTotalEccErrors(
        self, handle: _Handle, error_type: int, counter_type: int
    ) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTotalEccErrors")
        if error_type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED or counter_type != NVML_VOLATILE_ECC:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc_uncorrected_volatile

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        gpu = self._device(handle, "nvmlDeviceGetRemappedRows")
        return (
            gpu.rows_corrected,
            gpu.rows_uncorrected,
            int(gpu.remap_pending),
            int(gpu.remap_failed),
        )

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        gpu = self._device(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        return int(NVML_FEATURE_ENABLED if gpu.retired_pages_pending else NVML_FEATURE_DISABLED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_event_reasons

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> PciInfo:
        return _pci_info(self._device(handle, "nvmlDeviceGetPciInfo").pci_bus_id)

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        gpu = self._device(handle, "nvmlDeviceGetNumaNodeId")
        if gpu.place is None or gpu.place.numa_node is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.place.numa_node

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: _Handle, handle2: _Handle) -> int:
        a = self._device(handle1, "nvmlDeviceGetTopologyCommonAncestor")
        b = self._device(handle2, "nvmlDeviceGetTopologyCommonAncestor")
        if a.place is None or b.place is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if a is b:
            return int(NVML_TOPOLOGY_INTERNAL)
        return common_ancestor(a.place, b.place)

    def _nvlink(self, handle: _Handle, link: int, fn: str) -> str | None:
        """The far end of one NVLink (None: down); NOT_SUPPORTED without NVLink, and
        INVALID_ARGUMENT past the device's links, as NVML answers."""
        gpu = self._device(handle, fn)
        if not gpu.nvlinks:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < min(len(gpu.nvlinks), NVML_NVLINK_MAX_LINKS):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        far = self._nvlink(handle, link, "nvmlDeviceGetNvLinkState")
        return int(NVML_FEATURE_ENABLED if far is not None else NVML_FEATURE_DISABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        far = self._nvlink(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        if far is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # nothing answers on a link down
        kind = NVML_NVLINK_DEVICE_TYPE_SWITCH if far == NVSWITCH else NVML_NVLINK_DEVICE_TYPE_GPU
        return int(kind)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> PciInfo:
        far = self._nvlink(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        if far is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if far == NVSWITCH:  # the switch's own PCI id, which no GPU of the node has
            return _pci_info(bus_id(0xFF))
        return _pci_info(far)

    def nvmlEventSetCreate(self) -> _EventSet:
        self._ready()
        s = _EventSet()
        with self._cond:
            self._sets.append(s)
        return s

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._ready()
        with self._cond:
            self._sets.remove(event_set)

    def nvmlDeviceRegisterEvents(
        self, handle: _Handle, event_types: int, event_set: _EventSet
    ) -> None:
        gpu = self._device(handle, "nvmlDeviceRegisterEvents")
        if event_types & nvmlEventTypeXidCriticalError:
            event_set.registered.add(gpu.uuid)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> EventData:
        self._ready()
        with self._cond:
            if not event_set.queue and timeout_ms > 0:
                self._cond.wait_for(lambda: bool(event_set.queue), timeout_ms / 1000)
            if not event_set.queue:
                raise _error(pynvml.NVML_ERROR_TIMEOUT)
            return event_set.queue.pop(0)
