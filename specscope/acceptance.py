"""Speculative-decoding acceptance math, defined once.

Counts follow vLLM: a *draft* is one speculative step of a request (up to K proposed tokens); *draft tokens* are
the tokens proposed; *accepted* the draft tokens the target kept; ``accepted_per_pos[i]`` counts drafts whose
first ``i + 1`` tokens were all accepted (unconditional). Theory from Leviathan et al. 2023 (arXiv 2211.17192):
α is the per-token acceptance probability, γ = K, c = draft step cost / target step cost.
"""

from __future__ import annotations

from collections.abc import Sequence


def acceptance_rate(accepted: int, draft_tokens: int) -> float | None:
    """accepted / drafted (vLLM's "draft acceptance rate"); None without drafts."""
    return accepted / draft_tokens if draft_tokens else None


def mean_acceptance_length(accepted: int, drafts: int) -> float | None:
    """Tokens gained per speculative step, bonus token included: 1 + accepted / drafts."""
    return 1.0 + accepted / drafts if drafts else None


def per_position_rates(accepted_per_pos: Sequence[int], drafts: int) -> tuple[float, ...]:
    """Fraction of drafts whose first i+1 tokens were accepted, for each position i (vLLM's formula)."""
    if not drafts:
        return ()
    return tuple(n / drafts for n in accepted_per_pos)


def conditional_rates(accepted_per_pos: Sequence[int], drafts: int) -> tuple[float | None, ...]:
    """P(position i accepted | positions < i accepted): per_pos[0]/drafts, then per_pos[i]/per_pos[i-1]."""
    out: list[float | None] = []
    prev = drafts
    for n in accepted_per_pos:
        out.append(n / prev if prev else None)
        prev = n
    return tuple(out)


def alpha_from_position0(accepted_per_pos: Sequence[int], drafts: int) -> float | None:
    """α estimated from the first position alone: per_pos[0] / drafts."""
    if not drafts or not accepted_per_pos:
        return None
    return accepted_per_pos[0] / drafts


def alpha(accepted_per_pos: Sequence[int], drafts: int, draft_tokens_per_pos: Sequence[int] = ()) -> float | None:
    """Maximum-likelihood α over all positions, pooling the conditional ratios.

    Each draft is a run of Bernoulli(α) trials that stops at the first rejection or after the last drafted
    position. Successes are the accepted tokens; failures are the drafts that stopped early. When
    ``draft_tokens_per_pos`` is known (drafts may be shorter than K, as with n-gram), a draft that accepted
    everything it proposed counts as truncated rather than rejected.
    """
    if not drafts or not accepted_per_pos:
        return None
    successes = sum(accepted_per_pos)
    k = len(accepted_per_pos)
    if draft_tokens_per_pos and len(draft_tokens_per_pos) == k:
        # Rejections at position i: drafts that reached i (accepted i tokens and proposed position i) minus
        # those that accepted it.
        failures = 0
        for i in range(k):
            reached = accepted_per_pos[i - 1] if i else drafts
            proposed = min(reached, draft_tokens_per_pos[i])
            failures += max(0, proposed - accepted_per_pos[i])
    else:
        failures = drafts - accepted_per_pos[-1]
    trials = successes + failures
    return successes / trials if trials else None


def expected_tokens_per_step(a: float, k: int) -> float:
    """E[tokens per verify step] = (1 − α^(K+1)) / (1 − α)."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_acceptance_rate(a: float, k: int) -> float:
    """vLLM's accepted/drafted implied by α: α(1 − α^K) / ((1 − α)K)."""
    if k <= 0:
        return 0.0
    return (expected_tokens_per_step(a, k) - 1.0) / k


def expected_speedup(a: float, k: int, c: float) -> float:
    """Walltime speedup over no speculation: (1 − α^(K+1)) / ((1 − α)(Kc + 1))."""
    return expected_tokens_per_step(a, k) / (k * c + 1.0)


def best_k(a: float, c: float, k_max: int = 16) -> tuple[int, float]:
    """The K in 1..k_max maximising expected speedup, with that speedup."""
    return max(((k, expected_speedup(a, k, c)) for k in range(1, k_max + 1)), key=lambda kv: kv[1])
