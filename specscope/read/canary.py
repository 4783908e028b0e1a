"""The canary's statistics: two replicas serving the same traffic mix, the incumbent (A) and the candidate (B), compared
on their finished requests' acceptance, per traffic class and overall, with a decision that stays valid however often
it is looked at; and each replica's endpoint read so that every finished request counts once (:class:`Replica`).

The unit is the request: each finished request's acceptance (accepted / drafted draft tokens, in [0, 1]) is one
observation, requests are independent, and each replica's requests of a class share one mean. For each mean there is
a *confidence sequence*: intervals that hold at every request count at once with probability at least 1 − α, so the
decision may be read at every refresh, forever, without its error growing (a fixed-sample interval re-read at every
refresh would, sooner or later, exclude zero between two identical replicas).

The sequence is the predictable plug-in empirical-Bernstein confidence sequence of Waudby-Smith & Ramdas, "Estimating
means of bounded random variables by betting", JRSS-B 86(1), 2024 (arXiv:2010.09686; Theorem 2, eq. (13)-(15)),
the bounded-variable case of the empirical-Bernstein sequences of Howard, Ramdas, McAuliffe & Sekhon, "Time-uniform,
nonparametric, nonasymptotic confidence sequences", Annals of Statistics 49(2), 2021. For observations
X_1, X_2, ... in [0, 1] with mean μ and any predictable bets λ_i in (0, 1)::

    C_t = Σλ_i X_i / Σλ_i  ±  (log(2/α) + Σ v_i ψ_E(λ_i)) / Σλ_i
    v_i = 4 (X_i − μ̂_{i−1})²,  ψ_E(λ) = (−log(1 − λ) − λ) / 4,
    μ̂_t = (1/2 + Σ_{i≤t} X_i) / (t + 1),  s²_t = (1/4 + Σ_{i≤t} (X_i − μ̂_i)²) / (t + 1)

and P(∃t: μ ∉ C_t) ≤ α. The bets here are λ_t = min(3/4, sqrt(2 log(2/α) / (s²_{t−1} g(t)))) with
g(t) = max(n*, t log(1 + t) / log(1 + n*)): the paper's λ ∝ 1/sqrt(t log t), held at its value for a planned
:data:`PLANNED_N` requests until then (the sequence is narrowest about there; any predictable choice keeps it valid,
and in simulation this one decides a 10-point difference in fewer requests than the paper's default). The running
intersection of C_1..C_t is reported (also valid), so a replica's interval only narrows and a decision, once made,
stays.

The difference (B − A) is bounded by the two means' sequences: [low_B − high_A, high_B − low_A]. α is split by
Bonferroni: half to the overall comparison and half shared equally among :data:`MAX_CLASSES` class slots (the first
classes seen take them; a class past them is shown, not judged), and each comparison's α in two for its two means.
So the chance that any decision shown is wrong, at any refresh, is at most α. A row says "better" or "worse" only
when its interval excludes zero, "not yet known" otherwise.

Assumed, not checked: a replica's requests of a class are exchangeable over the run (its traffic mix does not drift
away from the other replica's: both behind one load balancer), and a class's requests' acceptance does not depend on
which requests of it came first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from specscope.core.auth import KEY_WITHHELD
from specscope.core.model import RequestRecord, Snapshot
from specscope.export.alerts.canary import BETTER, NOT_JUDGED, UNKNOWN, WORSE, Reading
from specscope.read.scrape import EndpointSource, SourceError

#: The chance that any decision the canary shows is wrong, all rows and all refreshes together.
ALPHA = 0.05
#: Traffic classes judged (each gets an equal part of half of α); classes past them are shown without a decision.
MAX_CLASSES = 4
#: Requests per replica the sequences are tuned for (narrowest about there; valid at every count).
PLANNED_N = 1000
#: The largest bet (the paper's c, 1/2 or 3/4).
TRUNCATION = 0.75
#: The replicas, in the order every pair here is given: the incumbent (A), then the candidate (B).
REPLICAS = ("incumbent", "candidate")


class MeanSequence:
    """One replica's mean per-request acceptance (of one class, or overall): a confidence sequence at level
    ``alpha`` (two-sided), updated one request at a time in O(1)."""

    def __init__(self, alpha: float, planned_n: int = PLANNED_N, truncation: float = TRUNCATION) -> None:
        if not 0 < alpha < 1 or planned_n < 1 or not 0 < truncation < 1:
            raise ValueError("alpha and truncation are in (0, 1), planned_n at least 1")
        self.alpha = alpha
        self._log = math.log(2 / alpha)
        self._planned = float(planned_n)
        self._plan_log = math.log1p(planned_n)
        self._truncation = truncation
        self.n = 0
        self._sum = 0.0
        self._sum_sq = 0.0
        self._mu = 0.5  # μ̂_{t}
        self._var_sum = 0.25  # 1/4 + Σ (X_i − μ̂_i)²: s²_t = this / (t + 1)
        self._bets = 0.0
        self._bet_x = 0.0
        self._penalty = 0.0
        #: The running intersection of the sequence so far.
        self.low, self.high = 0.0, 1.0
        #: True once an interval missed all the earlier ones: the one-mean assumption failed (the replica changed).
        self.crossed = False

    def add(self, x: float) -> None:
        """One request's acceptance (clamped to [0, 1])."""
        x = 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
        t = self.n + 1
        var = self._var_sum / t  # s²_{t−1}
        g = t * math.log1p(t) / self._plan_log
        g = g if g > self._planned else self._planned
        bet = math.sqrt(2.0 * self._log / (var * g))
        bet = bet if bet < self._truncation else self._truncation
        dev = x - self._mu  # against μ̂_{t−1}
        self._penalty += dev * dev * (-math.log1p(-bet) - bet)  # v ψ_E(λ) = 4 dev² (−log(1 − λ) − λ) / 4
        self._bets += bet
        self._bet_x += bet * x
        self.n = t
        self._sum += x
        self._sum_sq += x * x
        self._mu = (0.5 + self._sum) / (t + 1)
        self._var_sum += (x - self._mu) ** 2
        center = self._bet_x / self._bets
        margin = (self._log + self._penalty) / self._bets
        low = center - margin if center - margin > self.low else self.low
        high = center + margin if center + margin < self.high else self.high
        if low > high:
            self.crossed = True
        else:
            self.low, self.high = low, high

    def extend(self, xs: Iterable[float]) -> None:
        """Several requests' acceptance, in the order they finished."""
        for x in xs:
            self.add(x)

    @property
    def mean(self) -> float | None:
        """The plain mean of the requests so far (None before the first)."""
        return self._sum / self.n if self.n else None

    @property
    def sd(self) -> float | None:
        """The requests' standard deviation (None before the second)."""
        if self.n < 2:
            return None
        return math.sqrt(max(0.0, (self._sum_sq - self._sum * self._sum / self.n) / (self.n - 1)))


