"""GPU memory per device and per process, from NVML (``nvidia-ml-py``, imported as ``pynvml``).

Without the package, the driver or a GPU, :meth:`NvmlCollector.collect` returns a ``GpuMemory`` whose status
says so ("no NVIDIA driver", ...) and holds no devices: never an exception.

Device memory is read as nvidia-smi shows it: NVML's v2 call, whose ``used`` leaves out the memory the driver
reserves (the v1 call counts it: ~480 MiB on an idle H100), where the driver has it. In a container NVML reports
host PIDs; they are mapped to this namespace's through the ``NSpid`` line of ``/proc/<pid>/status`` in a
``/proc`` of the outer namespace (``SPECSCOPE_HOST_PROC``, e.g. the host's /proc mounted read-only).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from specscope.core.model import GpuDevice, GpuMemory, GpuProcess


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


def namespace_pids(proc: Path) -> dict[int, int]:
    """Outer PID -> PID in the process's own (innermost) namespace, from ``NSpid`` in ``proc``'s status files.

    Only processes in a nested PID namespace (a container, seen from outside it) appear; empty where unreadable.
    """
    out: dict[int, int] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                pids = [int(x) for x in line.split()[1:]]
                if len(pids) > 1:
                    out[pids[0]] = pids[-1]
                break
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector:
    """Reads device and per-process memory through NVML; ``nvml`` replaces the ``pynvml`` module in tests."""

    def __init__(self, nvml: ModuleType | Any | None = None, pid: int | None = None, proc: Path | None = None,
                 host_proc: Path | None = None) -> None:
        self._nvml = nvml
        self._pid = pid if pid is not None else os.getpid()
        self._proc = proc or Path("/proc")
        outer = host_proc or os.environ.get("SPECSCOPE_HOST_PROC")
        self._host_proc = Path(outer) if outer else None
        self._ready = False
        self._v2: bool | None = None  # whether the driver has the v2 memory call (found out on first use)

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
            ours = {self._pid: "self", **{p: "worker" for p in descendants(self._pid, self._proc)}}
            mapped = namespace_pids(self._host_proc) if self._host_proc is not None else {}
            devices, processes = [], []
            for i in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                mem = self._memory(nvml, handle)
                devices.append(GpuDevice(i, _text(nvml.nvmlDeviceGetName(handle)), int(mem.used), int(mem.total)))
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    pid = mapped.get(p.pid, p.pid)
                    role = ours.get(pid)
                    if role is not None:
                        used = p.usedGpuMemory
                        processes.append(GpuProcess(pid, i, int(used) if used is not None else None, role))
        except nvml.NVMLError as exc:
            return GpuMemory(status=f"NVML error: {exc}")
        return GpuMemory(status="ok", devices=tuple(devices), processes=tuple(processes))

    def _memory(self, nvml: Any, handle: Any) -> Any:
        """v2 memory info where the driver has it (reserved memory apart, as nvidia-smi), else v1."""
        version = getattr(nvml, "nvmlMemory_v2", None)
        if self._v2 is not False and version is not None:
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                self._v2 = True
                return mem
            except TypeError:  # a pynvml without the version argument
                self._v2 = False
            except nvml.NVMLError as exc:
                missing = tuple(getattr(nvml, n) for n in ("NVMLError_FunctionNotFound", "NVMLError_NotSupported")
                                if hasattr(nvml, n))
                if not missing or not isinstance(exc, missing):
                    raise
                self._v2 = False
        return nvml.nvmlDeviceGetMemoryInfo(handle)
