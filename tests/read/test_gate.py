"""The promotion gate of ``specscope evaluate --gate`` without engines: the decision on synthetic measurements
(promote; reject on a big class lost while the weak class wins; hold while the intervals straddle), its interval's
coverage by simulation, every bad input caught before an engine starts, the JSON and its documented schema, the
report with the decision first, and the runner's pairing of the two drafts on the same prompts."""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specscope.core.model import CaptureStatus, ClassCounts, TrafficClass
from specscope.read.evaluate import cli as evaluate_cli
from specscope.read.evaluate import gate, gate_report, render, runner, stats
from specscope.read.evaluate.results import Candidate, Cell, Evaluation, Gate, GateArm
from specscope.read.workload import Workload
from specscope.state.hub import Hub
from tests.conftest import REPO
from tests.read.test_evaluate import run_cli, write

INC_BIG = [1.50, 1.53, 1.47, 1.51, 1.49, 1.52]
INC_WEAK = [1.05, 1.08, 1.02, 1.06, 1.04, 1.07]
PLAIN = {"big": 100.0, "weak": 60.0}


def arm(name: str, speedups: dict[str, list[float]], batch: int = 8, status: str = "measured",
        acceptance: dict[str, float] | None = None) -> GateArm:
    """A draft's gate measurements: each class's rounds at ``batch``, plain at :data:`PLAIN` tok/s."""
    a = GateArm(Candidate(f"/m/{name}", "draft_model", f"/m/{name}", status=status,
                          tokenizer={"verdict": "identical", "reasons": [], "warnings": []}))
    a.cells[batch] = {c: Cell([PLAIN[c]] * len(xs), [PLAIN[c] * x for x in xs]) for c, xs in speedups.items()}
    for c, rate in (acceptance or {}).items():
        a.acceptance[c] = ClassCounts(40, 400, 1600, round(1600 * rate), (300, 250, 200, 150))
        a.acceptance_interval[c] = (rate - 0.05, rate + 0.05)
    return a


def scaled(xs: list[float], factor: float) -> list[float]:
    return [x * factor for x in xs]


def make(big: list[float], weak: list[float], shares: dict[str, float] | None = None, **kw: Any) -> Gate:
    """The incumbent at :data:`INC_BIG` / :data:`INC_WEAK`, the candidate at ``big`` / ``weak``."""
    return Gate(4, [8], arm("new", {"big": big, "weak": weak}, acceptance={"big": 0.7, "weak": 0.58}),
                arm("old", {"big": INC_BIG, "weak": INC_WEAK}, acceptance={"big": 0.7, "weak": 0.30}),
                shares or {"big": 0.7, "weak": 0.3}, weak="weak", weak_basis="--weak", **kw)


#: The candidate: the weak class up from about 1.05x to 1.5x; the big class as it was, or 13% down.
WEAK_WINS = [1.50, 1.55, 1.46, 1.52, 1.49, 1.53]
BIG_SAME = [1.52, 1.55, 1.50, 1.52, 1.51, 1.54]
BIG_LOST = scaled(BIG_SAME, 0.86)


def test_student_t_quantiles_match_the_tables() -> None:
    for df, want in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452)):
        assert stats.t_quantile(0.975, df) == pytest.approx(want, abs=1e-4)
    assert stats.t_quantile(0.995, 5) == pytest.approx(4.0321, abs=1e-4)
    assert stats.t_quantile(0.025, 4) == pytest.approx(-2.7764, abs=1e-4)


