""""Does it pay for my traffic?": the verdict's speedups by batch size weighted by where the engine spent its time
over the window, one number with its interval (:func:`traffic_speedup`).

The engine spent T_b seconds in steps at batch size b; without speculation the same tokens would have taken
T_b × S_b (S_b the end-to-end speedup estimated there), so the traffic's speedup is Σ T_b S_b / Σ T_b over the batch
sizes with an estimate. The interval adds up the batch sizes' intervals the same way (their errors share the
acceptance and the baseline, so they move together, not independently).
"""

from __future__ import annotations

from dataclasses import dataclass

from specscope.model import Snapshot
from specscope.verdict.speedup import estimate


@dataclass(frozen=True)
class TrafficSpeedup:
    """The speedup of the window's traffic as the engine ran it."""

    speedup: float
    #: Its interval; None where a batch size in it has none.
    interval: tuple[float, float] | None
    #: (batch size, share of the weighed time, speedup there), most time first.
    shares: tuple[tuple[int, float, float], ...]
    #: Share of the window's step time at batch sizes with an estimate (the rest is not in the number).
    coverage: float

    @property
    def pays(self) -> bool:
        """True when the traffic runs faster with speculation than without."""
        return self.speedup >= 1.0

    @property
    def call(self) -> str:
        """"pays", "does NOT pay", or, where the interval straddles 1.0, which way it leans and that it is noise."""
        lo, hi = self.interval or (self.speedup, self.speedup)
        if lo >= 1.0:
            return "pays"
        if hi < 1.0:
            return "does NOT pay"
        return f"{'pays' if self.pays else 'does not pay'} within the noise (interval spans 1.0x)"

    def explain(self) -> str:
        """"for this traffic 1.42x [1.30-1.55]: pays (time at batch 1 70% 1.80x, 8 30% 0.97x)"."""
        iv = f" [{self.interval[0]:.2f}-{self.interval[1]:.2f}]" if self.interval else " (no interval yet)"
        where = ", ".join(f"{b} {share:.0%} {s:.2f}x" for b, share, s in self.shares[:4])
        more = f", +{len(self.shares) - 4} more" if len(self.shares) > 4 else ""
        part = "" if self.coverage >= 0.995 else f"; covers {self.coverage:.0%} of the window's step time"
        return f"for this traffic {self.speedup:.2f}x{iv}: {self.call} (time at batch {where}{more}{part})"


def traffic_speedup(snap: Snapshot) -> TrafficSpeedup | None:
    """The window's traffic-weighted speedup; None where no batch size the window ran has an estimate measured
    against a baseline."""
    weighed: list[tuple[int, float, float, tuple[float, float] | None]] = []
    total = 0.0
    for t in snap.window.step_times.times:
        seconds = t.steps * t.mean_s + t.prefill_s
        total += seconds
        est = estimate(snap, batch_size=t.batch_size) if seconds > 0 else None
        if est is not None and est.measured:
            weighed.append((t.batch_size, seconds, est.expected_speedup, est.interval))
    covered = sum(w for _, w, _, _ in weighed)
    if not weighed or covered <= 0:
        return None
    speedup = sum(w * s for _, w, s, _ in weighed) / covered
    interval = None
    if all(iv is not None for *_, iv in weighed):
        interval = (sum(w * iv[0] for _, w, _, iv in weighed if iv) / covered,
                    sum(w * iv[1] for _, w, _, iv in weighed if iv) / covered)
    shares = tuple(sorted(((b, w / covered, s) for b, w, s, _ in weighed), key=lambda x: -x[1]))
    return TrafficSpeedup(speedup, interval, shares, covered / total)
