"""The target's forward fitted over requests and tokens (:mod:`specscope.verdict.forward`), from the sums counting
keeps (:func:`specscope.core.counts.forward_moments`)."""

from __future__ import annotations

import pytest

from specscope.core.counts import forward_moments
from specscope.verdict.forward import fit_forward


def forward(requests: int, tokens: int) -> float:
    """The target's forward on the machine of these tests (and of ``test_uncertainty.forward_baseline``): 2 ms,
    0.05 ms a request, 0.15 ms a token."""
    return 0.002 + 0.00005 * requests + 0.00015 * tokens


def test_the_forwards_fit_tells_a_requests_cost_from_a_tokens() -> None:
    """Decode forwards (a token a request) and short prompts' give back the machine's costs exactly, summed over two
    intervals as counts are; decode forwards alone cannot tell the two apart; a long prompt's forward (its attention
    over itself grows faster than its tokens) is left out."""
    decode = [(b, b, 40, 40 * forward(b, b)) for b in (1, 2, 4, 8)]
    prompts = [(b, 12 * b, 1, forward(b, 12 * b)) for b in (1, 4)]
    both = [x + y for x, y in zip(forward_moments(decode), forward_moments(prompts), strict=True)]
    assert fit_forward(both) == pytest.approx((0.002, 0.00005, 0.00015))
    assert fit_forward(forward_moments(decode)) is None
    assert forward_moments([(1, 500, 1, 1.0)]) == [0.0] * 9
    assert fit_forward(forward_moments(prompts[:1])) is None  # one forward says nothing