def test_promote_where_the_traffic_gains_surely_and_no_class_loses_beyond_the_margin() -> None:
    g = make(BIG_SAME, WEAK_WINS)
    d = gate.decide(g)
    assert (d.decision, d.exit_code) == ("promote", 0)
    b = d.batches[0]
    assert b.ratio is not None and b.ratio.low is not None and b.ratio.low > 1.0 and b.ratio.rounds == 6
    by = {c.name: c for c in b.classes}
    assert by["weak"].ratio is not None and by["weak"].ratio.value == pytest.approx(1.43, abs=0.01)
    assert by["big"].regresses is False and by["weak"].regresses is False
    # The traffic's speedup weighs plain time: 0.7 of the tokens at 100 tok/s, 0.3 at 60 tok/s.
    assert by["big"].weight == pytest.approx((0.7 / 100) / (0.7 / 100 + 0.3 / 60))
    assert "the interval above 1" in d.reasons[0] and "the weak class weak: 1.43x" in d.reasons[0]
    assert gate.headline(g, d).startswith("PROMOTE (exit 0): new over old at K=4: the candidate's speedup is 1.1")


def test_reject_a_candidate_that_wins_the_weak_class_by_losing_the_big_one() -> None:
    d = gate.decide(make(BIG_LOST, WEAK_WINS))
    assert (d.decision, d.exit_code) == ("reject", 3)
    big = next(c for c in d.batches[0].classes if c.name == "big")
    assert big.regresses is True and big.ratio is not None and big.ratio.high is not None and big.ratio.high < 0.95
    assert any(r.startswith("class big (70% of the traffic) loses more than the 5% margin") and
               "though the weak class weak gains (1.43x" in r for r in d.reasons), d.reasons
    # Even where the traffic as a whole gains, a class lost beyond the margin rejects: a small one, here.
    d = gate.decide(make(scaled(BIG_SAME, 1.05), scaled(INC_WEAK, 0.8), shares={"big": 0.95, "weak": 0.05}))
    ratio = d.batches[0].ratio
    assert ratio is not None and ratio.low is not None and ratio.low > 1.0
    assert d.decision == "reject" and d.reasons == (
        "class weak (5% of the traffic) loses more than the 5% margin: the candidate's speedup there is 0.80x "
        "[0.80-0.80] the incumbent's",)
    # A wider margin lets the same loss through.
    assert gate.decide(make(BIG_LOST, WEAK_WINS, margin=0.2)).decision != "reject"


def test_reject_where_the_traffic_is_surely_slower() -> None:
    d = gate.decide(make(scaled(BIG_SAME, 0.97), scaled(INC_WEAK, 0.9), margin=0.2))
    assert d.decision == "reject"
    assert d.reasons[0].startswith("the candidate is slower on this traffic: its speedup is 0.9")


def test_hold_while_the_intervals_straddle_with_the_rounds_that_would_decide() -> None:
    noise = [1.06, 0.98, 1.05, 0.97, 1.04, 1.02]  # the candidate 2% ahead, rounds 4% apart
    d = gate.decide(make([x * f for x, f in zip(INC_BIG, noise, strict=True)],
                         [x * f for x, f in zip(INC_WEAK, noise, strict=True)]))
    assert (d.decision, d.exit_code) == ("hold", 1)
    b = d.batches[0]
    assert b.ratio is not None and b.ratio.low is not None and b.ratio.high is not None
    assert b.ratio.low < 1.0 < b.ratio.high
    assert any("not yet known on this traffic" in r for r in d.reasons), d.reasons
    assert b.rounds_to_decide is not None and b.rounds_to_decide > 6
    # One round: no interval, nothing decided either way.
    one = gate.decide(make(BIG_SAME[:1], WEAK_WINS[:1]))
    assert one.decision == "hold" and "an interval needs 2 or more" in one.reasons[0]


