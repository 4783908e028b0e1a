"""Acceptance math against closed forms and simulated drafts."""

from __future__ import annotations

import random

import pytest

from specscope.core import acceptance as acc


def drafts_with(conditional: list[float], k: int, drafts: int, seed: int = 0) -> list[int]:
    """Accepted-per-position counts of ``drafts`` K-long drafts whose position i is accepted with probability
    ``conditional[i]`` once the ones before it were."""
    rng = random.Random(seed)
    per_pos = [0] * k
    for _ in range(drafts):
        for i in range(k):
            if rng.random() >= conditional[i]:
                break
            per_pos[i] += 1
    return per_pos


def simulate(alpha: float, k: int, drafts: int, seed: int = 0) -> tuple[list[int], int, int]:
    """vLLM-style counts from drafts whose tokens are each accepted with probability alpha until a rejection."""
    per_pos = drafts_with([alpha] * k, k, drafts, seed)
    return per_pos, sum(per_pos), drafts * k


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


def test_alpha_is_the_maximum_likelihood_estimate_when_drafts_are_shorter_than_k() -> None:
    # Five one-token drafts, all accepted, and five two-token drafts rejected at position 0 (issue 9's example).
    per_pos, draft_per_pos = [5, 0], [10, 5]
    # Accepted 5 of 10 trials: the five that were rejected count once, the one-token drafts ended on their own.
    assert acc.rejections(10, per_pos, draft_per_pos) == 5
    assert acc.alpha(per_pos, 10, draft_per_pos) == pytest.approx(0.5)
    # Counted step by step (one draft per step) the rejections are exact, and so is alpha.
    steps = [([1, 0], [1, 0])] * 5 + [([0, 0], [1, 1])] * 5
    rejected = sum(acc.rejections(1, a, d) for a, d in steps)
    assert rejected == 5 and acc.alpha(per_pos, 10, draft_per_pos, rejected) == pytest.approx(0.5)


def test_per_step_rejections_recover_alpha_for_drafts_of_random_length() -> None:
    # An n-gram-like proposer: each draft has 1..4 tokens, each accepted with probability 0.6 until a rejection.
    rng = random.Random(3)
    per_pos, draft_per_pos, drafts, rejected = [0] * 4, [0] * 4, 0, 0
    for _ in range(20_000):
        length = rng.randint(1, 4)
        n = 0
        while n < length and rng.random() < 0.6:
            n += 1
        step_acc = [1 if i < n else 0 for i in range(4)]
        step_drafted = [1 if i < length else 0 for i in range(4)]
        rejected += acc.rejections(1, step_acc, step_drafted)
        per_pos = [a + b for a, b in zip(per_pos, step_acc, strict=True)]
        draft_per_pos = [a + b for a, b in zip(draft_per_pos, step_drafted, strict=True)]
        drafts += 1
    assert acc.alpha(per_pos, drafts, draft_per_pos, rejected) == pytest.approx(0.6, abs=0.01)
    assert acc.alpha(per_pos, drafts) < 0.55  # taking every draft as K long counts truncations as rejections


def test_tokens_per_step_follows_observed_positions_and_extends_with_alpha() -> None:
    # Conditional rates 0.9, 0.5, 0.5, 0.5 (issue 9): observed 2.69 tokens per step; alpha's model says 2.55.
    rates = [0.9, 0.45, 0.225, 0.1125]
    assert acc.tokens_per_step(4, rates, 0.6) == pytest.approx(1 + sum(rates))
    assert 1 + sum(rates) == pytest.approx(2.6875)
    assert acc.tokens_per_step(2, rates, 0.6) == pytest.approx(1 + 0.9 + 0.45)
    assert acc.tokens_per_step(6, rates, 0.5) == pytest.approx(1 + sum(rates) + 0.1125 * (0.5 + 0.25))
    assert acc.tokens_per_step(0, rates, 0.5) == 1.0
    assert acc.tokens_per_step(4, rates, 0.6, draft_fraction=0.5) == pytest.approx(1 + sum(rates) / 2)


