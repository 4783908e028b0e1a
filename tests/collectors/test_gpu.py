"""GPU collectors: a fake NVML at the pynvml boundary, the real "no driver" path, torch's allocator."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from specscope.collectors.gpu_source import GpuCollector
from specscope.collectors.nvml import NvmlCollector, descendants
from specscope.collectors.torch_alloc import allocator_stats
from specscope.hub import Hub

GiB = 1 << 30


class FakeNvml:
    """The slice of pynvml specscope calls, with pynvml's error classes and return shapes."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_DriverNotLoaded(NVMLError):
        pass

    def __init__(self, devices: list[dict[str, Any]], init_error: Exception | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error:
            raise self.init_error

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        d = self.devices[h]
        if d.get("lost"):
            raise self.NVMLError("GPU is lost")
        return SimpleNamespace(used=d["used"], total=d["total"], free=d["total"] - d["used"])

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.devices[h]["name"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.devices[h]["procs"]]


@pytest.fixture
def child() -> Any:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_devices_and_our_processes(child: int) -> None:
    me = os.getpid()
    nvml = FakeNvml(
        [
            {"name": "NVIDIA H100", "used": 30 * GiB, "total": 80 * GiB,
             "procs": [(me, 1 * GiB), (child, 25 * GiB), (999_999_999, 4 * GiB)]},
            {"name": "NVIDIA H100", "used": 1 * GiB, "total": 80 * GiB, "procs": [(child, None)]},
        ]
    )
    collector = GpuCollector(nvml=nvml, torch=None)
    mem = collector()
    assert mem.status == "ok" and mem.available
    assert [(d.index, d.name, d.used_bytes, d.total_bytes) for d in mem.devices] == [
        (0, "NVIDIA H100", 30 * GiB, 80 * GiB),
        (1, "NVIDIA H100", 1 * GiB, 80 * GiB),
    ]
    assert mem.devices[0].used_fraction == pytest.approx(0.375)
    # Another user's process is not ours; NVML may not know a process's usage (None).
    assert {(p.pid, p.device_index, p.used_bytes, p.role) for p in mem.processes} == {
        (me, 0, 1 * GiB, "self"),
        (child, 0, 25 * GiB, "worker"),
        (child, 1, None, "worker"),
    }
    collector()
    assert nvml.inits == 1  # initialised once


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (FakeNvml.NVMLError_LibraryNotFound(), "no NVIDIA driver"),
        (FakeNvml.NVMLError_DriverNotLoaded(), "no NVIDIA driver"),
        (FakeNvml.NVMLError("Insufficient Permissions"), "NVML error: Insufficient Permissions"),
    ],
)
def test_init_failures_become_a_status(error: Exception, status: str) -> None:
    mem = NvmlCollector(FakeNvml([], init_error=error)).collect()
    assert mem.status == status and not mem.available and mem.devices == ()


def test_no_device_and_lost_device() -> None:
    assert NvmlCollector(FakeNvml([])).collect().status == "no GPU"
    lost = FakeNvml([{"name": "x", "used": 0, "total": 1, "procs": [], "lost": True}])
    assert NvmlCollector(lost).collect().status == "NVML error: GPU is lost"


def test_real_pynvml_on_a_machine_without_driver() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver; the fake-NVML tests cover the no-driver path")
    mem = GpuCollector()()
    assert mem.status == "no NVIDIA driver" and mem.devices == ()


def test_hub_reports_gpu_memory_from_its_source() -> None:
    hub = Hub()
    hub.add_gpu_source("gpu", GpuCollector(nvml=FakeNvml([{"name": "G", "used": 1, "total": 2, "procs": []}])))
    assert hub.snapshot().gpu.devices[0].used_bytes == 1


def test_descendants_reads_proc(child: int) -> None:
    assert child in descendants(os.getpid())
    assert descendants(os.getpid(), proc=__import__("pathlib").Path("/nonexistent")) == set()


class FakeCuda:
    def __init__(self, available: bool, initialized: bool, stats: list[dict[str, int]]) -> None:
        self.available, self.initialized, self.stats = available, initialized, stats

    def is_available(self) -> bool:
        return self.available

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.stats)

    def memory_stats(self, d: int) -> dict[str, int]:
        return self.stats[d]


def test_torch_allocator() -> None:
    stats = {"allocated_bytes.all.current": 3 * GiB, "reserved_bytes.all.current": 4 * GiB,
             "inactive_split_bytes.all.current": 256 << 20}
    torch = SimpleNamespace(cuda=FakeCuda(True, True, [stats]))
    alloc, status = allocator_stats(torch)
    assert status == "ok"
    assert (alloc[0].allocated_bytes, alloc[0].reserved_bytes, alloc[0].inactive_split_bytes) == (
        3 * GiB, 4 * GiB, 256 << 20)
    assert allocator_stats(SimpleNamespace(cuda=FakeCuda(False, False, [])))[1] == "CUDA not available"
    assert allocator_stats(SimpleNamespace(cuda=FakeCuda(True, False, [])))[1] == (
        "CUDA not initialised in this process")