def test_at_several_batch_sizes_the_strictest_decision_and_failed_engines() -> None:
    g = make(BIG_SAME, WEAK_WINS)
    g.batch_sizes = [8, 16]
    g.candidate.cells[16] = {"big": Cell([100.0] * 6, [100 * x for x in BIG_LOST]),
                             "weak": Cell([60.0] * 6, [60 * x for x in WEAK_WINS])}
    g.incumbent.cells[16] = dict(g.incumbent.cells[8])
    d = gate.decide(g)
    assert [r.decision for r in d.batches] == ["promote", "reject"] and d.decision == "reject"
    assert all(r.startswith("batch 16: ") for r in d.reasons)
    g.candidate.candidate.status, g.candidate.candidate.note = "failed", "ValueError: no"
    assert gate.decide(g).decision == "reject" and "the candidate's engine failed" in gate.decide(g).reasons[0]
    g.incumbent.candidate.status = "failed"
    d = gate.decide(g)
    assert (d.decision, d.exit_code) == ("undecided", 4) and "nothing to compare with" in d.reasons[0]
    # A class with a share never measured: the traffic's speedup is not known.
    g = make(BIG_SAME, WEAK_WINS, shares={"big": 0.6, "weak": 0.3, "rare": 0.1})
    d = gate.decide(g)
    assert d.decision == "hold" and "class rare not measured under both drafts" in d.reasons[0]


def simulate(rng: random.Random, rounds: int, old: dict[str, float], new: dict[str, float], heavy: bool) -> Gate:
    """One gate run: each window's tokens/s drawn around the truth (lognormal, or Student-t with 3 degrees of
    freedom: heavy tails), the prompts of a round moving both drafts alike, and a drift of each draft's phase."""
    def z() -> float:
        x = rng.gauss(0, 1)
        return x / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3) / math.sqrt(3) if heavy else x

    prompts = {c: [0.03 * z() for _ in range(rounds)] for c in old}
    arms = []
    for truth in (new, old):
        drift = 0.1 * z()
        arms.append(GateArm(Candidate("d", "draft_model"), {8: {
            c: Cell([PLAIN[c] * math.exp(drift + 0.04 * z()) for _ in range(rounds)],
                    [PLAIN[c] * truth[c] * math.exp(drift + prompts[c][i] + 0.04 * z()) for i in range(rounds)])
            for c in truth}}))
    return Gate(4, [8], arms[0], arms[1], {"big": 0.7, "weak": 0.3})


def true_ratio(old: dict[str, float], new: dict[str, float]) -> float:
    w = {c: s / PLAIN[c] for c, s in {"big": 0.7, "weak": 0.3}.items()}
    return sum(w[c] / old[c] for c in w) / sum(w[c] / new[c] for c in w)


@pytest.mark.parametrize(("rounds", "heavy"), [(3, False), (6, True)])
def test_the_intervals_cover_the_truth_as_often_as_they_claim(rounds: int, heavy: bool) -> None:
    """The paired log-t interval of the traffic's ratio covers the true ratio about 95% of the time, from 3 rounds
    on and with heavy tails; so does each class's, and its Bonferroni interval (97.5% with two classes) at least
    95%. The percentile bootstrap over the same rounds covers far less: why the gate does not use it."""
    old, new = {"big": 1.5, "weak": 1.1}, {"big": 1.45, "weak": 1.6}
    truth, big = true_ratio(old, new), new["big"] / old["big"]
    rng = random.Random(rounds)
    reps, covered, class_covered, strict_covered, boot = 500, 0, 0, 0, 0
    for _ in range(reps):
        g = simulate(rng, rounds, old, new, heavy)
        b = gate.decide(g).batches[0]
        assert b.ratio is not None and b.ratio.low is not None and b.ratio.high is not None
        covered += b.ratio.low <= truth <= b.ratio.high
        c = next(x for x in b.classes if x.name == "big")
        assert c.ratio is not None and c.ratio.low is not None and c.ratio.high is not None
        assert c.strict is not None and c.strict.low is not None and c.strict.high is not None
        class_covered += c.ratio.low <= big <= c.ratio.high
        strict_covered += c.strict.low <= big <= c.strict.high
        if rounds == 3:  # the bootstrap of the same rounds
            t = gate.traffic_rounds(g, 8)
            ratios = [x / y for x, y in zip(t.candidate, t.incumbent, strict=True)]
            assert stats.log_interval(ratios) == b.ratio
            got = stats.bootstrap_interval(ratios, draws=300, seed=rng.randrange(1 << 30))
            assert got is not None and b.ratio.low <= got[0] and got[1] <= b.ratio.high
            boot += got[0] <= truth <= got[1]
    assert 0.92 <= covered / reps <= 0.98, covered / reps
    assert 0.92 <= class_covered / reps <= 0.98, class_covered / reps
    assert strict_covered / reps >= 0.95, strict_covered / reps
    if rounds == 3:
        assert boot / reps < 0.85, boot / reps


