"""Acceptance math against closed forms and simulated drafts."""

from __future__ import annotations

import random

import pytest

from specscope import acceptance as acc


def simulate(alpha: float, k: int, drafts: int, seed: int = 0) -> tuple[list[int], int, int]:
    """vLLM-style counts from drafts whose tokens are each accepted with probability alpha until a rejection."""
    rng = random.Random(seed)
    per_pos = [0] * k
    accepted = 0
    for _ in range(drafts):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        for i in range(n):
            per_pos[i] += 1
        accepted += n
    return per_pos, accepted, drafts * k


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.6, 0.9])
def test_alpha_estimators_recover_true_alpha(alpha: float) -> None:
    per_pos, accepted, drafted = simulate(alpha, k=4, drafts=40_000)
    assert acc.alpha(per_pos, 40_000) == pytest.approx(alpha, abs=0.01)
    assert acc.alpha_from_position0(per_pos, 40_000) == pytest.approx(alpha, abs=0.01)
    trials = [40_000, *per_pos[:-1]]
    for c, n in zip(acc.conditional_rates(per_pos, 40_000), trials, strict=True):
        if n >= 1000:  # deep positions of a weak draft see too few drafts to estimate anything
            assert c == pytest.approx(alpha, abs=0.03)
    # vLLM's accepted/drafted is not alpha; it follows the closed form.
    assert accepted / drafted == pytest.approx(acc.expected_acceptance_rate(alpha, 4), abs=0.01)


def test_alpha_with_short_drafts_counts_truncation_not_rejection() -> None:
    # Two drafts of K=4; the n-gram proposer offered only 2 tokens for the second and both were accepted.
    per_pos = [2, 2, 1, 0]
    draft_per_pos = [2, 2, 1, 1]
    # First draft: accepted 3, rejected at position 3. Second: accepted 2 of 2, truncated, no rejection.
    assert acc.alpha(per_pos, 2, draft_per_pos) == pytest.approx(5 / 6)
    assert acc.alpha(per_pos, 2) == pytest.approx(5 / 7)


def test_vllm_formulas() -> None:
    assert acc.acceptance_rate(194, 1252) == pytest.approx(0.155, abs=1e-3)
    assert acc.mean_acceptance_length(194, 313) == pytest.approx(1.6198, abs=1e-4)
    assert acc.per_position_rates([89, 46, 35, 24], 313) == pytest.approx((89 / 313, 46 / 313, 35 / 313, 24 / 313))
    assert acc.acceptance_rate(0, 0) is None
    assert acc.mean_acceptance_length(0, 0) is None
    assert acc.per_position_rates([0, 0], 0) == ()
    assert acc.alpha([0, 0], 0) is None


def test_leviathan_speedup() -> None:
    # Leviathan et al. 2023, eq. 1 and Theorem 3.8.
    assert acc.expected_tokens_per_step(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert acc.expected_tokens_per_step(1.0, 4) == 5.0
    assert acc.expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))
    # Speculation helps for some K iff alpha > c.
    assert acc.best_k(0.3, 0.2)[1] > 1.0
    assert acc.best_k(0.1, 0.2)[1] < 1.0
    k, s = acc.best_k(0.9, 0.02)
    assert k > 4 and s == max(acc.expected_speedup(0.9, j, 0.02) for j in range(1, 17))
