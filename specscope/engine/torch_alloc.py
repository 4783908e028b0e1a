"""torch's CUDA caching allocator in this process: allocated, reserved and inactive-split bytes.

Only read when torch is already imported and CUDA initialised here: specscope never imports torch or touches a
GPU itself. (With vLLM the models live in worker processes; their memory shows per process through NVML.)
"""

from __future__ import annotations

import sys
from typing import Any

from specscope.core.model import AllocatorStats


def allocator_stats(torch: Any | None = None) -> tuple[tuple[AllocatorStats, ...], str]:
    """``(per-device stats, status)``; status is "ok" or why there are none."""
    torch = torch if torch is not None else sys.modules.get("torch")
    if torch is None:
        return (), "torch not loaded in this process"
    cuda = torch.cuda
    if not cuda.is_available():
        return (), "CUDA not available"
    if not cuda.is_initialized():
        return (), "CUDA not initialised in this process"
    out = []
    for d in range(cuda.device_count()):
        s = cuda.memory_stats(d)
        out.append(
            AllocatorStats(
                device_index=d,
                allocated_bytes=int(s.get("allocated_bytes.all.current", 0)),
                reserved_bytes=int(s.get("reserved_bytes.all.current", 0)),
                inactive_split_bytes=int(s.get("inactive_split_bytes.all.current", 0)),
            )
        )
    return tuple(out), "ok"