def test_identical_drafts_are_promoted_or_rejected_rarely() -> None:
    """Two identical drafts: the gate holds; it promotes or rejects only at about its error rate (2.5% a side)."""
    same = {"big": 1.5, "weak": 1.1}
    rng = random.Random(7)
    reps = 400
    decisions = [gate.decide(simulate(rng, 6, same, same, False)).decision for _ in range(reps)]
    assert decisions.count("promote") / reps <= 0.05 and decisions.count("reject") / reps <= 0.05
    assert decisions.count("hold") / reps >= 0.9


def test_acceptance_intervals_are_over_requests() -> None:
    # Requests that all accept 60%: no spread, a tight interval; half at 20% and half at 100%: wide.
    tight = stats.acceptance_interval([(10, 6)] * 20)
    wide = stats.acceptance_interval([(10, 2), (10, 10)] * 10)
    assert tight == pytest.approx((0.6, 0.6))
    assert wide is not None and wide[0] < 0.45 and wide[1] > 0.75
    assert stats.acceptance_interval([(10, 6)]) is None and stats.acceptance_interval([(0, 0), (0, 0)]) is None


def test_the_json_round_trips_and_its_schema_is_documented() -> None:
    g = make(BIG_LOST, WEAK_WINS)
    doc = json.loads(json.dumps(gate_report.to_dict(g)))
    assert doc["specscope_gate"] == 1 and doc["decision"] == "reject" and doc["exit_code"] == 3
    again = gate_report.from_dict(doc)
    assert gate_report.to_dict(again) == doc and gate.decide(again).decision == "reject"
    assert doc["candidate"]["acceptance"]["weak"]["interval"] == [0.53, 0.63]
    assert doc["by_batch"]["8"]["classes"]["big"]["regresses"] is True
    with pytest.raises(gate_report.SchemaError):
        gate_report.from_dict({"specscope_gate": 99})
    with pytest.raises(gate_report.SchemaError):
        gate_report.from_dict({**doc, "candidate": {}})
    # Every field of the document is in docs/evaluate.md's schema.
    text = (REPO / "docs" / "evaluate.md").read_text()
    schema = text[text.index("## The promotion gate"):]
    named = set(re.findall(r'"(\w+)":', schema))
    batch = doc["by_batch"]["8"]
    fields = (set(doc) | set(doc["candidate"]) | set(doc["candidate"]["acceptance"]["weak"]) | set(batch)
              | set(batch["weighted"]) | set(batch["classes"]["big"]) | set(batch["weighted"]["ratio"])
              | set(doc["candidate"]["measured"]["8"]["big"]))
    assert fields <= named, sorted(fields - named)


def evaluation(g: Gate, partial: bool = False) -> Evaluation:
    return Evaluation("/m/target", {"k": [4], "batch_sizes": [8], "rounds": 6, "window_s": 10.0, "gate": True},
                      [g.candidate.candidate, g.incumbent.candidate],
                      {"used": 40, "skipped_long": 0, "max_model_len": 1024, "classes": {"big": 28, "weak": 12}},
                      partial=partial, note="interrupted (Ctrl-C)" if partial else None, gate=g)


