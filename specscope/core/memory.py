"""Memory findings: what the draft costs the KV cache, and memory torch's allocator holds idle."""

from __future__ import annotations

from dataclasses import dataclass

from specscope.core.model import (
    Snapshot,
)


@dataclass(frozen=True)
class DraftKVCost:
    """The draft's cost in KV capacity: blocks the target's KV cache would have without it, their share of that
    capacity, and how many sequences of the observed mean length they would hold (None before any is seen)."""

    blocks: float
    share: float
    mean_length: float | None
    sequences: float | None

    def explain(self) -> str:
        """One line for people."""
        seqs = (f" = {self.sequences:.1f} concurrent sequences of {self.mean_length:.0f} tokens"
                if self.sequences is not None and self.mean_length else "")
        return f"the draft takes {self.blocks:.0f} KV blocks ({self.share:.1%} of the capacity){seqs}"


def draft_kv_cost(snap: Snapshot) -> DraftKVCost | None:
    """What the draft costs this engine's KV cache (weights and its own KV layers); None without the inputs.

    The mean sequence length is the live one (tokens held / running requests) where the KV estimate exists,
    else that of the recent finished requests (prompt + output)."""
    mem, kv = snap.engine.draft_memory, snap.kv
    if mem is None or not kv.num_blocks or not kv.block_size:
        return None
    blocks = mem.blocks_lost(kv.num_blocks, kv.block_size)
    mean: float | None = None
    if kv.tokens_held and snap.running:
        mean = kv.tokens_held / snap.running
    else:
        lengths = [(r.prompt_tokens or 0) + (r.generation_tokens or 0) for r in snap.requests if r.prompt_tokens]
        mean = sum(lengths) / len(lengths) if lengths else None
    return DraftKVCost(blocks=blocks, share=mem.capacity_share(kv.num_blocks, kv.block_size), mean_length=mean,
                       sequences=blocks * kv.block_size / mean if mean else None)


@dataclass(frozen=True)
class AllocatorWaste:
    """Memory torch's caching allocator in this process holds on one GPU without it being allocated."""

    device: int
    reserved_bytes: int
    allocated_bytes: int
    #: The device's used / total memory (NVML), None where NVML cannot tell.
    device_used: float | None

    @property
    def idle_bytes(self) -> int:
        """Reserved but not allocated: cached blocks and fragments only this allocator can reuse."""
        return max(0, self.reserved_bytes - self.allocated_bytes)

    @property
    def share(self) -> float:
        """Idle bytes / reserved bytes."""
        return self.idle_bytes / self.reserved_bytes if self.reserved_bytes else 0.0

    def explain(self) -> str:
        """"GPU 0: torch reserves 30.0 GiB, allocates 18.0 GiB: 12.0 GiB (40%) idle; device 96% used"."""
        gib = 1 << 30
        used = "device use unknown" if self.device_used is None else f"device {self.device_used:.0%} used"
        return (f"GPU {self.device}: torch reserves {self.reserved_bytes / gib:.1f} GiB, allocates "
                f"{self.allocated_bytes / gib:.1f} GiB: {self.idle_bytes / gib:.1f} GiB ({self.share:.0%}) idle; "
                f"{used}")


def allocator_waste(snap: Snapshot) -> AllocatorWaste | None:
    """The GPU where torch's allocator in this process holds the most reserved-but-unallocated memory; None where
    torch is not using CUDA in this process (vLLM's workers are other processes: see their NVML memory)."""
    used = {d.index: d.used_fraction for d in snap.gpu.devices if d.total_bytes}
    found = [AllocatorWaste(a.device_index, a.reserved_bytes, a.allocated_bytes, used.get(a.device_index))
             for a in snap.gpu.allocator if a.reserved_bytes > 0]
    return max(found, key=lambda w: w.idle_bytes, default=None)
