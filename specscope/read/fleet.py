"""A fleet of targets as any reader of them sees it (``specscope top``, ``top --once``, the demo): each target's
last snapshot, its source's health, and a bounded history.

Windows are computed here, from the difference between the latest lifetime counters and those ``w`` seconds
earlier, so they work the same for every source (a /metrics page has no window of its own), and ``w`` and ``r``
act on the screen without touching the engine; a source whose storage keeps history (Prometheus) is asked for the
window instead and its answer used once it covers it. Alerts are evaluated on the windowed snapshot.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, replace

from specscope.core import intervals
from specscope.core.model import Snapshot, SpecCounts, StepProfile, Totals
from specscope.export.alerts.evaluate import Alert, Evaluator
from specscope.export.alerts.rules import Thresholds
from specscope.read.scrape import Source, SourceError, WindowedSource
from specscope.verdict import with_baseline

#: History points kept per target (one per poll): 15 minutes at the default interval.
HISTORY = 900


@dataclass(frozen=True, slots=True)
class Point:
    """One poll's numbers, for windows and sparklines."""

    time: float
    lifetime: Totals
    kv_usage: float | None
    #: Each engine's lifetime counts, by engine index (data-parallel servers).
    engines: dict[int, Totals]


def _since(now: Totals, then: Totals | None, fresh: bool) -> Totals:
    """The counts since ``then`` (all of them for an engine that appeared since); empty on the first poll."""
    if fresh:
        return Totals(seconds=0.0, spec=SpecCounts(now.spec.num_spec_tokens) if now.spec else None)
    return now if then is None else intervals.since(now, then)


class Target:
    """One engine on the screen."""

    def __init__(self, source: Source, thresholds: Thresholds | None = None, history: int = HISTORY,
                 baseline: StepProfile | None = None) -> None:
        self.source = source
        self.baseline = baseline
        self.name = source.name
        self.snapshot: Snapshot | None = None
        self.error: str | None = None
        self.fetch_ms: float | None = None
        self.points: deque[Point] = deque(maxlen=history)
        self.polls = 0
        #: Failures of alert rules on this target's snapshots, by rule (shown on the screen, never raised).
        self.rule_errors: dict[str, int] = {}
        self.last_rule_error: str | None = None
        self._evaluator = Evaluator(thresholds=thresholds, clock=self._snapshot_time, on_error=self._rule_failed)

    def _rule_failed(self, where: str, exc: BaseException) -> None:
        self.rule_errors[where] = self.rule_errors.get(where, 0) + 1
        self.last_rule_error = f"{where}: {type(exc).__name__}: {exc}"

    def _snapshot_time(self) -> float:
        return self.snapshot.time if self.snapshot is not None else time.time()

    def poll(self) -> None:
        """Fetch once; a failure of any kind is shown as the target's error, never raised."""
        t0 = time.perf_counter()
        try:
            snap = self.source.fetch()
        except SourceError as exc:
            self.error = str(exc)
            return
        except Exception as exc:  # a source must never take the dashboard down
            self.error = f"{type(exc).__name__}: {exc}"
            return
        self.fetch_ms = 1e3 * (time.perf_counter() - t0)
        if self.baseline is not None:
            snap = with_baseline(snap, self.baseline)
        if self.points and snap.lifetime.generation_tokens < self.points[-1].lifetime.generation_tokens:
            self.points.clear()  # the engine restarted: its counters began again
        self.snapshot, self.error = snap, None
        self.polls += 1
        self.points.append(Point(snap.time, snap.lifetime, snap.kv.block_usage,
                                 {e.index: e.lifetime for e in snap.engines}))

    def reset(self) -> None:
        """Start the window afresh from the latest poll."""
        if self.points:
            last = self.points[-1]
            self.points.clear()
            self.points.append(last)

    def windowed(self, seconds: float) -> Snapshot | None:
        """The last snapshot with its window replaced by the last ``seconds`` of polls."""
        snap = self.snapshot
        if snap is None:
            return None
        if isinstance(self.source, WindowedSource):  # the storage windows the counters: ask it for this window
            self.source.window_s = seconds
            if snap.window_seconds == seconds and "window" not in snap.unavailable:
                return snap
        if self.polls < 2 and "window" not in snap.unavailable:
            return snap  # one poll so far: the source's own window is the best there is
        start = self.points[-1]
        for p in reversed(self.points):
            if snap.time - p.time > seconds:
                break
            start = p
        fresh = start is self.points[-1]
        engines = tuple(replace(e, window=_since(e.lifetime, start.engines.get(e.index), fresh))
                        for e in snap.engines)
        return replace(snap, window=_since(snap.lifetime, start.lifetime, fresh), window_seconds=seconds,
                       engines=engines)

    def evaluate(self) -> list[Alert]:
        """Pending and firing alerts on the snapshot windowed as the thresholds say (their ``window_s``, the window
        the Prometheus rules use), whatever window the screen shows."""
        snap = self.windowed(self._evaluator.thresholds.window_s)
        if snap is not None:
            self._evaluator.evaluate(snap)
        return self._evaluator.active()

    def series(self, what: str, n: int = 60) -> list[float]:
        """Per-poll values for a sparkline: ``acceptance``, ``tokens_per_s`` or ``kv_usage``."""
        pts = list(self.points)[-(n + 1):]
        out: list[float] = []
        for a, b in itertools.pairwise(pts):
            if what == "kv_usage":
                out.append(b.kv_usage or 0.0)
                continue
            d = intervals.since(b.lifetime, a.lifetime)
            if what == "acceptance":
                out.append((d.spec.acceptance_rate or 0.0) if d.spec else 0.0)
            else:
                dt = b.time - a.time
                out.append(d.generation_tokens / dt if dt > 0 else 0.0)
        return out


def run_once(targets: list[Target], settle_s: float = 1.0) -> None:
    """Poll every target; poll again ``settle_s`` later when a source has no window of its own (``--once``)."""
    for t in targets:
        t.poll()
    if settle_s > 0 and any("window" in (t.snapshot.unavailable if t.snapshot else ()) for t in targets):
        time.sleep(settle_s)
        for t in targets:
            t.poll()