def test_the_report_shows_the_decision_first() -> None:
    ev = evaluation(make(BIG_LOST, WEAK_WINS))
    page = render.render_html(ev)
    first = page.index("Decision: REJECT (exit 3)")
    assert first < page.index("<table") < page.index("What it rests on")
    assert first < page.index("class big (70% of the traffic) loses more than the 5% margin")
    assert page.count("data:image/png;base64,") == 1 and "<script" not in page
    text = render.render_text(ev)
    assert text.startswith("REJECT (exit 3): new over old at K=4: class big (70% of the traffic) loses")
    assert "  weak (weak), 30% of the traffic: acceptance 30% [25%-35%] -> 58% [53%-63%]; speedup 1.05x" in text
    doc = render.to_dict(ev)
    assert doc["gate"]["decision"] == "reject" and "ranking" not in doc
    assert "PARTIAL" in render.render_html(evaluation(make(BIG_SAME, WEAK_WINS), partial=True))


def test_shares_and_the_weak_class_from_a_live_snapshot() -> None:
    snap = replace(Hub().snapshot(), classes=(
        TrafficClass("chat", ClassCounts(), ClassCounts(90, 600, 2400, 1800)),
        TrafficClass("sql", ClassCounts(), ClassCounts(30, 300, 1200, 300)),
        TrafficClass("other", ClassCounts(), ClassCounts(10, 100, 400, 0)),
        TrafficClass("math", ClassCounts(), ClassCounts(5, 0, 0, 0))))
    shares, coverage = gate.shares_from_snapshot(snap, ["chat", "sql"])
    assert shares == pytest.approx({"chat": 2400 / 3000, "sql": 600 / 3000}) and coverage == pytest.approx(3000 / 3100)
    with pytest.raises(ValueError, match="none of the prompt file's classes"):
        gate.shares_from_snapshot(snap, ["poetry"])
    assert gate.weak_from_snapshot(snap) == ("sql", "the lowest acceptance over the server's life")
    captured = replace(snap, capture=CaptureStatus("weak", weak_now=("chat",)))
    assert gate.weak_from_snapshot(captured) == ("chat", "the class the server's capture collects")
    assert gate.weak_from_snapshot(replace(snap, classes=())) is None


# -- the command

def test_every_bad_input_before_an_engine_starts_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]) -> None:
    target, draft, copy = str(tiny["target"]), str(tiny["noise2"]), str(tiny["copy"])
    good = write(tmp_path / "good.jsonl", [{"prompt": "a b", "class": "chat"}, {"prompt": "c d", "class": "sql"}])
    unclassed = write(tmp_path / "u.jsonl", [{"prompt": "a b", "class": "chat"}, {"prompt": "c d"}])
    base = [target, "--prompts", str(good)]
    gated = [*base, "--draft", draft, "--incumbent", copy, "--gate"]
    cases: list[tuple[list[str], str]] = [
        ([*base, "--draft", draft, "--gate"], "name it with --incumbent MODEL"),
        ([*base, "--draft", draft, "--incumbent", copy], "--incumbent goes with --gate"),
        ([*base, "--draft", draft, "--margin", "0.1"], "--margin goes with --gate"),
        ([*base, "--draft", draft, "--weak", "chat"], "--weak goes with --gate"),
        ([*base, "--draft", draft, "--shares-from", "127.0.0.1:1"], "--shares-from goes with --gate"),
        ([*gated, "--draft", str(tiny["noise10"])], "one candidate with the incumbent"),
        ([*gated, "--method", "ngram"], "one candidate with the incumbent"),
        ([*base, "--method", "ngram", "--incumbent", copy, "--gate"], "one candidate with the incumbent"),
        ([*base, "--draft", copy, "--incumbent", copy, "--gate"], "the same model"),
        ([*gated, "--k", "2,4"], "at one K"),
        ([*gated, "--margin", "1.5"], "--margin takes a fraction"),
        ([*gated, "--engine-arg", "enable_prefix_caching=true"], "keeps prefix caching off"),
        ([*gated, "--weak", "has space"], "is not a class name"),
        ([*gated, "--weak", "poetry"], "has no prompt of the weak class poetry (--weak)"),
        ([target, "--prompts", str(unclassed), "--draft", draft, "--incumbent", copy, "--gate"],
         "1 of 2 prompts in"),
        ([*base, "--draft", draft, "--incumbent", str(tiny["other-tokenizer"]), "--gate"],
         "the incumbent's tokenizer mismatches the target's"),
        ([*base, "--draft", str(tiny["other-tokenizer"]), "--incumbent", copy, "--gate"],
         "the candidate's tokenizer mismatches the target's"),
        ([*base, "--draft", draft, "--incumbent", str(tmp_path / "nowhere"), "--gate"], "no such directory"),
        ([*gated, "--shares-from", "127.0.0.1:1"], "--shares-from: cannot read a specscope snapshot"),
    ]
    for args, words in cases:
        code, out, err = run_cli(capsys, *args)
        assert code == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("specscope: error: "), (args, err)
        assert words in err and "Traceback" not in err, (args, err)


