"""The target's forward time fitted over requests and tokens: ``a + b·requests + c·tokens`` seconds by least squares.

The fit is the verdict's: :mod:`specscope.verdict.cost` prices a plain step, and the part of c that verifying a token
costs, from it. What it is fitted from is counted: :func:`specscope.core.counts.forward_moments` sums each interval's
forwards as the counts are summed (added over processes, subtracted over windows), so the sums and their cut,
:data:`~specscope.core.counts.FIT_TOKENS_PER_REQUEST`, stay with the counting that needs them.
"""

from __future__ import annotations

from collections.abc import Sequence


def fit_forward(moments: Sequence[float]) -> tuple[float, float, float] | None:
    """``(a, per request, per token)`` seconds from :func:`specscope.core.counts.forward_moments`; None where the
    forwards cannot tell requests from tokens apart (every one ran a token a request: decode steps alone)."""
    if len(moments) != 9 or moments[0] < 3:
        return None
    n, sr, st, srr, srt, stt, sy, sry, sty = moments
    m = ((n, sr, st), (sr, srr, srt), (st, srt, stt))
    det = _det(m)
    scale = n * srr * stt
    if scale <= 0 or abs(det) < 1e-9 * scale:
        return None
    v = (sy, sry, sty)
    a, b, c = (_det(tuple(tuple(v[i] if j == col else m[i][j] for j in range(3)) for i in range(3))) / det
               for col in range(3))
    return a, b, c


def _det(m: Sequence[Sequence[float]]) -> float:
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
