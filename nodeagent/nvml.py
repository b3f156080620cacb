"""GPU discovery and sampling through NVML, behind a small interface.

:class:`NvmlReader` calls NVIDIA's ``nvidia-ml-py`` binding (the ``pynvml`` module it installs)
or anything with the same functions: :mod:`nodeagent.nvmlfake` is such a module, with the real
binding's error classes, so tests run this very code. :class:`NullReader` serves a node without
GPUs (or without a driver): no devices, and the agent keeps running.

Every call is blocking; the agent runs them in a thread. Per-call failures never escape as
exceptions from :meth:`NvmlReader.sample` or :meth:`NvmlReader.topology`: each reading records
what failed, and NOT_SUPPORTED means "this check does not apply to this device", not a fault.

:meth:`NvmlReader.topology` reads how the GPUs are connected (:mod:`common.topology`): each
pair's PCIe level (``nvmlDeviceGetTopologyCommonAncestor``), its NVLinks (each active link's far
end: a peer GPU, matched by PCI bus id, or an NVSwitch, through which every two GPUs on the
switch are linked), each device's NUMA node (``nvmlDeviceGetNumaNodeId``, where the binding and
driver have it, else sysfs) and PCIe root complex. The root comes from sysfs (``pci<domain>:<bus>``,
as Kubernetes' own helper finds it) when the reader is given one; otherwise it is derived from
NVML, ``nvml:<lowest bus id>`` of the devices below one host bridge, equal for the devices of one
root complex but in no upstream form.
"""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import pynvml

from common.topology import (
    Link,
    NodeTopology,
    PairLink,
    Placement,
    is_upstream_pcie_root,
    make,
    pair,
)

log = logging.getLogger(__name__)

NVMLError = pynvml.NVMLError
ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT

# NVML's topology levels (nvmlGpuTopologyLevel_t) as links; INTERNAL (one board) is the tightest
# PCIe level.
PCIE_LEVELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: Link.SAME_PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_SINGLE: Link.SAME_PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_MULTIPLE: Link.SAME_PCIE_SWITCH,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: Link.SAME_HOST_BRIDGE,
    pynvml.NVML_TOPOLOGY_NODE: Link.SAME_NUMA_NODE,
    pynvml.NVML_TOPOLOGY_SYSTEM: Link.ACROSS_SOCKETS,
}


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


@dataclass(frozen=True, slots=True)
class TopologyReading:
    """How the devices are connected (None: nothing could be learnt) and the calls that failed
    (other than NOT_SUPPORTED)."""

    topology: NodeTopology | None
    errors: tuple[str, ...] = ()


class GpuReader(Protocol):
    def devices(self) -> list[GpuInfo]: ...

    def sample(self, uuid: str) -> Sample: ...

    def topology(self) -> TopologyReading:
        """How the devices :meth:`devices` found are connected."""
        ...

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

    def topology(self) -> TopologyReading:
        return TopologyReading(None)

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


def _bus(value: Any) -> str:
    """A PCI bus id in one form (NVML's text, upper case), to compare ids from two calls."""
    return _text(value).strip().upper()