def test_shares_from_a_live_endpoint_and_its_weak_class(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        tiny: dict[str, Path]) -> None:
    """--shares-from reads a real endpoint: a file without the live server's weak class is bad input."""
    from specscope.export.endpoint import Endpoint

    snap = replace(Hub().snapshot(), classes=(
        TrafficClass("chat", ClassCounts(), ClassCounts(90, 600, 2400, 1800)),
        TrafficClass("sql", ClassCounts(), ClassCounts(30, 300, 1200, 300))))
    endpoint = Endpoint(lambda: snap, port=0)
    try:
        chat_only = write(tmp_path / "c.jsonl", [{"prompt": "a b", "class": "chat"}])
        code, _, err = run_cli(capsys, str(tiny["target"]), "--prompts", str(chat_only), "--draft",
                               str(tiny["noise2"]), "--incumbent", str(tiny["copy"]), "--gate", "--shares-from",
                               endpoint.url)
        assert code == 2 and "has no prompt of the weak class sql (the lowest acceptance over the server's life at " \
            f"{endpoint.url})" in err, err
        poetry = write(tmp_path / "p.jsonl", [{"prompt": "a b", "class": "poetry"}])
        code, _, err = run_cli(capsys, str(tiny["target"]), "--prompts", str(poetry), "--draft", str(tiny["noise2"]),
                               "--incumbent", str(tiny["copy"]), "--gate", "--shares-from", endpoint.url,
                               "--weak", "poetry")
        assert code == 2 and "none of the prompt file's classes (poetry) has traffic there" in err, err
    finally:
        endpoint.close()


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1, *(len(w) for w in text.split())]


def fake_runner(candidate: dict[str, list[float]], stop: bool = False) -> type[runner.Runner]:
    """A Runner whose engines are the synthetic measurements: the incumbent at INC_*, the candidate at
    ``candidate``."""
    class Fake(runner.Runner):
        def start_plain(self) -> tuple[Any, int, int]:
            return FakeTokenizer(), 1024, 256

        def run_gate(self, ev: Evaluation, work: Workload) -> None:
            g = ev.gate
            assert g is not None and g.k == 4 and g.batch_sizes == [4]
            for a, speedups in ((g.incumbent, {"big": INC_BIG, "weak": INC_WEAK}), (g.candidate, candidate)):
                a.cells[4] = {c: Cell([PLAIN[c]] * 6, [PLAIN[c] * x for x in xs]) for c, xs in speedups.items()}
                a.candidate.status = "measured"
                if stop:
                    raise runner.EngineStopped("the target without speculation stopped (boom)")
            g.incumbent.acceptance = {"big": ClassCounts(9, 90, 360, 250), "weak": ClassCounts(9, 90, 360, 100)}

        def close(self) -> None:
            pass

    return Fake


