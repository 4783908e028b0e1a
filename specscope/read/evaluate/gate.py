"""The promotion gate of ``specscope evaluate --gate``: from what was measured of a candidate draft and the incumbent
on the same held-out traffic (:class:`~specscope.read.evaluate.results.Gate`), decide **promote**, **hold** or
**reject**, and why (:func:`decide`); its statistics are :mod:`specscope.read.evaluate.stats`, its JSON, text and
page :mod:`specscope.read.evaluate.gate_report`.

**What is compared.** At each batch size, each traffic class c ran in windows of its own prompts, round by round,
the target without speculation and each draft's engine on the same prompts (round i of both drafts starts at the same
prompt of the class). Round i's speedup of draft d on class c is x(d, c, i) = speculative / plain tokens/s of its
window pair. The traffic's speedup under d in round i weighs the classes by where a plain engine spends its time
on this traffic: a class with a share s(c) of the output tokens takes s(c) / P(c) of the plain time (P(c) its plain
tokens/s, the geometric mean of its windows), so with w(c) those times normalised,

    S(d, i) = 1 / Σ_c w(c) / x(d, c, i)        (plain time over speculative time, summed over the classes)

and the figure the gate decides on is the candidate's speedup over the incumbent's, R(i) = S(new, i) / S(old, i).

**The interval** is a paired t-interval on the rounds' logarithms: exp(mean ± t(n−1) · sd / √n) of log R(i), the
usual interval for a ratio of two products' means taken on the log scale (Schuirmann, "A comparison of the two
one-sided tests procedure and the power approach for assessing the equivalence of average bioavailability",
J. Pharmacokin. Biopharm. 15(6), 1987; FDA guidance "Statistical Approaches to Establishing Bioequivalence",
2001, §VI: log-transformed ratios and their t-interval), paired because both drafts' round i ran the same
prompts (what makes one round harder for a draft makes it harder for the other). Rounds are few (3 to 10), so
Student's t, not a normal quantile, and not a bootstrap over rounds, whose percentile interval from a handful of
rounds covers far less than it claims (``stats.bootstrap_interval`` is kept to show it: the coverage simulation in
``tests/read/test_gate.py`` measures both). Each class's own ratio x(new, c, i) / x(old, c, i) gets the same
interval twice: at the confidence, to show it does not lose more than the margin (every class must, an
intersection-union test, which needs no multiplicity correction: Berger, "Multiparameter hypothesis testing and
acceptance sampling", Technometrics 24(4), 1982), and at a Bonferroni-adjusted confidence,
1 − (1 − confidence) / classes, to show it does (any one class can reject, so their errors add up).

**The rule** is a superiority test on the traffic and a non-inferiority test on every class (ICH E9, "Statistical
Principles for Clinical Trials", 1998, §3.3.2, and FDA, "Non-Inferiority Clinical Trials to Establish
Effectiveness", 2016: a margin, and an interval's bound against it):

- **reject** where the traffic's interval lies below 1 (the candidate is slower on this traffic), or any class's
  Bonferroni interval lies wholly below 1 − margin (it loses more than the margin there: a candidate that wins
  the weak class by losing a big one is rejected);
- **promote** where the traffic's interval lies above 1 and every class's interval lies above 1 − margin (shown not
  to lose more than the margin);
- **hold** otherwise: not yet known; more traffic (more rounds) will tell, and the reasons say about how many.

At several batch sizes each is decided so and the gate is the strictest: reject where any rejects, promote where
all promote. A candidate whose engine fails (vLLM refuses it, or it dies) is rejected; an incumbent whose engine
fails leaves nothing decided.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specscope.core import classes
from specscope.core.model import Snapshot
from specscope.read.evaluate.results import Cell, Gate
from specscope.read.evaluate.stats import CONFIDENCE, Estimate, log_interval, rounds_to_decide

PROMOTE, HOLD, REJECT, UNDECIDED = "promote", "hold", "reject", "undecided"
#: The exit status of each decision, for a CI job to branch on (2 stays bad input, 130 an interrupt).
EXIT_CODES = {PROMOTE: 0, HOLD: 1, REJECT: 3, UNDECIDED: 4}
#: The default margin: a class may lose at most this fraction of its speedup under the incumbent.
MARGIN = 0.05
__all__ = ["CONFIDENCE", "EXIT_CODES", "MARGIN", "Decision", "decide", "headline"]
INTERVAL_METHOD = ("paired Student-t interval on the log of the rounds' candidate/incumbent speedup ratio (same "
                   "prompts in the same round); a class's loss shown at the confidence, a class's loss beyond the "
                   "margin at the Bonferroni-adjusted class_confidence")
RULE = ("promote: the traffic-weighted speedup ratio's interval above 1 and every class's above 1 - margin; reject: "
        "the traffic's interval below 1 or any class's (Bonferroni) interval below 1 - margin; hold: otherwise (not "
        "yet known)")


# -- the decision
@dataclass(frozen=True)
class ClassResult:
    """One class at one batch size under both drafts."""

    name: str
    #: Its share of the traffic's output tokens, and of the plain engine's time on the traffic (the weight).
    share: float
    weight: float | None
    incumbent: Estimate | None
    candidate: Estimate | None
    #: Candidate / incumbent speedup, paired rounds, at the confidence (promotion needs it above 1 - margin) and
    #: at the Bonferroni-adjusted one (rejection needs it below).
    ratio: Estimate | None
    strict: Estimate | None
    #: True: it loses more than the margin (the Bonferroni interval wholly below 1 - margin); False: shown not to
    #: (the interval above it); None: not yet known.
    regresses: bool | None
    #: About how many rounds would tell, where it is not yet known.
    rounds_to_decide: int | None = None


@dataclass(frozen=True)
class BatchResult:
    """The gate at one batch size."""

    batch_size: int
    decision: str
    reasons: tuple[str, ...]
    #: The traffic-weighted speedup over plain decoding under each draft, and the candidate's over the incumbent's.
    incumbent: Estimate | None
    candidate: Estimate | None
    ratio: Estimate | None
    classes: tuple[ClassResult, ...]
    #: About how many rounds would decide a hold (its weighted ratio as measured); None otherwise or not known.
    rounds_to_decide: int | None = None


@dataclass(frozen=True)
class Decision:
    """promote, hold, reject (or undecided: the incumbent never ran), why, and each batch size's figures."""

    decision: str
    reasons: tuple[str, ...]
    batches: tuple[BatchResult, ...]
    class_confidence: float | None = None

    @property
    def exit_code(self) -> int:
        """The exit status (:data:`EXIT_CODES`)."""
        return EXIT_CODES[self.decision]


