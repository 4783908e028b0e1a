""""Does it pay for my traffic?": the verdict's speedups by batch size weighted by where the engine spent its time
over the window, one number with its interval (:func:`traffic_speedup`); and a schedule threshold inside the batch
sizes the engine spends its time at, where K flaps as requests come and go (:func:`flapping`).

The engine spent T_b seconds in steps at batch size b; without speculation the same tokens would have taken
T_b × S_b (S_b the end-to-end speedup estimated there), so the traffic's speedup is Σ T_b S_b / Σ T_b over the batch
sizes with an estimate. The interval adds up the batch sizes' intervals the same way (their errors share the
acceptance and the baseline, so they move together, not independently).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from specscope.core import derived
from specscope.core.model import Snapshot
from specscope.verdict.speedup import SpeedupEstimate, estimate


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


def _weighed(snap: Snapshot) -> list[tuple[int, float, SpeedupEstimate | None]]:
    """Each batch size the window ran: ``(batch size, seconds of steps there, its measured estimate or None)``, in
    batch order; computed once per snapshot."""
    def weigh() -> list[tuple[int, float, SpeedupEstimate | None]]:
        rows = []
        for t in snap.window.step_times.times:
            seconds = t.steps * t.mean_s + t.prefill_s
            est = estimate(snap, batch_size=t.batch_size) if seconds > 0 else None
            rows.append((t.batch_size, seconds, est if est is not None and est.measured else None))
        return sorted(rows, key=lambda r: r[0])

    return derived.once(snap, ("weighed",), weigh)


def traffic_speedup(snap: Snapshot) -> TrafficSpeedup | None:
    """The window's traffic-weighted speedup; None where no batch size the window ran has an estimate measured
    against a baseline."""
    rows = _weighed(snap)
    weighed = [(b, w, est) for b, w, est in rows if est is not None]
    covered = sum(w for _, w, _ in weighed)
    if not weighed or covered <= 0:
        return None
    speedup = sum(w * est.expected_speedup for _, w, est in weighed) / covered
    interval = None
    if all(est.interval is not None for _, _, est in weighed):
        interval = (sum(w * est.interval[0] for _, w, est in weighed if est.interval) / covered,
                    sum(w * est.interval[1] for _, w, est in weighed if est.interval) / covered)
    shares = tuple(sorted(((b, w / covered, est.expected_speedup) for b, w, est in weighed), key=lambda x: -x[1]))
    return TrafficSpeedup(speedup, interval, shares, covered / sum(w for _, w, _ in rows))


@dataclass(frozen=True)
class Flap:
    """A schedule threshold inside the batch sizes the engine spends its time at: K flaps as requests come and go."""

    #: The last batch size of the range below the change, and the K on each side.
    boundary: int
    ks: tuple[int, int]
    #: The batch sizes holding the middle half of the window's step time (25th to 75th percentile).
    band: tuple[int, int]
    #: The one K best for the window's traffic (its speedup weighed as :func:`traffic_speedup` weighs), or None.
    best_k: int | None
    best_speedup: float | None

    def explain(self) -> str:
        """One line for the schedule text."""
        one = (f"; where switching costs (vllm#49548 saw throughput drop), one K for this traffic does not switch: "
               f"K={self.best_k} ({self.best_speedup:.2f}x)"
               if self.best_k is not None and self.best_speedup is not None else "")
        return (f"the schedule changes K at batch {self.boundary} (K={self.ks[0]} to K={self.ks[1]}), inside the "
                f"batch sizes where the engine spends half its step time ({self.band[0]}-{self.band[1]}): as "
                f"requests come and go the batch crosses it every few steps and K switches with it{one}")


def flapping(snap: Snapshot, schedule: list[tuple[int, int, int]]) -> Flap | None:
    """The first threshold of ``schedule`` (a change of K between ranges) within the middle half of the window's
    step time by batch size; None where every threshold lies outside it (or nothing ran)."""
    rows = [(b, w) for b, w, _ in _weighed(snap)]
    total = sum(w for _, w in rows)
    if total <= 0 or len(schedule) < 2:
        return None
    cumulative, lo, hi = 0.0, None, None
    for b, w in rows:
        cumulative += w
        if lo is None and cumulative >= 0.25 * total:
            lo = b
        if hi is None and cumulative >= 0.75 * total:
            hi = b
    if lo is None or hi is None:
        return None
    for (_, end, k0), (_, _, k1) in itertools.pairwise(schedule):
        if k0 != k1 and lo <= end < hi:
            best = best_single_k(snap)
            return Flap(end, (k0, k1), (lo, hi), *(best if best else (None, None)))
    return None


def best_single_k(snap: Snapshot) -> tuple[int, float] | None:
    """The K > 0 whose speedup, weighed by the window's step time at each batch size with a measured estimate, is
    highest, and that speedup."""
    weighed = [(w, est.by_k) for _, w, est in _weighed(snap) if est is not None]
    total = sum(w for w, _ in weighed)
    if total <= 0:
        return None
    ks = min(len(by_k) for _, by_k in weighed)
    scores = [(sum(w * by_k[k] for w, by_k in weighed) / total, k) for k in range(1, ks)]
    speedup, k = max(scores)
    return k, speedup
