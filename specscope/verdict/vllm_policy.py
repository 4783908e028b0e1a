"""What vLLM does with a speculative config, as functions of an :class:`~specscope.core.model.EngineInfo`: where it
runs one K whatever a schedule asks, and which verification is lossy. The data model only records the engine;
vLLM's policy on it is here, once."""

from __future__ import annotations

from specscope.core.model import EngineInfo

#: vLLM rejection-sampling methods that accept more than exact verification would (no counter tells them apart).
LOSSY_REJECTION_METHODS = frozenset({"fly"})
#: Methods whose proposer drafts the K that vLLM's ``num_speculative_tokens_per_batch_size`` schedules. vLLM 0.32
#: hands every proposer but ``custom_class`` the scheduled K (v1/worker/gpu_model_runner.py:4748), but suffix,
#: ngram_gpu, medusa and extract_hidden_states assert it is ``num_speculative_tokens`` (v1/spec_decode/
#: suffix_decoding.py:43, ngram_proposer_gpu.py:340): a range with a lower K fails the engine. n-gram takes any K up
#: to it (ngram_proposer.py:148), the model-based proposers set it each step (llm_base_proposer.py:532; dspark runs
#: the EAGLE proposer).
SCHEDULABLE_METHODS = frozenset({"ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash", "dspark"})


def one_k_reason(engine: EngineInfo) -> str | None:
    """Why vLLM drafts one K at every batch size here whatever the config asks (a method it keeps no schedule
    for, or data parallel), why the engine's K is its own (adaptive verification: a schedule would fight it, K
    is its ceiling), or why a schedule costs its largest K's draft passes at every batch size (a draft model on
    the V2 runner); None where a per-batch-size schedule costs what its K do."""
    if engine.adaptive_verification:
        return ("vLLM sizes each request's verification itself (enable_adaptive_verification), up to "
                "num_speculative_tokens: a per-batch-size schedule would fight it")
    if engine.method is not None and engine.method not in SCHEDULABLE_METHODS:
        return f"vLLM keeps no per-batch-size schedule for method {engine.method}"
    if engine.data_parallel_size is not None and engine.data_parallel_size > 1:
        return f"vLLM drops a per-batch-size schedule under data parallel (size {engine.data_parallel_size})"
    if engine.method == "draft_model" and engine.setup is not None and engine.setup.model_runner == "v2":
        return ("vLLM's V2 model runner drafts num_speculative_tokens passes on every step for a draft model, "
                "whatever K the schedule gives the step")
    return None


def lossy_verification(engine: EngineInfo) -> bool:
    """True where verification accepts some tokens the target would not have sampled (vLLM 0.33's ``fly``):
    acceptance then counts loose accepts, and is not comparable with exact verification's."""
    return engine.rejection_sample_method in LOSSY_REJECTION_METHODS