def _paired(inc: Cell | None, cand: Cell | None) -> list[tuple[float, float, float, float]]:
    """The rounds both drafts measured: (incumbent plain, incumbent speculative, candidate plain, candidate
    speculative) tokens/s, rounds with a zero dropped."""
    if inc is None or cand is None:
        return []
    rows = zip(inc.plain, inc.spec, cand.plain, cand.spec, strict=False)
    return [r for r in rows if min(r) > 0]


def _pct(x: float) -> str:
    return f"{x:.0%}"


@dataclass(frozen=True)
class Traffic:
    """The classes of one batch size, paired round by round, and the traffic's speedup in each round."""

    #: class -> the rounds both drafts measured (:func:`_paired`).
    paired: dict[str, list[tuple[float, float, float, float]]]
    #: class -> its share of the plain engine's time on the traffic.
    weights: dict[str, float]
    #: The classes with a share whose rounds are missing (the traffic's speedup is then not known).
    missing: list[str]
    #: Each round's traffic speedup over plain decoding, under the incumbent and under the candidate.
    incumbent: list[float]
    candidate: list[float]


def traffic_rounds(gate: Gate, b: int) -> Traffic:
    """The rounds at batch size ``b``: S(d, i) = 1 / Σ_c w(c) / x(d, c, i) over the classes with a share, w(c) the
    share of the plain time (output-token share over plain tokens/s, the geometric mean of every plain window of the
    class under either draft), over the rounds every such class has."""
    inc_cells, cand_cells = gate.incumbent.cells.get(b, {}), gate.candidate.cells.get(b, {})
    names = sorted(set(inc_cells) | set(cand_cells) | {c for c, s in gate.shares.items() if s > 0})
    paired = {c: _paired(inc_cells.get(c), cand_cells.get(c)) for c in names}
    plain = {c: statistics.geometric_mean([x for r in rows for x in (r[0], r[2])]) for c, rows in paired.items()
             if rows}
    weighed = {c: gate.shares.get(c, 0.0) / plain[c] for c in plain if gate.shares.get(c, 0.0) > 0}
    total = sum(weighed.values())
    weights = {c: w / total for c, w in weighed.items()} if total > 0 else {}
    needed = [c for c in names if gate.shares.get(c, 0.0) > 0]
    missing = [c for c in needed if not paired[c]]
    n = min((len(paired[c]) for c in needed), default=0) if needed and not missing else 0
    s_old = [1.0 / sum(weights[c] * paired[c][i][0] / paired[c][i][1] for c in needed) for i in range(n)]
    s_new = [1.0 / sum(weights[c] * paired[c][i][2] / paired[c][i][3] for c in needed) for i in range(n)]
    return Traffic(paired, weights, missing, s_old, s_new)


