"""Speculative-decoding acceptance math, defined once.

Counts follow vLLM: a *draft* is one speculative step of a request (up to K proposed tokens); *draft tokens* are
the tokens proposed; *accepted* the draft tokens the target kept; ``accepted_per_pos[i]`` counts drafts whose
first ``i + 1`` tokens were all accepted (unconditional); ``draft_tokens_per_pos[i]`` counts drafts that proposed
position ``i`` (drafts may be shorter than K: n-gram lookup, dynamic K). A *rejection* is a draft that stopped at
a rejected token rather than at its own end. Theory from Leviathan et al. 2023 (arXiv 2211.17192): α is the
per-token acceptance probability, γ = K, c = the cost of one draft token as a fraction of a plain decode step.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The largest K a recommendation considers (0 means "turn speculation off").
K_MAX = 16


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


def rejections(drafts: int, accepted_per_pos: Sequence[int], draft_tokens_per_pos: Sequence[int] = ()) -> int:
    """Drafts that ended at a rejected token, from one engine step's per-position counts.

    Exact when every draft of the step has the same length (a draft model; any single-request step); for drafts
    of mixed lengths in one step, the fewest rejections the counts allow (the profile maximum likelihood).
    Without per-position draft counts every draft is taken as K long.
    """
    return rejections_per_step((drafts,), (accepted_per_pos,), (draft_tokens_per_pos,))[0]


def rejections_per_step(drafts: Sequence[int], accepted_per_pos: Sequence[Sequence[int]],
                        draft_tokens_per_pos: Sequence[Sequence[int]]) -> list[int]:
    """:func:`rejections` of each of several steps."""
    out = []
    for n, accepted, proposed in zip(drafts, accepted_per_pos, draft_tokens_per_pos, strict=True):
        k = len(accepted)
        if not n or not k:
            out.append(0)
        elif len(proposed) != k or proposed.count(n) == k:  # every draft K long
            out.append(n - accepted[-1] if n > accepted[-1] else 0)
        else:
            rejected, reached_prev, proposed_prev = 0, n, n
            for reached, tried in zip(accepted, proposed, strict=True):
                # Drafts that reached this position and proposed it: at least this many, given the counts.
                trials = max(reached, reached_prev + tried - proposed_prev)
                rejected += max(0, trials - reached)
                reached_prev, proposed_prev = reached, tried
            out.append(rejected)
    return out


def alpha(accepted_per_pos: Sequence[int], drafts: int, draft_tokens_per_pos: Sequence[int] = (),
          rejected: int | None = None) -> float | None:
    """Maximum-likelihood α: accepted tokens / (accepted tokens + rejections).

    Each draft is a run of Bernoulli(α) trials that stops at the first rejection or at the draft's own end.
    ``rejected`` is the count summed step by step (:func:`rejections`); without it, it is derived from the
    interval's totals, which cannot tell short drafts that were fully accepted from long ones that were not.
    """
    if not drafts or not accepted_per_pos:
        return None
    successes = sum(accepted_per_pos)
    failures = rejected if rejected is not None else rejections(drafts, accepted_per_pos, draft_tokens_per_pos)
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


def tokens_per_step(k: int, per_position: Sequence[float], a: float, draft_fraction: float = 1.0) -> float:
    """Tokens a request gains per decode step if drafts were ``k`` long, from what was observed at the running K.

    Positions that were drafted count with their observed unconditional rates (``per_position``); positions
    beyond them extend the last rate geometrically with α. ``draft_fraction`` is the share of request-steps that
    carried a draft at all (n-gram lookup finds no match for some).
    """
    if k <= 0:
        return 1.0
    return 1.0 + draft_fraction * sum(extended_rates(k, per_position, a))


def extended_rates(k: int, per_position: Sequence[float], a: float) -> list[float]:
    """The unconditional rates of positions 1..``k``: those observed, then the last one's extended geometrically
    with α."""
    last = per_position[-1] if per_position else 1.0
    return [per_position[i] if i < len(per_position) else last * a ** (i + 1 - len(per_position))
            for i in range(k)]


def extended_last(accepted_per_pos: Sequence[int], drafts: int,
                  draft_tokens_per_pos: Sequence[int] = ()) -> float | None:
    """The last drafted position's unconditional rate as :func:`extended_rates` would extend it from the positions
    before it: the one before's rate times their α. None with fewer than two positions or none accepted before the
    last."""
    k = len(accepted_per_pos)
    if k < 2 or not drafts or not accepted_per_pos[k - 2]:
        return None
    a = alpha(accepted_per_pos[:k - 1], drafts, draft_tokens_per_pos[:k - 1])
    return accepted_per_pos[k - 2] / drafts * a if a else None


def extension_check(accepted_per_pos: Sequence[int], drafts: int, draft_tokens_per_pos: Sequence[int] = ()) -> float:
    """How the geometric extension held on the one position a run can check it on, at most 1.0: the last drafted
    position's rate observed over its rate extended (:func:`extended_last`). Positions past the drafted ones are
    extended with α times this: where the run's own drafts fell off faster than geometrically (n-gram lookup's
    matches run out), so do the ones it did not draft; never raised above the geometric line. 1.0 where there is
    nothing to check."""
    extended = extended_last(accepted_per_pos, drafts, draft_tokens_per_pos)
    return min(1.0, accepted_per_pos[-1] / drafts / extended) if extended else 1.0


def kept_share(k: int, per_position: Sequence[float], a: float, remaining: Sequence[int],
               draft_fraction: float = 1.0) -> float:
    """The share of the tokens steps would gain (:func:`tokens_per_step`) that requests needing ``remaining`` more
    tokens each keep, if drafts were ``k`` long: a request's last step keeps only the tokens it still needs (vLLM
    verifies the drafts past a request's end and drops them), so the longer the drafts, the more its last step
    loses. 1.0 without requests.

    A step keeps 1 + i tokens with the probability that exactly i drafted tokens were accepted (the unconditional
    rates, extended past the drafted positions as :func:`tokens_per_step` extends them); a request needing m tokens
    takes E[N(m)] = 1 + Σ P(i)·E[N(m − 1 − i)] steps, E[N(m ≤ 0)] = 0. Past a few drafts' length E[N] grows by
    1 / (tokens a step) a token (a renewal process), which prices longer requests without stepping through them."""
    if k <= 0 or not remaining:
        return 1.0
    rates = [draft_fraction * r for r in extended_rates(k, per_position, a)]
    accepted = [1.0 - rates[0]] + [rates[i] - rates[i + 1] for i in range(k - 1)] + [rates[-1]]
    gained = 1.0 + sum(rates)
    horizon = min(max(remaining), 16 * (k + 1))
    steps = [0.0] * (horizon + 1)
    for m in range(1, horizon + 1):
        steps[m] = 1.0 + sum(p * steps[max(0, m - 1 - i)] for i, p in enumerate(accepted))
    needed = sum(steps[m] if m <= horizon else steps[horizon] + (m - horizon) / gained for m in remaining if m > 0)
    kept = sum(m for m in remaining if m > 0)
    return kept / needed / gained if needed else 1.0


def end_to_end(decode_speedup: float, decode_speedup_now: float, prefill_per_decode: float,
               draft_prefill: float = 0.0) -> float:
    """Speedup of the whole workload (at a K > 0) when prefill takes engine time too.

    ``prefill_per_decode`` is ρ = prefill seconds / decode seconds of a request at the running K, whose decode
    speedup is ``decode_speedup_now``. Without speculation the decode part would take ``decode_speedup_now``
    times longer, and prefill 1/(1 + ``draft_prefill``) as long: a draft prefills every prompt too, at
    ``draft_prefill`` times the target's cost per token. At another K decode takes 1/``decode_speedup`` of the
    plain time; prefill stays as it is at the running K.
    """
    plain_decode = decode_speedup_now
    plain_prefill = prefill_per_decode / (1.0 + draft_prefill)
    return (plain_prefill + plain_decode) / (prefill_per_decode + plain_decode / decode_speedup)


def best_k(speedup_at: Sequence[float]) -> tuple[int, float]:
    """The K (index) with the highest speedup; ``speedup_at[0]`` is 1.0, speculation off. Ties go to smaller K."""
    best = max(range(len(speedup_at)), key=lambda k: (speedup_at[k], -k))
    return best, speedup_at[best]