@dataclass(frozen=True)
class Side:
    """One replica's requests in a row."""

    requests: int
    mean: float | None
    sd: float | None
    interval: tuple[float, float]

    def to_dict(self) -> dict[str, object]:
        """As the JSON document writes it."""
        return {"requests": self.requests, "mean": self.mean, "sd": self.sd, "interval": list(self.interval)}


@dataclass(frozen=True)
class Row:
    """One comparison: all traffic (``traffic_class`` None) or one class."""

    traffic_class: str | None
    #: The class's share of both replicas' requests (1.0 for all traffic).
    share: float
    incumbent: Side
    candidate: Side
    #: The error this row's interval allows (its part of :data:`ALPHA`); None for a class not judged.
    alpha: float | None
    #: candidate − incumbent mean acceptance per request; None until both have a request.
    difference: float | None
    #: The confidence sequence's bounds on it ((-1, 1) before any request).
    interval: tuple[float, float]
    decision: str
    #: True where a replica's sequence missed its own earlier intervals (its acceptance moved during the run).
    crossed: bool = False

    def reading(self) -> Reading:
        """The row as the alert and the gauges read it."""
        return Reading(self.traffic_class, self.decision, self.difference, *self.interval, self.share,
                       (self.incumbent.requests, self.candidate.requests), self.alpha)

    def to_dict(self) -> dict[str, object]:
        """As the JSON document writes it."""
        return {"class": self.traffic_class, "share": self.share, "incumbent": self.incumbent.to_dict(),
                "candidate": self.candidate.to_dict(), "alpha": self.alpha, "difference": self.difference,
                "interval": list(self.interval), "decision": self.decision, "crossed": self.crossed}


def decide(low: float, high: float) -> str:
    """"better" when the interval on candidate − incumbent lies above zero, "worse" below, else "not yet known"."""
    return BETTER if low > 0 else WORSE if high < 0 else UNKNOWN


class _Pair:
    """Both replicas' sequences for one row (None: a class past the slots, counted without a sequence)."""

    def __init__(self, alpha: float | None, planned_n: int) -> None:
        self.alpha = alpha
        self.sides: tuple[MeanSequence, MeanSequence] | None = None
        if alpha is not None:
            self.sides = (MeanSequence(alpha / 2, planned_n), MeanSequence(alpha / 2, planned_n))
        self.counts = [0, 0]
        self.sums = [0.0, 0.0]

    def add(self, replica: int, x: float) -> None:
        self.counts[replica] += 1
        self.sums[replica] += 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
        if self.sides is not None:
            self.sides[replica].add(x)

    def row(self, name: str | None, share: float) -> Row:
        if self.sides is None:
            sides = [Side(n, s / n if n else None, None, (0.0, 1.0)) for n, s in zip(self.counts, self.sums,
                                                                                      strict=True)]
            ma, mb = sides[0].mean, sides[1].mean
            diff = None if ma is None or mb is None else mb - ma
            return Row(name, share, sides[0], sides[1], None, diff, (-1.0, 1.0), NOT_JUDGED)
        a, b = self.sides
        low, high = b.low - a.high, b.high - a.low
        diff = None if a.mean is None or b.mean is None else b.mean - a.mean
        return Row(name, share, Side(a.n, a.mean, a.sd, (a.low, a.high)), Side(b.n, b.mean, b.sd, (b.low, b.high)),
                   self.alpha, diff, (low, high), decide(low, high), a.crossed or b.crossed)