def _batch(gate: Gate, b: int, class_conf: float) -> BatchResult:
    t = traffic_rounds(gate, b)
    paired, weights, missing = t.paired, t.weights, t.missing
    names = sorted(paired)
    margin, floor = gate.margin, 1.0 - gate.margin
    classes = []
    for c in names:
        rows = paired[c]
        ratios = [(cs / cp) / (s / p) for p, s, cp, cs in rows]
        ratio, strict = log_interval(ratios, gate.confidence), log_interval(ratios, class_conf)
        regresses, more = None, None
        if ratio is not None and ratio.low is not None and strict is not None and strict.high is not None:
            regresses = True if strict.high < floor else False if ratio.low >= floor else None
            if regresses is None:
                more = rounds_to_decide(ratio if ratio.value > floor else strict, floor,
                                        gate.confidence if ratio.value > floor else class_conf)
        classes.append(ClassResult(c, gate.shares.get(c, 0.0), weights.get(c),
                                   log_interval([s / p for p, s, _, _ in rows], gate.confidence),
                                   log_interval([cs / cp for _, _, cp, cs in rows], gate.confidence),
                                   ratio, strict, regresses, more))
    n = len(t.incumbent)
    inc_w, cand_w = log_interval(t.incumbent, gate.confidence), log_interval(t.candidate, gate.confidence)
    ratio_w = log_interval([x / y for x, y in zip(t.candidate, t.incumbent, strict=True)], gate.confidence)
    by_name = {r.name: r for r in classes}
    weak = by_name.get(gate.weak or "")
    rejects, holds = [], []
    if missing:
        holds.append(f"class {', '.join(missing)} not measured under both drafts: the traffic's speedup is not known")
    elif not t.weights:
        holds.append("no class with a share of the traffic was measured")
    elif ratio_w is None or ratio_w.low is None or ratio_w.high is None:
        holds.append(f"{n} round(s) measured under both drafts: an interval needs 2 or more (--rounds)")
    elif ratio_w.high < 1.0:
        rejects.append(f"the candidate is slower on this traffic: its speedup is {ratio_w.text()} the incumbent's, "
                       f"the interval below 1")
    elif ratio_w.low <= 1.0:
        more = rounds_to_decide(ratio_w, 1.0, gate.confidence)
        holds.append(f"not yet known on this traffic: the candidate's speedup is {ratio_w.text()} the incumbent's, "
                     "the interval spanning 1" + (f"; about {more} rounds would decide it if the difference is as "
                                                  "measured" if more else "; the two are about equal"))
    for r in classes:
        share = f" ({_pct(r.share)} of the traffic)" if r.share > 0 else " (none of the traffic's shares)"
        if r.ratio is None or r.ratio.low is None:
            if not missing and ratio_w is not None and ratio_w.low is not None:
                holds.append(f"class {r.name}: fewer than 2 rounds under both drafts, its loss or gain not known")
        elif r.regresses and r.strict is not None:
            gains = (f", though the weak class {weak.name} gains ({weak.ratio.text()})"
                     if weak is not None and weak is not r and weak.ratio is not None and weak.ratio.value > 1.0
                     else "")
            rejects.append(f"class {r.name}{share} loses more than the {_pct(margin)} margin: the candidate's speedup "
                           f"there is {r.strict.text()} the incumbent's{gains}")
        elif r.regresses is None:
            holds.append(f"class {r.name}{share} may lose more than the {_pct(margin)} margin: {r.ratio.text()} the "
                         f"incumbent's speedup there, the interval spanning {floor:.2f}: not yet known"
                         + (f"; about {r.rounds_to_decide} rounds would tell if it is as measured"
                            if r.rounds_to_decide else ""))
    if rejects:
        decision, reasons = REJECT, rejects
    elif holds:
        decision, reasons = HOLD, holds
    else:
        assert ratio_w is not None
        lows = [(r.ratio.low, r.name, r.ratio.text()) for r in classes if r.ratio is not None and r.ratio.low]
        least = min(lows)
        weak_says = (f"; the weak class {weak.name}: {weak.ratio.text()}" if weak is not None and weak.ratio else "")
        decision, reasons = PROMOTE, [
            f"the candidate's speedup is {ratio_w.text()} the incumbent's on this traffic, the interval above 1; no "
            f"class loses more than the {_pct(margin)} margin (the least sure: {least[1]}, {least[2]}){weak_says}"]
    more = None
    if decision == HOLD and ratio_w is not None and ratio_w.low is not None and ratio_w.high is not None \
            and ratio_w.low <= 1.0 <= ratio_w.high:
        more = rounds_to_decide(ratio_w, 1.0, gate.confidence)
    return BatchResult(b, decision, tuple(reasons), inc_w, cand_w, ratio_w, tuple(classes), more)


