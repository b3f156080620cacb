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
  clock-event (throttle) reason bits.

Named factories build devices: :func:`full_gpu`, :func:`lost_gpu`, :func:`gpu_without_ecc`.
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


def full_gpu(index: int = 0, name: str = "NVIDIA H20") -> FakeGpu:
    """A healthy device with every feature supported."""
    return FakeGpu(uuid=f"GPU-fake-{index:04d}-0000-0000-000000000000", name=name, minor=index)


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
