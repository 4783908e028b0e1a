"""The K table by batch size and vLLM's ``num_speculative_tokens_per_batch_size`` schedule built from it (the rule,
:func:`k_ranges`, is the one ``specscope evaluate`` schedules by too)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specscope.core.model import EngineInfo, Snapshot
from specscope.verdict.speedup import by_batch_size, estimate
from specscope.verdict.traffic import flapping
from specscope.verdict.vllm_policy import one_k_reason


@dataclass(frozen=True)
class KChoice:
    """The best K at one batch size, with its expected speedup and the running K's."""

    batch_size: int
    k: int
    speedup: float
    running_k: int
    running_speedup: float
    #: What a K = 0 range in vLLM's schedule runs at here (not plain speed: see :func:`k0_decode`).
    k0_speedup: float


def k_table(snap: Snapshot) -> list[KChoice]:
    """The K for vLLM's schedule at every batch size measured: the one that maximises goodput with speculation
    configured, a K = 0 range priced at what it costs there."""
    return [KChoice(e.batch_size or 0, e.scheduled_k, e.scheduled_speedup, e.k, e.expected_speedup, e.k0_speedup)
            for e in by_batch_size(snap)]


def k_schedule(snap: Snapshot, max_batch: int | None = None) -> list[tuple[int, int, int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from the K table (:func:`k_ranges`), from 1 to
    ``max_batch`` (default: the engine's max_num_seqs, else the largest batch measured). Between measured batch
    sizes the best K comes from the estimate on interpolated step times. Empty without measured estimates."""
    table = k_table(snap)
    if not table:
        return []
    setup = snap.engine.setup
    last = max_batch or (setup.max_num_seqs if setup and setup.max_num_seqs else table[-1].batch_size)

    def best_at(b: int) -> int | None:
        est = estimate(snap, batch_size=b)
        return est.scheduled_k if est is not None and est.measured else None

    return k_ranges([(c.batch_size, c.k) for c in table], last, best_at)


def k_ranges(measured: Sequence[tuple[int, int]], last: int,
             best_at: Callable[[int], int | None]) -> list[tuple[int, int, int]]:
    """The schedule rule, for the live verdict and ``specscope evaluate`` alike: (first batch, last batch, K)
    ranges from 1 to ``last``, from the K at each measured batch size (``measured``: (batch, K), ascending) and
    ``best_at``, the best K at a batch size not measured (None where it has none: the K before it is kept, or the
    first measured one below it).

    Between two measured sizes ``best_at``'s K is kept between their K and moves one way from the first to the
    second (:func:`monotone_between`), so noise never makes K zig-zag; beyond the largest, its K carries on (as vLLM
    does for batch sizes past the last range). Empty without a measured size.
    """
    if not measured:
        return []
    at = dict(measured)
    ks: list[int] = []
    for b in range(1, last + 1):
        k = at[b] if b in at else best_at(b) if b < measured[-1][0] else None
        if k is None:  # the K before carries on; below the first measured size, the first's
            k = ks[-1] if ks else measured[0][1]
        ks.append(k)
    ks = monotone_between(ks, list(measured))
    out: list[tuple[int, int, int]] = []
    for b, k in enumerate(ks, start=1):
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], b, k)
        else:
            out.append((b, b, k))
    return out


def monotone_between(ks: list[int], measured: list[tuple[int, int]]) -> list[int]:
    """``ks`` (the best K at batch 1, 2, ...) with each stretch between two measured batch sizes ``(batch, K)``
    held between their K and moving only from the first's toward the second's."""
    out = list(ks)
    for (b0, k0), (b1, k1) in itertools.pairwise(measured):
        lo, hi = min(k0, k1), max(k0, k1)
        prev = k0
        for b in range(b0 + 1, min(b1, len(out) + 1)):
            k = min(hi, max(lo, out[b - 1]))
            prev = out[b - 1] = min(k, prev) if k1 <= k0 else max(k, prev)
    return out


def schedule_config(schedule: list[tuple[int, int, int]]) -> dict[str, Any] | None:
    """The speculative-config keys that apply ``schedule``; None when no batch size should speculate. One K
    throughout is ``num_speculative_tokens`` alone (a one-range schedule would only size vLLM's buffers the same)."""
    ks = {k for _, _, k in schedule}
    if not ks or ks == {0}:
        return None
    if len(ks) == 1:
        return {"num_speculative_tokens": ks.pop()}
    return {"num_speculative_tokens": max(ks),
            "num_speculative_tokens_per_batch_size": [list(r) for r in schedule]}


def recommended_config(snap: Snapshot) -> dict[str, Any] | None:
    """The schedule to configure, or None where speculation should be removed (``speculative_config`` dropped, a
    restart): where no batch size measured pays even at its best K, since a K = 0 range still costs a draft pass.
    Where vLLM would run one K whatever the config says (:func:`~specscope.verdict.vllm_policy.one_k_reason`: a method
    it keeps no schedule for, or data parallel), one K: the best at the operating batch."""
    table = k_table(snap)
    if not any(c.speedup >= 1.0 for c in table):
        return None
    if one_k_reason(snap.engine) is not None:
        est = estimate(snap)
        k = est.advised_k if est is not None and est.measured else max(table, key=lambda c: c.speedup).k
        return {"num_speculative_tokens": k} if k else None
    return schedule_config(k_schedule(snap))


def scheduled_k(config: dict[str, Any] | None, batch: int) -> int:
    """The K vLLM runs at ``batch`` under a recommended ``config`` (0 where it is None: speculation removed), as an
    engine configured with it drafts (:meth:`EngineInfo.k_at`)."""
    if config is None:
        return 0
    ranges = config.get("num_speculative_tokens_per_batch_size") or ()
    engine = EngineInfo(num_speculative_tokens=int(config["num_speculative_tokens"]),
                        k_schedule=tuple((int(lo), int(hi), int(k)) for lo, hi, k in ranges))
    return engine.k_at(batch) or 0


def config_text(config: dict[str, Any]) -> str:
    """A recommended config in a line: the schedule's ranges, or the one K."""
    ranges = config.get("num_speculative_tokens_per_batch_size")
    return json.dumps(ranges) if ranges else f"K={config['num_speculative_tokens']} at every batch size"


def schedule_text(snap: Snapshot) -> list[str]:
    """The K table and the ready-to-paste schedule, as lines (empty without a usable baseline)."""
    table = k_table(snap)
    if not table:
        return []
    lines = ["batch  best K  speedup   (running K)"]
    for c in table:
        zero = "   K=0 is not off: speculation removed runs 1.00x" if c.k == 0 else ""
        lines.append(f"{c.batch_size:>5}  {c.k:>6}  {c.speedup:6.2f}x   (K={c.running_k}: {c.running_speedup:.2f}x)"
                     + zero)
    config = recommended_config(snap)
    reason = one_k_reason(snap.engine)
    fixed = reason is not None
    if fixed:
        lines.append(f"{reason}: one K, the best at the operating batch")
    drafted = snap.window.spec.drafted_per_step if snap.window.spec is not None else None
    if snap.engine.adaptive_verification and drafted is not None:
        est = estimate(snap)
        pick = f" where the verdict would pick K={est.advised_k}" if est is not None else ""
        lines.append(f"the engine drafted {drafted:.2f} tokens per verify step over the window{pick}")
    if config is None and fixed and any(c.speedup >= 1.0 for c in table):
        lines.append("remove speculative_config: no K pays at the operating batch")
    elif config is None:
        worst = min(table, key=lambda c: c.k0_speedup)
        lines.append("turn speculation off: remove speculative_config (a restart); no K pays at any batch size "
                     f"measured, and K=0 in vLLM's schedule still runs the draft ({worst.k0_speedup:.2f}x at batch "
                     f"{worst.batch_size})")
    else:
        lines.append("speculative_config: " + json.dumps(config, separators=(", ", ": ")))
        if "num_speculative_tokens_per_batch_size" in config and _graphs_lost(snap):
            lines.append("on this GPU vLLM's V1 runner runs a schedule with PIECEWISE CUDA graphs instead of FULL "
                         "ones, a per-step cost not priced here: measure it against the fixed K (specscope evaluate)")
        ranges = config.get("num_speculative_tokens_per_batch_size")
        if ranges and (flap := flapping(snap, [(a, b, k) for a, b, k in ranges])) is not None:
            lines.append(flap.explain())
        losing = [c for c in table if c.speedup < 1.0]
        if losing:
            lines.append("costs at batch " + ", ".join(f"{c.batch_size} ({c.speedup:.2f}x)" for c in losing)
                         + ": if the engine runs there most, remove speculative_config instead (a restart)")
    return lines


def _graphs_lost(snap: Snapshot) -> bool:
    """Whether a schedule would cost this engine its FULL CUDA graphs: vLLM 0.32 switches FULL_AND_PIECEWISE to
    PIECEWISE under a per-batch-size schedule on the V1 runner (``_maybe_override_dynamic_sd_cudagraph_mode``)."""
    setup = snap.engine.setup
    return (setup is not None and (setup.device or "").startswith("cuda") and setup.model_runner != "v2"
            and setup.enforce_eager is not True)
