"""Traffic classes for the tiny models: prompts told apart by how well the draft predicts them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def acceptance_counts(llm: Any, prompts: Sequence[str], tokens: int = 48) -> list[tuple[int, int]]:
    """Each prompt's (accepted, drafted) draft tokens under ``llm``'s draft, from one greedy pass of ``tokens`` tokens
    a prompt (vLLM's own per-request counts); (0, 1) where the request drafted nothing."""
    from vllm import SamplingParams

    from specscope.engine import vllm_stats

    outputs = llm.generate(list(prompts), SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
                           use_tqdm=False)
    counts = []
    for out in outputs:
        steps = vllm_stats.per_step_counts(out.outputs[0].spec_decode_metrics)
        counts.append((sum(steps[0]), sum(steps[1])) if steps and sum(steps[1]) else (0, 1))
    return counts


def split_by_acceptance(llm: Any, candidates: Sequence[str], tokens: int = 48, easy: int = 8,
                        floor: float = 0.35) -> tuple[list[str], list[str]]:
    """Two traffic classes the draft of ``llm`` really treats differently, from one greedy pass over
    ``candidates`` (vLLM's own per-request acceptance): the ``easy`` prompts it predicts best, and the worst it
    predicts, as many as keep the mix's acceptance (by draft tokens) at ``floor`` or above. Random-weight models
    have no domains, so the prompts are told apart by what the draft does with them."""
    counts = acceptance_counts(llm, candidates, tokens)
    order = sorted(range(len(candidates)), key=lambda i: counts[i][0] / counts[i][1])
    best, accepted, drafted = order[-easy:], 0, 0
    for i in best:
        accepted, drafted = accepted + counts[i][0], drafted + counts[i][1]
    worst = []
    for i in order[:-easy]:
        if (accepted + counts[i][0]) / (drafted + counts[i][1]) < floor:
            break
        worst.append(i)
        accepted, drafted = accepted + counts[i][0], drafted + counts[i][1]
    return [candidates[i] for i in best], [candidates[i] for i in worst]