class Canary:
    """Incumbent against candidate, overall and per class, fed one finished request at a time."""

    def __init__(self, alpha: float = ALPHA, max_classes: int = MAX_CLASSES, planned_n: int = PLANNED_N) -> None:
        if not 0 < alpha < 1 or max_classes < 0 or planned_n < 1:
            raise ValueError("alpha is in (0, 1), max_classes 0 or more, planned_n at least 1")
        self.alpha = alpha
        self.max_classes = max_classes
        self.planned_n = planned_n
        #: The overall comparison's α (all of it without class slots), and each class slot's.
        self.overall_alpha = alpha / 2 if max_classes else alpha
        self.class_alpha = alpha / 2 / max_classes if max_classes else None
        self._overall = _Pair(self.overall_alpha, planned_n)
        self._classes: dict[str, _Pair] = {}
        self._judged = 0

    def add_value(self, replica: int, traffic_class: str | None, acceptance: float) -> None:
        """One request of ``replica`` (0 incumbent, 1 candidate) and its acceptance."""
        self._overall.add(replica, acceptance)
        if traffic_class is None:
            return
        pair = self._classes.get(traffic_class)
        if pair is None:
            judged = self._judged < self.max_classes
            self._judged += judged
            pair = self._classes[traffic_class] = _Pair(self.class_alpha if judged else None, self.planned_n)
        pair.add(replica, acceptance)

    def add(self, replica: int, records: Iterable[RequestRecord]) -> int:
        """Finished requests of ``replica``, in the order they finished; those without drafts are skipped. Returns
        how many counted."""
        counted = 0
        for r in records:
            x = r.acceptance_rate
            if x is None or math.isnan(x):
                continue
            self.add_value(replica, r.class_name, x)
            counted += 1
        return counted

    def overall(self) -> Row:
        """All traffic."""
        return self._overall.row(None, 1.0)

    def rows(self) -> list[Row]:
        """All traffic, then each class, judged ones first, most requests first."""
        total = sum(self._overall.counts) or 1
        classes = sorted(self._classes.items(), key=lambda kv: (kv[1].sides is None, -sum(kv[1].counts), kv[0]))
        return [self.overall(), *(pair.row(name, sum(pair.counts) / total) for name, pair in classes)]


class Replica:
    """One replica's endpoint: its snapshot, and each finished request once, in the order they finished."""

    def __init__(self, role: str, source: EndpointSource, key_withheld: bool = False) -> None:
        self.role = role
        self.source = source
        self.key_withheld = key_withheld
        self.snapshot: Snapshot | None = None
        self.error: str | None = None
        #: Requests that finished while unread (a gap in the endpoint's numbering: more than it keeps between polls).
        self.missed = 0
        self._cursor = 0
        self._started: float | None = None

    @property
    def url(self) -> str:
        """The endpoint's base URL."""
        return self.source.root

    def poll(self, skip: bool = False) -> list[RequestRecord]:
        """The requests finished since the last poll (``skip``: note them as read, return none). SourceError when
        the endpoint cannot be read (a 401 says why the key was not sent where it was not)."""
        try:
            snap = self.source.fetch()
        except SourceError as exc:
            self.error = str(exc) + (f" ({KEY_WITHHELD})" if self.key_withheld and str(exc).endswith("HTTP 401")
                                     else "")
            raise SourceError(self.error) from None
        self.error = None
        first = self._started is None
        if not first and snap.started_at != self._started:
            self._cursor = 0  # restarted: its records are numbered from 1 again
        self._started = snap.started_at
        new = sorted((r for r in snap.requests if r.final_seq > self._cursor), key=lambda r: r.final_seq)
        if new:
            if not first and new[0].final_seq > self._cursor + 1:
                self.missed += new[0].final_seq - self._cursor - 1
            self._cursor = new[-1].final_seq
        self.snapshot = snap
        return [] if skip else new

    def engine_key(self) -> tuple[Any, ...] | None:
        """What the comparison is of: the draft, its method and K (a change restarts it)."""
        e = self.snapshot.engine if self.snapshot else None
        return None if e is None else (e.model, e.draft_model, e.method, e.num_speculative_tokens)

    def described(self) -> str:
        """"http://... (draft d, draft_model, K=4)"."""
        e = self.snapshot.engine if self.snapshot else None
        if e is None:
            return self.url
        k = f", K={e.num_speculative_tokens}" if e.num_speculative_tokens is not None else ""
        return f"{self.url} (draft {e.draft_model or e.method or 'none'}{k})"


def different_targets(a: Snapshot, b: Snapshot) -> str | None:
    """The line that says two replicas serve different targets; None where they serve the same (or one is unknown)."""
    ma, mb = a.engine.model, b.engine.model
    if ma and mb and ma != mb:
        return (f"the replicas serve different targets (incumbent {ma}, candidate {mb}): a canary compares drafts "
                "of one target on the same traffic")
    return None
