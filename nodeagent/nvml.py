"""GPU discovery and sampling through NVML, behind a small interface.

:class:`NvmlReader` calls NVIDIA's ``nvidia-ml-py`` binding (the ``pynvml`` module it installs)
or anything with the same functions: :mod:`nodeagent.nvmlfake` is such a module, with the real
binding's error classes, so tests run this very code. :class:`NullReader` serves a node without
GPUs (or without a driver): no devices, and the agent keeps running.

Every call is blocking; the agent runs them in a thread. Per-call failures never escape as
exceptions from :meth:`NvmlReader.sample`: each reading records what failed, and NOT_SUPPORTED
means "this check does not apply to this device", not a fault.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import pynvml

log = logging.getLogger(__name__)

NVMLError = pynvml.NVMLError
ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str  # model name, e.g. "NVIDIA H20"
    minor: int  # /dev/nvidia<minor>


@dataclass(frozen=True, slots=True)
class XidEvent:
    uuid: str
    xid: int


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of a device's health signals. ``None``: not supported on this device."""

    uuid: str
    lost: bool = False
    ecc_uncorrected_volatile: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    retired_pages_pending: bool | None = None
    clock_event_reasons: int | None = None
    errors: tuple[str, ...] = field(default=())  # failed calls other than NOT_SUPPORTED


class GpuReader(Protocol):
    def devices(self) -> list[GpuInfo]: ...

    def sample(self, uuid: str) -> Sample: ...

    def wait_events(self, timeout_ms: int) -> list[XidEvent]:
        """Critical XID events, waiting at most ``timeout_ms`` for the first."""
        ...

    def close(self) -> None: ...


class NullReader:
    """A node without GPUs: nothing to report, nothing to fail."""

    def devices(self) -> list[GpuInfo]:
        return []

    def sample(self, uuid: str) -> Sample:
        return Sample(uuid=uuid, errors=("no such device",))

    def wait_events(self, timeout_ms: int) -> list[XidEvent]:
        return []

    def close(self) -> None:
        pass


def _handle_key(handle: Any) -> int:
    """A device handle's identity: the pointer value for the real binding's ctypes handles."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads GPUs through an NVML binding module (``pynvml`` or :mod:`nodeagent.nvmlfake`)."""

    def __init__(self, lib: ModuleType | Any = pynvml) -> None:
        self._nvml = lib
        self._nvml.nvmlInit()
        self._handles: dict[str, Any] = {}
        self._events: Any = None
        infos = self.devices()
        try:
            self._events = self._nvml.nvmlEventSetCreate()
        except NVMLError as e:
            log.warning("NVML event set unavailable (%s): no XID events will be seen", e)
        for info in infos:
            self._register_events(info.uuid)

    def _register_events(self, uuid: str) -> None:
        if self._events is None:
            return
        try:
            self._nvml.nvmlDeviceRegisterEvents(
                self._handles[uuid], self._nvml.nvmlEventTypeXidCriticalError, self._events
            )
        except NVMLError as e:
            log.warning("device %s: cannot watch XID events: %s", uuid, e)

    def devices(self) -> list[GpuInfo]:
        nvml = self._nvml
        found: list[GpuInfo] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                name = _text(nvml.nvmlDeviceGetName(handle))
                minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            except NVMLError as e:
                log.error("GPU %d cannot be read, leaving it out: %s", index, e)
                continue
            self._handles[uuid] = handle
            found.append(GpuInfo(index=index, uuid=uuid, name=name, minor=minor))
        return found

    def _call(self, sample: dict[str, Any], fn: str, *args: Any) -> Any:
        """One NVML call for a sample field; records failures instead of raising."""
        try:
            return getattr(self._nvml, fn)(*args)
        except NVMLError as e:
            if e.value == ERROR_NOT_SUPPORTED:
                return None
            if e.value == ERROR_GPU_IS_LOST:
                sample["lost"] = True
            sample["errors"].append(f"{fn}: {e}")
            return None

    def sample(self, uuid: str) -> Sample:
        handle = self._handles.get(uuid)
        if handle is None:
            return Sample(uuid=uuid, errors=("unknown device",))
        nvml = self._nvml
        s: dict[str, Any] = {"lost": False, "errors": []}
        ecc = self._call(
            s,
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        rows = self._call(s, "nvmlDeviceGetRemappedRows", handle)
        pages = self._call(s, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        clocks = self._call(s, "nvmlDeviceGetCurrentClocksEventReasons", handle)
        return Sample(
            uuid=uuid,
            lost=s["lost"],
            ecc_uncorrected_volatile=None if ecc is None else int(ecc),
            remap_pending=None if rows is None else bool(rows[2]),
            remap_failed=None if rows is None else bool(rows[3]),
            retired_pages_pending=(None if pages is None else pages == nvml.NVML_FEATURE_ENABLED),
            clock_event_reasons=None if clocks is None else int(clocks),
            errors=tuple(s["errors"]),
        )

    def wait_events(self, timeout_ms: int) -> list[XidEvent]:
        if self._events is None:
            return []
        uuid_of = {_handle_key(h): u for u, h in self._handles.items()}
        events: list[XidEvent] = []
        wait = timeout_ms
        while True:
            try:
                data = self._nvml.nvmlEventSetWait_v2(self._events, wait)
            except NVMLError as e:
                if e.value != ERROR_TIMEOUT:
                    log.warning("waiting for NVML events failed: %s", e)
                return events
            if data.eventType == self._nvml.nvmlEventTypeXidCriticalError:
                uuid = uuid_of.get(_handle_key(data.device)) or self._uuid_of_handle(data.device)
                events.append(XidEvent(uuid=uuid, xid=int(data.eventData)))
            wait = 0  # drain what is already queued, then return

    def _uuid_of_handle(self, handle: Any) -> str:
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(handle))
        except NVMLError:
            return ""  # an event for a device we cannot name: it applies to none we track

    def close(self) -> None:
        try:
            if self._events is not None:
                self._nvml.nvmlEventSetFree(self._events)
            self._nvml.nvmlShutdown()
        except NVMLError as e:
            log.warning("NVML shutdown: %s", e)


def open_reader(backend: str) -> GpuReader:
    """``nvml``: the real driver (falls back to no GPUs if it cannot load); ``null``: none."""
    if backend == "null":
        return NullReader()
    try:
        return NvmlReader(pynvml)
    except NVMLError as e:
        log.warning("NVML unavailable (%s): running without GPUs", e)
        return NullReader()