@pytest.mark.parametrize(("candidate", "code", "word"), [
    ({"big": BIG_SAME, "weak": WEAK_WINS}, 0, "promote"),
    ({"big": BIG_LOST, "weak": WEAK_WINS}, 3, "reject"),
    ({"big": INC_BIG, "weak": INC_WEAK}, 1, "hold"),
])
def test_the_command_exits_with_the_decision_and_writes_it(
        candidate: dict[str, list[float]], code: int, word: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tiny: dict[str, Path]) -> None:
    monkeypatch.setattr(evaluate_cli, "Runner", fake_runner(candidate))
    prompts = write(tmp_path / "p.jsonl", [{"prompt": "a b c", "class": "big", "max_tokens": 70}] * 7
                    + [{"prompt": "d e", "class": "weak", "max_tokens": 30}] * 7)
    got, out, err = run_cli(capsys, str(tiny["target"]), "--draft", str(tiny["noise2"]), "--incumbent",
                            str(tiny["copy"]), "--prompts", str(prompts), "--gate", "--json", str(tmp_path / "g.json"),
                            "-o", str(tmp_path / "g.html"))
    assert got == code, (out, err)
    doc = json.loads((tmp_path / "g.json").read_text())["gate"]
    assert doc["decision"] == word and doc["exit_code"] == code
    assert doc["shares"] == {"big": 0.7, "weak": 0.3} and doc["shares_source"] == "prompts file (output tokens)"
    # Without --weak or a live server: the class the incumbent accepts least.
    assert doc["weak_class"] == "weak" and doc["weak_basis"] == "the incumbent's lowest acceptance measured"
    assert out.startswith(word.upper()) and "Traceback" not in err
    page = (tmp_path / "g.html").read_text()
    assert page.index(f"Decision: {word.upper()}") < page.index("<table")


def test_a_stopped_plain_engine_decides_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch, tiny: dict[str, Path]) -> None:
    monkeypatch.setattr(evaluate_cli, "Runner", fake_runner({"big": BIG_SAME, "weak": WEAK_WINS}, stop=True))
    prompts = write(tmp_path / "p.jsonl", [{"prompt": "a b c", "class": "big"}, {"prompt": "d e", "class": "weak"}])
    code, out, err = run_cli(capsys, str(tiny["target"]), "--draft", str(tiny["noise2"]), "--incumbent",
                             str(tiny["copy"]), "--prompts", str(prompts), "--gate", "--weak", "weak",
                             "--json", str(tmp_path / "g.json"))
    assert code == 4, (out, err)
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["partial"] and "stopped" in doc["note"] and doc["gate"]["weak_basis"] == "--weak"