def class_confidence(gate: Gate) -> float:
    """Each class's confidence: Bonferroni over the classes measured (any one of them can reject)."""
    names = {c for arm in (gate.incumbent, gate.candidate) for cells in arm.cells.values() for c in cells}
    names |= {c for c, s in gate.shares.items() if s > 0}
    return 1.0 - (1.0 - gate.confidence) / max(1, len(names))


def decide(gate: Gate) -> Decision:
    """promote, hold or reject the candidate, and why (the module's rule)."""
    cand, inc = gate.candidate.candidate, gate.incumbent.candidate
    if inc.status == "failed":
        return Decision(UNDECIDED, (f"the incumbent's engine failed ({inc.note}): nothing to compare with",), ())
    if cand.status == "failed":
        return Decision(REJECT, (f"the candidate's engine failed at K={gate.k} ({cand.note})",), ())
    conf = class_confidence(gate)
    batches = tuple(_batch(gate, b, conf) for b in gate.batch_sizes)
    several = len(batches) > 1

    def said(r: BatchResult) -> list[str]:
        return [f"batch {r.batch_size}: {x}" if several else x for x in r.reasons]

    rejected = [x for r in batches if r.decision == REJECT for x in said(r)]
    if rejected:
        return Decision(REJECT, tuple(rejected), batches, conf)
    held = [x for r in batches if r.decision == HOLD for x in said(r)]
    if held:
        return Decision(HOLD, tuple(held), batches, conf)
    return Decision(PROMOTE, tuple(x for r in batches for x in said(r)), batches, conf)


def headline(gate: Gate, d: Decision) -> str:
    """"PROMOTE (exit 0): new-draft over old-draft at K=4: <the first reason>"."""
    name = {PROMOTE: "PROMOTE", HOLD: "HOLD", REJECT: "REJECT", UNDECIDED: "NO DECISION"}[d.decision]
    return (f"{name} (exit {d.exit_code}): {gate.candidate.candidate.short} over {gate.incumbent.candidate.short} at "
            f"K={gate.k}" + (f": {d.reasons[0]}" if d.reasons else ""))


# -- the traffic from a live snapshot
def live_tokens(snap: Snapshot) -> dict[str, int]:
    """Each class's output tokens over the server's life (its speculative steps and accepted tokens: a step yields
    one token and those accepted), :data:`~specscope.core.classes.OTHER` left out (names past the hub's limit)."""
    return {tc.name: tc.lifetime.spec_steps + tc.lifetime.accepted for tc in snap.classes
            if tc.name != classes.OTHER and tc.lifetime.spec_steps}


def shares_from_snapshot(snap: Snapshot, names: Sequence[str]) -> tuple[dict[str, float], float]:
    """The shares of ``names`` in the live traffic's output tokens (normalised over them), and the share of the
    live traffic they cover; ValueError where none of them has traffic there."""
    tokens = live_tokens(snap)
    total = sum(tokens.values()) + sum(tc.lifetime.spec_steps + tc.lifetime.accepted for tc in snap.classes
                                       if tc.name == classes.OTHER)
    ours = {c: tokens.get(c, 0) for c in names}
    covered = sum(ours.values())
    if covered <= 0:
        live = ", ".join(sorted(tokens)) or "none with speculative counts"
        raise ValueError(f"none of the prompt file's classes ({', '.join(sorted(names))}) has traffic there "
                         f"(its classes: {live})")
    return {c: n / covered for c, n in ours.items()}, covered / total


def weak_from_snapshot(snap: Snapshot) -> tuple[str, str] | None:
    """The class a live server's draft is weakest on, and why that one: the class its capture collects training
    data for (``weak_now`` of capture ``weak``, or the classes named; the lowest acceptance among several), else the
    class with the lowest acceptance over the server's life; None where no class has speculative counts."""
    acceptance = {tc.name: tc.lifetime.acceptance_rate for tc in snap.classes
                  if tc.name != classes.OTHER and tc.lifetime.draft_tokens}
    cap = snap.capture
    if cap is not None:
        parts = [c.strip() for c in cap.classes.split(",") if c.strip()]
        named = [*(cap.weak_now if "weak" in parts else ()),
                 *(c.removeprefix("baggage:") for c in parts if c != "weak")]
        if named:
            name = min(named, key=lambda c: (acceptance.get(c) is None, acceptance.get(c) or 0.0))
            return name, "the class the server's capture collects"
    rates = [(rate, name) for name, rate in acceptance.items() if rate is not None]
    if not rates:
        return None
    return min(rates)[1], "the lowest acceptance over the server's life"
