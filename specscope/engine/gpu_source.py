"""The hub's GPU source: NVML device/process memory plus torch's allocator, as one ``GpuMemory``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specscope.core.model import GpuMemory
from specscope.engine.nvml import NvmlCollector
from specscope.engine.torch_alloc import allocator_stats
from specscope.state.hub import Hub

NAME = "gpu"


class GpuCollector:
    """Callable GPU source; ``nvml`` and ``torch`` replace the real modules in tests."""

    def __init__(self, nvml: Any | None = None, torch: Any | None = None, pid: int | None = None) -> None:
        self._nvml = NvmlCollector(nvml, pid)
        self._torch = torch

    def __call__(self) -> GpuMemory:
        mem = self._nvml.collect()
        alloc, status = allocator_stats(self._torch)
        return replace(mem, allocator=alloc, allocator_status=status)


def attach(hub: Hub, collector: GpuCollector | None = None) -> None:
    """Give ``hub`` its GPU source (replacing an earlier one)."""
    hub.add_gpu_source(NAME, collector or GpuCollector())