def test_the_runner_measures_both_drafts_on_the_same_prompts_class_by_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round r of each draft's engine starts at the same prompt of each class, r / rounds of the way through; plain
    and speculative windows run the same prompts; a window holds one class; a candidate that fails is marked so."""
    from specscope.engine import measure, vllm_engine

    calls: list[tuple[Any, int, str, tuple[int, ...]]] = []
    plain = SimpleNamespace(name="plain", llm_engine=SimpleNamespace(engine_core=SimpleNamespace(
        resources=SimpleNamespace(engine_dead=False))))

    def steady(llm: Any, batch: int, seconds: float, prompts: list[Any], tokens: Any, labels: list[str],
               order: Any, **kw: Any) -> float:
        taken = tuple(order.take(j) for j in range(3))
        assert len(set(labels)) == 1 and all(p["class"] == labels[0] for p in (prompts[i] for i in taken))
        calls.append(("plain" if llm is plain else llm, batch, labels[0], taken))
        return 100.0 if llm is plain else 150.0

    monkeypatch.setattr(measure, "steady_throughput", steady)
    monkeypatch.setattr(vllm_engine, "instrument", lambda llm, hub: None)
    monkeypatch.setattr(runner, "_shutdown", lambda llm: None)
    started: list[dict[str, Any]] = []

    class Engines(runner.Runner):
        def _start(self, spec_config: dict[str, Any]) -> Any:
            started.append(spec_config)
            if spec_config["model"] == "/m/broken":
                raise ValueError("vLLM refuses it")
            return spec_config["model"]

        def _warm(self, llm: Any, work: Workload, sizes: Any) -> None:
            pass

    classes = ["a", "b", "a", "a", "b", "a", "b", "a"]
    work = Workload([{"class": c, "n": i} for i, c in enumerate(classes)], [8] * 8, list(classes), 0, 1024)
    r = Engines("/m/target", {}, rounds=3, window_s=1.0, progress=lambda line: None)
    r.plain = plain
    g = Gate(2, [1, 4], GateArm(Candidate("/m/new", "draft_model", "/m/new")),
             GateArm(Candidate("/m/old", "draft_model", "/m/old")), {"a": 0.5, "b": 0.5})
    ev = Evaluation("/m/target", {}, [g.candidate.candidate, g.incumbent.candidate], gate=g)
    r.run_gate(ev, work)
    assert [s["model"] for s in started] == ["/m/old", "/m/new"] and started[0]["num_speculative_tokens"] == 2
    assert len(calls) == 2 * 3 * 2 * 2 * 2  # drafts x rounds x batch sizes x classes x (plain, speculative)
    windows = {"/m/old": calls[:24], "/m/new": calls[24:]}
    for name, seen in windows.items():
        pairs = [seen[i:i + 2] for i in range(0, len(seen), 2)]
        assert all(x[3] == y[3] and x[2] == y[2] and {x[0], y[0]} == {"plain", name} for x, y in pairs)
    old, new = windows["/m/old"], windows["/m/new"]
    assert [(c[1], c[2], c[3]) for c in old] == [(c[1], c[2], c[3]) for c in new]  # the same prompts, paired
    # Class a's 5 prompts (0, 2, 3, 5 and 7 of the file): round r starts r * 5 // 3 into them.
    firsts = [c[3][0] for c in old if c[2] == "a" and c[1] == 1][::2]
    assert firsts == [0, 1, 3]
    assert g.candidate.cells[4]["b"].plain == [100.0] * 3 and g.candidate.cells[4]["b"].spec == [150.0] * 3
    assert g.incumbent.candidate.status == g.candidate.candidate.status == "measured" and r.ran == set(range(8))
    # A candidate vLLM refuses is failed, and the gate rejects it.
    g2 = Gate(2, [1], GateArm(Candidate("/m/broken", "draft_model", "/m/broken")),
              GateArm(Candidate("/m/old", "draft_model", "/m/old")), {"a": 0.5, "b": 0.5})
    r.run_gate(Evaluation("/m/target", {}, [], gate=g2), work)
    assert g2.candidate.candidate.status == "failed" and gate.decide(g2).decision == "reject"


def test_an_incumbent_that_fails_decides_nothing_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             tiny: dict[str, Path]) -> None:
    class Fails(fake_runner({})):  # type: ignore[misc,valid-type]
        def run_gate(self, ev: Evaluation, work: Workload) -> None:
            assert ev.gate is not None
            ev.gate.incumbent.candidate.status, ev.gate.incumbent.candidate.note = "failed", "OSError: no weights"

    monkeypatch.setattr(evaluate_cli, "Runner", Fails)
    prompts = write(tmp_path / "p.jsonl", [{"prompt": "a b c", "class": "big"}, {"prompt": "d e", "class": "weak"}])
    code, out, err = run_cli(capsys, str(tiny["target"]), "--draft", str(tiny["noise2"]), "--incumbent",
                             str(tiny["copy"]), "--prompts", str(prompts), "--gate", "--json", str(tmp_path / "g.json"))
    assert code == 4, (out, err)
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["partial"] and doc["gate"]["decision"] == "undecided" and doc["gate"]["by_batch"] == {}
    assert out.startswith("NO DECISION (exit 4): noise2 over copy at K=4: the incumbent's engine failed (OSError")
