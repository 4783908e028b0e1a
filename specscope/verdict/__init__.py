"""The verdict: does speculation pay, and at which K? The expected speedup by batch size, from what the engine
measured. ``cost`` (c), ``estimate`` (the speedup at a batch size and K), ``traffic`` (those weighted by where the
engine spent its time), ``schedule`` (the K table and vLLM's schedule) and ``baseline`` (step times without
speculation); memory findings are in :mod:`specscope.core.memory`.

At the running K and batch size b the decode speedup is observed, not modelled: tokens a request gains per decode
step (measured) × the step time without speculation / the step time with it. The second comes from the live
engine; the first from a **baseline**, the same target's decode-step times without speculation (``specscope
calibrate``). Their ratio also gives the effective draft cost per draft token, c(b) = (T_spec/T_plain − 1)/K:
everything a speculative step costs beyond a plain one (K draft passes, verifying K+1 tokens per request,
rejection sampling). For other K, tokens per step follow the observed per-position acceptance, extended with the
maximum-likelihood α (Leviathan et al. 2023), and cost 1 + K·c(b).

Prefill is not sped up, and a draft prefills every prompt too: when the engine spends time on prefill (ρ seconds
per second of decode; the steps that carry prefill, less the decode work they also do), the end-to-end speedup of
the workload is (ρ/(1 + c_p) + s)/(ρ + s/s_K), where s is the decode speedup at the running K and c_p the draft's
prefill cost per token relative to the target's (its parameters per token; 0 for n-gram and suffix lookup).

Without a baseline c is estimated: from the two models' per-token parameters (decoding is memory-bound on GPUs),
or, for n-gram and suffix lookup (no model), from a linear fit of the live step times over batch sizes (a
verification of K+1 tokens per request), or an assumed 0.02 per draft token when there is only one batch size.
Each estimate says which.
"""

from specscope.verdict.baseline import (
    baseline_problem,
    load_profile,
    merge_profiles,
    save_profile,
    usable_baseline,
    with_baseline,
)
from specscope.verdict.cost import (
    ASSUMED_VERIFY_COST,
    MIN_STEPS,
    cost_ratio_from_sizes,
    measured_cost,
    verify_cost,
)
from specscope.verdict.prose import by_batch_line, explain
from specscope.verdict.schedule import (
    KChoice,
    config_text,
    k_ranges,
    k_schedule,
    k_table,
    monotone_between,
    recommended_config,
    schedule_config,
    schedule_text,
    scheduled_k,
)
from specscope.verdict.speedup import (
    LOSSY_CAVEAT,
    MIN_TABLE_STEPS,
    SpeedupEstimate,
    by_batch_size,
    class_speedup,
    estimate,
    k0_decode,
)
from specscope.verdict.traffic import TrafficSpeedup, traffic_speedup

__all__ = [
    "ASSUMED_VERIFY_COST", "LOSSY_CAVEAT", "MIN_STEPS", "MIN_TABLE_STEPS", "KChoice", "SpeedupEstimate",
    "TrafficSpeedup",
    "baseline_problem", "by_batch_line", "by_batch_size", "class_speedup", "config_text", "cost_ratio_from_sizes",
    "estimate", "explain", "k0_decode", "k_ranges", "k_schedule", "k_table", "load_profile", "measured_cost",
    "merge_profiles",
    "monotone_between", "recommended_config", "save_profile", "schedule_config", "schedule_text", "scheduled_k",
    "traffic_speedup",
    "usable_baseline", "verify_cost", "with_baseline",
]