def test_the_extension_past_the_drafted_positions_falls_off_as_the_runs_last_position_did() -> None:
    # A draft whose positions are each accepted alike: the last drafted one bears the geometric extension out.
    geometric = drafts_with([0.7] * 4, 4, 40_000)
    assert acc.extension_check(geometric, 40_000) == pytest.approx(1.0, abs=0.03)
    # n-gram-like: the further a draft reaches, the likelier its match has run out. Drafted at K = 4, the extension
    # to K = 8 from α alone over-values what K = 8 would gain; from α times the check it comes closer.
    falling = [0.9, 0.8, 0.65, 0.5, 0.4, 0.3, 0.25, 0.2]
    at4, at8 = drafts_with(falling, 4, 40_000), drafts_with(falling, 8, 40_000, seed=1)
    check = acc.extension_check(at4, 40_000)
    assert 0.55 < check < 0.8
    a, rates = acc.alpha(at4, 40_000), acc.per_position_rates(at4, 40_000)
    assert a is not None
    truth = acc.tokens_per_step(8, acc.per_position_rates(at8, 40_000), 1.0)
    geometric_error = acc.tokens_per_step(8, rates, a) / truth - 1.0
    checked_error = acc.tokens_per_step(8, rates, a * check) / truth - 1.0
    assert geometric_error > 0.08 and abs(checked_error) < geometric_error / 2, (geometric_error, checked_error)
    # Rates that hold up better than geometrically are never extended above the line (a head's later positions).
    assert acc.extension_check(drafts_with([0.6, 0.7, 0.8, 0.9], 4, 40_000), 40_000) == 1.0
    assert acc.extension_check([500], 1000) == acc.extension_check([5, 0], 0) == acc.extension_check([0, 0], 9) == 1.0


def test_a_requests_last_step_keeps_only_the_tokens_it_still_needs() -> None:
    # Every draft accepted whole at K = 4: a step gains 5 tokens. A request needing 7 more takes two steps and keeps
    # 7 of the 10 they would gain; one needing 10 keeps them all.
    assert acc.kept_share(4, [1.0] * 4, 1.0, [7]) == pytest.approx(0.7)
    assert acc.kept_share(4, [1.0] * 4, 1.0, [10]) == pytest.approx(1.0)
    assert acc.kept_share(4, [1.0] * 4, 1.0, [7, 10]) == pytest.approx(17 / 20)
    # K = 1, half the drafts accepted: a step gains 1 or 2 tokens, 1.5 on average. Needing 1 token: one step, 1 kept.
    # Needing 2: one step half the time, two the other half, 1.5 steps for 2 tokens.
    assert acc.kept_share(1, [0.5], 0.5, [1]) == pytest.approx(1 / 1.5)
    assert acc.kept_share(1, [0.5], 0.5, [2]) == pytest.approx(2 / (1.5 * 1.5))
    assert acc.kept_share(0, [0.5], 0.5, [2]) == acc.kept_share(4, [0.5], 0.5, []) == 1.0
    # Longer drafts lose more at the end; long requests next to nothing (priced past a few drafts by the renewal
    # slope: within 0.1% of stepping through every token).
    rates, ends = [0.96, 0.91, 0.87, 0.83], list(range(31, 96))
    shares = [acc.kept_share(k, rates, 0.95, ends) for k in (1, 4, 8, 16)]
    assert shares == sorted(shares, reverse=True) and 0.88 < shares[-1] < 0.92
    assert acc.kept_share(16, rates, 0.95, [5000]) > 0.995


def test_end_to_end_speedup_dilutes_decode_speedup_with_prefill() -> None:
    assert acc.end_to_end(2.0, 2.0, 0.0) == pytest.approx(2.0)
    # A request spends 1 s in prefill and 1 s in decode at 2x: without speculation it would take 1 + 2 = 3 s.
    assert acc.end_to_end(2.0, 2.0, 1.0) == pytest.approx(3 / 2)
    assert acc.end_to_end(1.0, 2.0, 1.0) == pytest.approx(1.0)  # no decode gain: prefill alike, nothing gained
    # A draft as costly as the target prefills the prompt too: plain prefill takes half the time.
    assert acc.end_to_end(2.0, 2.0, 1.0, draft_prefill=1.0) == pytest.approx((0.5 + 2) / (1 + 1))
    assert acc.end_to_end(4.0, 2.0, 1.0) == pytest.approx(3 / 1.5)


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
    # Speculation helps for some K iff alpha > c; otherwise the best K is 0, speculation off.
    def best(a: float, c: float) -> tuple[int, float]:
        return acc.best_k([1.0] + [acc.expected_speedup(a, j, c) for j in range(1, acc.K_MAX + 1)])

    assert best(0.3, 0.2)[0] > 0 and best(0.3, 0.2)[1] > 1.0
    assert best(0.1, 0.5) == (0, 1.0)  # issue 9: alpha 0.1, c 0.5 is K = 0, not K = 1 at 0.73x
    k, s = best(0.9, 0.02)
    assert k > 4 and s == max(acc.expected_speedup(0.9, j, 0.02) for j in range(1, 17))
