"""GPU collectors: a fake NVML at the pynvml boundary, the real "no driver" path, torch's allocator."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from specscope.engine.gpu_source import GpuCollector
from specscope.engine.nvml import NvmlCollector, descendants
from specscope.engine.torch_alloc import allocator_stats
from specscope.state.hub import Hub

GiB = 1 << 30


class FakeNvml:
    """The slice of pynvml specscope calls, with pynvml's error classes and return shapes."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_DriverNotLoaded(NVMLError):
        pass

    class NVMLError_FunctionNotFound(NVMLError):
        pass

    nvmlMemory_v2 = 0x02000028  # pynvml's version constant of the v2 struct

    def __init__(self, devices: list[dict[str, Any]], init_error: Exception | None = None, v2: bool = True) -> None:
        self.devices = devices
        self.init_error = init_error
        self.inits = 0
        self.v2 = v2
        self.v2_calls = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error:
            raise self.init_error

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        """v1 counts the driver's reserved memory as used; v2 (nvmlDeviceGetMemoryInfo_v2) reports it apart."""
        d = self.devices[h]
        if d.get("lost"):
            raise self.NVMLError("GPU is lost")
        reserved = d.get("reserved", 0)
        if version is None:
            return SimpleNamespace(used=d["used"] + reserved, total=d["total"], free=d["total"] - d["used"] - reserved)
        if not self.v2:
            raise self.NVMLError_FunctionNotFound("Function Not Found")
        self.v2_calls += 1
        return SimpleNamespace(version=version, used=d["used"], reserved=reserved, total=d["total"],
                               free=d["total"] - d["used"] - reserved)

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


@pytest.mark.parametrize("v2", [True, False])
def test_device_memory_as_nvidia_smi_reports_it(v2: bool) -> None:
    idle = {"name": "NVIDIA H100", "used": 0, "reserved": 480 << 20, "total": 80 * GiB, "procs": []}
    nvml = FakeNvml([idle], v2=v2)
    collector = NvmlCollector(nvml)
    for _ in range(2):
        (dev,) = collector.collect().devices
        # v2: an idle GPU reads 0 used, as nvidia-smi; a driver without v2 falls back to v1 (reserved included).
        assert dev.used_bytes == (0 if v2 else 480 << 20)
    assert nvml.v2_calls == (2 if v2 else 0)


def fake_proc(root: Any, processes: dict[int, tuple[int, list[int]]]) -> Any:
    """A /proc with ``{pid: (ppid, NSpid)}`` entries (stat and status files as the kernel writes them)."""
    for pid, (ppid, nspid) in processes.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (python3 -m vllm) S {ppid} 1 1 0 -1\n")
        ids = "\t".join(map(str, nspid))
        (d / "status").write_text(f"Name:\tpython3\nNSpid:\t{ids}\nPPid:\t{ppid}\n")
    return root


def test_host_pids_are_mapped_through_nspid_in_a_container(tmp_path: Any) -> None:
    from pathlib import Path

    from specscope.engine.nvml import namespace_pids

    # Inside the container: the engine is PID 7, its worker PID 30.
    container = fake_proc(Path(tmp_path / "proc"), {7: (1, [7]), 30: (7, [30])})
    # The host's /proc, mounted into the container: host PIDs 41007 and 41030 are the container's 7 and 30.
    host = fake_proc(Path(tmp_path / "host-proc"), {41007: (900, [41007, 7]), 41030: (41007, [41030, 30]),
                                                    52000: (1, [52000])})
    assert namespace_pids(host) == {41007: 7, 41030: 30}
    nvml = FakeNvml([{"name": "NVIDIA H100", "used": 30 * GiB, "total": 80 * GiB,
                      "procs": [(41030, 25 * GiB), (41007, 1 * GiB), (52000, 3 * GiB)]}])
    mem = NvmlCollector(nvml, pid=7, proc=container, host_proc=host).collect()
    assert {(p.pid, p.used_bytes, p.role) for p in mem.processes} == {(7, 1 * GiB, "self"), (30, 25 * GiB, "worker")}
    # Without the host's /proc the host PIDs match nothing here: no process is claimed wrongly.
    assert NvmlCollector(nvml, pid=7, proc=container).collect().processes == ()


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
