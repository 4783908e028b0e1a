"""GPU memory per device and per process, from NVML (``nvidia-ml-py``, imported as ``pynvml``).

Without the package, the driver or a GPU, :meth:`NvmlCollector.collect` returns a ``GpuMemory`` whose status
says so ("no NVIDIA driver", ...) and holds no devices: never an exception.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from specscope.model import GpuDevice, GpuMemory, GpuProcess


def descendants(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """PIDs of every process below ``pid`` (the engine's workers), read from /proc; empty where unreadable."""
    children: dict[int, list[int]] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return set()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may itself hold spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector:
    """Reads device and per-process memory through NVML; ``nvml`` replaces the ``pynvml`` module in tests."""

    def __init__(self, nvml: ModuleType | Any | None = None, pid: int | None = None) -> None:
        self._nvml = nvml
        self._pid = pid if pid is not None else os.getpid()
        self._ready = False

    def _init(self) -> tuple[Any, str | None]:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                return None, "nvidia-ml-py not installed"
            self._nvml = pynvml
        nvml: Any = self._nvml
        if not self._ready:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                not_found = tuple(
                    getattr(nvml, n) for n in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")
                    if hasattr(nvml, n)
                )
                if not_found and isinstance(exc, not_found):
                    return None, "no NVIDIA driver"
                return None, f"NVML error: {exc}"
            self._ready = True
        return nvml, None

    def collect(self) -> GpuMemory:
        """Current memory of every device, and of this process and its children on each device."""
        nvml, status = self._init()
        if nvml is None:
            return GpuMemory(status=status or "unavailable")
        try:
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                return GpuMemory(status="no GPU")
            ours = {self._pid: "self", **{p: "worker" for p in descendants(self._pid)}}
            devices, processes = [], []
            for i in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                devices.append(GpuDevice(i, _text(nvml.nvmlDeviceGetName(handle)), int(mem.used), int(mem.total)))
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    role = ours.get(p.pid)
                    if role is not None:
                        used = p.usedGpuMemory
                        processes.append(GpuProcess(p.pid, i, int(used) if used is not None else None, role))
        except nvml.NVMLError as exc:
            return GpuMemory(status=f"NVML error: {exc}")
        return GpuMemory(status="ok", devices=tuple(devices), processes=tuple(processes))
