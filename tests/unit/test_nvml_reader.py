"""NvmlReader on the NVML fake: discovery, readings, events, and every NVMLError path."""

from __future__ import annotations

import pynvml
import pytest

from nodeagent.nvml import NullReader, NvmlReader, open_reader
from nodeagent.nvmlfake import FakeNvml, full_gpu, gpu_without_ecc, lost_gpu


def test_discovers_devices_and_reads_a_healthy_one() -> None:
    fake = FakeNvml([full_gpu(0), full_gpu(1, name="NVIDIA A100-SXM4-80GB")])
    reader = NvmlReader(fake)
    infos = reader.devices()
    assert [(i.index, i.name, i.minor) for i in infos] == [
        (0, "NVIDIA H20", 0),
        (1, "NVIDIA A100-SXM4-80GB", 1),
    ]
    s = reader.sample(infos[0].uuid)
    assert (
        s.lost,
        s.ecc_uncorrected_volatile,
        s.remap_pending,
        s.remap_failed,
        s.retired_pages_pending,
        s.clock_event_reasons,
        s.errors,
    ) == (False, 0, False, False, False, 0, ())


def test_signals_are_read() -> None:
    fake = FakeNvml([full_gpu(0)])
    reader = NvmlReader(fake)
    gpu = fake.gpu(0)
    gpu.ecc_uncorrected_volatile = 3
    gpu.remap_pending = True
    gpu.remap_failed = True
    gpu.retired_pages_pending = True
    gpu.clock_event_reasons = pynvml.nvmlClocksEventReasonHwSlowdown
    s = reader.sample(gpu.uuid)
    assert (
        s.ecc_uncorrected_volatile,
        s.remap_pending,
        s.remap_failed,
        s.retired_pages_pending,
        s.clock_event_reasons,
    ) == (3, True, True, True, 0x8)


def test_not_supported_means_not_applicable_not_an_error() -> None:
    fake = FakeNvml([gpu_without_ecc(0)])
    reader = NvmlReader(fake)
    s = reader.sample(fake.gpu(0).uuid)
    assert s.ecc_uncorrected_volatile is None
    assert s.remap_pending is None
    assert s.retired_pages_pending is None
    assert s.errors == ()


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_TIMEOUT,
        pynvml.NVML_ERROR_CORRUPTED_INFOROM,
        pynvml.NVML_ERROR_RESET_REQUIRED,
    ],
    ids=["unknown", "no-permission", "timeout", "inforom", "reset-required"],
)
def test_failing_call_is_recorded_not_raised(code: int) -> None:
    fake = FakeNvml([full_gpu(0)])
    reader = NvmlReader(fake)
    fake.gpu(0).failures["nvmlDeviceGetRemappedRows"] = code
    s = reader.sample(fake.gpu(0).uuid)
    assert len(s.errors) == 1
    assert s.errors[0].startswith("nvmlDeviceGetRemappedRows: ")
    assert s.remap_pending is None
    assert s.ecc_uncorrected_volatile == 0  # the other readings still happened


def test_error_classes_are_the_bindings_own() -> None:
    fake = FakeNvml([lost_gpu(0)])
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        FakeNvml().nvmlDeviceGetCount()


def test_gpu_lost_after_start() -> None:
    fake = FakeNvml([full_gpu(0)])
    reader = NvmlReader(fake)
    fake.gpu(0).lost = True
    s = reader.sample(fake.gpu(0).uuid)
    assert s.lost
    assert all("GPU is lost" in e for e in s.errors)


def test_gpu_lost_at_start_is_left_out() -> None:
    reader = NvmlReader(FakeNvml([full_gpu(0), lost_gpu(1)]))
    assert [i.index for i in reader.devices()] == [0]


def test_xid_events_with_data_for_registered_devices() -> None:
    fake = FakeNvml([full_gpu(0), full_gpu(1)])
    reader = NvmlReader(fake)
    assert reader.wait_events(0) == []
    fake.inject_xid(1, 48)
    fake.inject_xid(0, 13)
    events = reader.wait_events(0)
    assert [(e.uuid, e.xid) for e in events] == [(fake.gpu(1).uuid, 48), (fake.gpu(0).uuid, 13)]
    fake.gpu(1).lost = True
    fake.inject_xid(1, 79)  # fallen off the bus: its handle still names it
    assert [(e.uuid, e.xid) for e in reader.wait_events(0)] == [(fake.gpu(1).uuid, 79)]


def test_no_event_set_still_works() -> None:
    fake = FakeNvml([full_gpu(0)])
    fake.nvmlEventSetCreate = lambda: (_ for _ in ()).throw(  # type: ignore[method-assign]
        pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    )
    reader = NvmlReader(fake)
    fake.inject_xid(0, 48)
    assert reader.wait_events(0) == []


def test_driver_not_loaded_falls_back_to_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        NvmlReader(FakeNvml(driver_loaded=False))
    import nodeagent.nvml as nvml_module

    monkeypatch.setattr(nvml_module, "pynvml", FakeNvml(driver_loaded=False))
    assert isinstance(open_reader("nvml"), NullReader)
    assert open_reader("null").devices() == []


def test_close_shuts_nvml_down() -> None:
    fake = FakeNvml([full_gpu(0)])
    NvmlReader(fake).close()
    assert fake.initialized == 0