def sysfs_name(bus_id: str) -> str:
    """The sysfs name of an NVML bus id: "00000000:1B:00.0" -> "0000:1b:00.0"."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def sysfs_pcie_root(sysfs: Path, bus_id: str) -> str | None:
    """The root complex ``pci<domain>:<bus>`` above a PCI device, from where its sysfs entry
    leads (``/sys/devices/pci0000:15/0000:15:01.0/.../0000:1b:00.0``); None when not found."""
    try:
        real = (sysfs / "bus" / "pci" / "devices" / sysfs_name(bus_id)).resolve(strict=True)
    except (OSError, ValueError):
        return None
    return next((part for part in real.parts if is_upstream_pcie_root(part)), None)


def sysfs_numa_node(sysfs: Path, bus_id: str) -> int | None:
    """A PCI device's NUMA node from sysfs; None when unknown (the kernel writes -1)."""
    try:
        text = (sysfs / "bus" / "pci" / "devices" / sysfs_name(bus_id) / "numa_node").read_text()
        node = int(text.strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


@dataclass
class _NvLinks:
    """One device's active NVLinks: how many to each peer (by bus id), how many to NVSwitches."""

    peers: Counter[str] = field(default_factory=Counter)
    switch: int = 0


def _roots_from_levels(buses: dict[int, str], levels: dict[tuple[int, int], int]) -> dict[int, str]:
    """Root complexes derived from NVML: devices joined by a level up to HOSTBRIDGE share one,
    named ``nvml:<lowest bus id>`` of its devices. Devices with no level known get none."""
    group = {i: i for i in buses}

    def find(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for (a, b), level in levels.items():
        if level <= pynvml.NVML_TOPOLOGY_HOSTBRIDGE:
            group[find(a)] = find(b)
    members: dict[int, list[int]] = {}
    for i in buses:
        members.setdefault(find(i), []).append(i)
    placed = {i for pair_ in levels for i in pair_}
    return {
        i: "nvml:" + min(buses[m] for m in members[find(i)]).lower() for i in buses if i in placed
    }


class NvmlReader:
    """Reads GPUs through an NVML binding module (``pynvml`` or :mod:`nodeagent.nvmlfake`)."""

    def __init__(self, lib: ModuleType | Any = pynvml, *, sysfs: Path | None = None) -> None:
        """``sysfs``: where the host's /sys is, for PCIe roots (and NUMA nodes NVML does not
        give); None: from NVML alone."""
        self._nvml = lib
        self._sysfs = sysfs
        self._nvml.nvmlInit()
        self._handles: dict[str, Any] = {}
        self._indexes: dict[str, int] = {}
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
            self._indexes[uuid] = index
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

    def _try(self, errors: list[str], fn: str, *args: Any) -> Any:
        """One topology call: None for NOT_SUPPORTED; other failures (a function missing from
        the binding among them) recorded in ``errors``."""
        call = getattr(self._nvml, fn, None)
        if call is None:
            errors.append(f"{fn}: not in this NVML binding")
            return None
        try:
            return call(*args)
        except NVMLError as e:
            if e.value != ERROR_NOT_SUPPORTED:
                errors.append(f"{fn}: {e}")
            return None

    def _numa_node(self, handle: Any, bus_id: str | None, errors: list[str]) -> int | None:
        node = None
        if hasattr(self._nvml, "nvmlDeviceGetNumaNodeId"):  # not in every binding
            node = self._try(errors, "nvmlDeviceGetNumaNodeId", handle)
        if node is None and self._sysfs is not None and bus_id:
            return sysfs_numa_node(self._sysfs, bus_id)
        return int(node) if node is not None and int(node) >= 0 else None

    def _nvlinks(self, handle: Any, errors: list[str]) -> _NvLinks:
        """The device's active NVLinks. NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past the
        device's last link) end the walk; a link whose far end cannot be read is left out."""
        nvml, found = self._nvml, _NvLinks()
        if not hasattr(nvml, "nvmlDeviceGetNvLinkState"):
            errors.append("nvmlDeviceGetNvLinkState: not in this NVML binding")
            return found
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                active = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except NVMLError as e:
                if e.value not in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                    errors.append(f"nvmlDeviceGetNvLinkState({link}): {e}")
                break
            if active != pynvml.NVML_FEATURE_ENABLED:
                continue
            kind = None
            if hasattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType"):
                kind = self._try(errors, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                found.switch += 1
                continue
            if kind not in (None, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU):
                continue  # an IBM NPU, or unknown: no GPU of this node
            remote = self._try(errors, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            if remote is not None:
                found.peers[_bus(remote.busId)] += 1
        return found

    def topology(self) -> TopologyReading:
        """How the devices :meth:`devices` found are connected; never raises."""
        errors: list[str] = []
        handles = {index: self._handles[uuid] for uuid, index in self._indexes.items()}
        buses: dict[int, str] = {}
        for index, handle in handles.items():
            info = self._try(errors, "nvmlDeviceGetPciInfo", handle)
            if info is not None:
                buses[index] = _bus(info.busId)
        numa = {i: self._numa_node(h, buses.get(i), errors) for i, h in handles.items()}
        nvlinks = {i: self._nvlinks(h, errors) for i, h in handles.items()}
        levels: dict[tuple[int, int], int] = {}
        links: list[PairLink] = []
        for a, b in combinations(sorted(handles), 2):
            level = self._try(errors, "nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
            if level is not None:
                levels[(a, b)] = int(level)
            link = self._link(a, b, buses, nvlinks, levels.get((a, b)), errors)
            if link is not None:
                links.append(link)
        roots = _roots_from_levels(buses, levels)
        if self._sysfs is not None:
            roots.update(
                (i, root)
                for i, bus in buses.items()
                if (root := sysfs_pcie_root(self._sysfs, bus)) is not None
            )
        placements = [Placement(i, numa[i], roots.get(i)) for i in sorted(handles)]
        if not links and all(p.numa_node is None and p.pcie_root is None for p in placements):
            return TopologyReading(None, tuple(errors))
        return TopologyReading(make(placements, links), tuple(errors))

    @staticmethod
    def _link(
        a: int,
        b: int,
        buses: dict[int, str],
        nvlinks: dict[int, _NvLinks],
        level: int | None,
        errors: list[str],
    ) -> PairLink | None:
        """The link of one pair: NVLink when any (direct, as either end counts it, plus
        through NVSwitches, as many as the end with fewer has), else its PCIe level."""
        direct = max(
            nvlinks[a].peers.get(buses.get(b, "-"), 0), nvlinks[b].peers.get(buses.get(a, "-"), 0)
        )
        switched = min(nvlinks[a].switch, nvlinks[b].switch)
        if direct + switched > 0:
            return pair(a, b, Link.NVLINK, direct + switched)
        if level is None:
            return None
        if level not in PCIE_LEVELS:
            errors.append(f"nvmlDeviceGetTopologyCommonAncestor({a}, {b}): unknown level {level}")
            return None
        return pair(a, b, PCIE_LEVELS[level])

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
        return NvmlReader(pynvml, sysfs=Path("/sys"))
    except NVMLError as e:
        log.warning("NVML unavailable (%s): running without GPUs", e)
        return NullReader()
