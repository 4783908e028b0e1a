"""``specscope evaluate`` without engines: the prompts file, every bad input, ranking, the schedule, the writers,
and an interrupt that still writes what was measured."""

from __future__ import annotations

import base64
import html
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from specscope import cli
from specscope.core.model import ClassCounts
from specscope.read import workload
from specscope.read.evaluate import choose, render, results, runner
from specscope.read.evaluate import cli as evaluate_cli
from specscope.read.evaluate.results import Candidate, Cell, Evaluation, Forecast, KRun
from specscope.read.workload import InputError, Prompt


def write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_json_lines_prompts_with_messages_classes_and_max_tokens(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", [
        {"prompt": "the river stone", "class": "prose", "max_tokens": 32},
        "",
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
         "class": "chat"},
        {"prompt": "no class"},
    ])
    prompts, skipped = workload.load_prompts(str(path))
    assert skipped == 0
    assert prompts == [Prompt("the river stone", None, "prose", 32),
                       Prompt(None, (("system", "be brief"), ("user", "hi")), "chat", None),
                       Prompt("no class")]


def test_sharegpt_takes_the_first_human_turn(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "first question"},
                                      {"from": "gpt", "value": "answer"},
                                      {"from": "human", "value": "second question"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "only the model speaks"}]},
        {"id": "c", "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}]},
    ]))
    prompts, skipped = workload.load_prompts(str(path))
    assert [p.text for p in prompts] == ["first question", "q"] and skipped == 1


class FakeTokenizer:
    """One token a word (plus one special token at the start of a plain prompt)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * add_special_tokens + [len(w) for w in text.split()]

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool,
                            add_generation_prompt: bool) -> str:
        assert not tokenize and add_generation_prompt
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def test_prepare_tokenizes_applies_the_chat_template_and_skips_what_does_not_fit() -> None:
    prompts = [Prompt("a b c", traffic_class="x"), Prompt(messages=(("user", "hello there"),), max_tokens=4),
               Prompt("w " * 30, max_tokens=4), Prompt("short", max_tokens=40)]
    work = workload.prepare(prompts, FakeTokenizer(), max_model_len=20, default_max_tokens=8)
    # Classes interleaved by their share (the unlabelled one first: its first of three sits at 1/6 of the way).
    assert work.prompts == [{"prompt_token_ids": [5, 5, 5, 10]}, {"prompt_token_ids": [1, 1, 1, 1]}]
    assert work.max_tokens[0] == 4 and 4 <= work.max_tokens[1] <= 12 and work.classes == [None, "x"]
    assert work.skipped_long == 2 and work.max_model_len == 20

    class NoTemplate(FakeTokenizer):
        def apply_chat_template(self, *a: Any, **kw: Any) -> str:
            raise ValueError("no chat template is set")

    with pytest.raises(InputError, match="chat template"):
        workload.prepare(prompts[1:2], NoTemplate(), 20, 8)



def test_prompts_without_their_own_length_get_lengths_drawn_around_the_default() -> None:
    """A plain batch of one length finishes in lockstep (its replacements prefill together), which served traffic
    does not: a prompt without ``max_tokens`` gets its own, drawn from half to 1.5 times the default, the same from
    run to run; one with its own keeps it."""
    lengths = workload.output_lengths(200, 96, seed=11)
    assert lengths == workload.output_lengths(200, 96, seed=11) and lengths != workload.output_lengths(200, 96, seed=12)
    assert min(lengths) >= 48 and max(lengths) <= 144 and len(set(lengths)) > 60
    assert statistics.mean(lengths) == pytest.approx(96, rel=0.1)
    assert set(workload.output_lengths(50, 1)) == {1} and set(workload.output_lengths(50, 2)) == {1, 2, 3}
    prompts = [Prompt(f"p {i}") for i in range(40)] + [Prompt("own", max_tokens=7)]
    first = workload.prepare(prompts, FakeTokenizer(), max_model_len=500, default_max_tokens=128).max_tokens
    assert first == workload.prepare(prompts, FakeTokenizer(), 500, 128).max_tokens
    assert 7 in first and len(set(first)) > 20 and all(64 <= n <= 192 for n in first if n != 7)

def test_a_file_sorted_by_class_is_measured_on_every_class_from_its_first_prompts() -> None:
    """A measurement window takes the prompts from the first: 30 prose lines then 10 retrieval ones must not be
    measured on prose alone (the retrieval class is what n-gram lookup is chosen for)."""
    prompts = [Prompt(f"prose {i}", traffic_class="prose") for i in range(30)]
    prompts += [Prompt(f"retrieval {i}", traffic_class="retrieval") for i in range(10)]
    classes = workload.prepare(prompts, FakeTokenizer(), max_model_len=100, default_max_tokens=8).classes
    assert classes.count("prose") == 30 and classes.count("retrieval") == 10
    assert all(classes[i:i + 4].count("retrieval") == 1 for i in range(0, 40, 4))  # one in four, throughout
    assert [p.text for p in workload._interleaved(prompts) if p.traffic_class == "prose"] == \
        [p.text for p in prompts[:30]]  # each class keeps its file order


def test_a_captured_file_is_read_as_it_is_with_its_classes(tmp_path: Path) -> None:
    """The rows :mod:`specscope.engine.capture` writes: the prompt tokens as the target saw them and the served length,
    the class kept; a row of conversations only (another writer's) by its turns before the answer."""
    from specscope.core.model import RequestRecord
    from specscope.engine.capture import Payload, row

    rec = RequestRecord("r", 1, 0.0, accepted_tokens=3, draft_tokens=8)
    captured = [row(rec, "hard", Payload("p", [4, 5, 6], [9, 9], "out", None, None), "m"),
                row(rec, "prompt:<256", Payload("q", [7], [9, 9, 9], "out", (("user", "q"),), None), "m"),
                {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "hi"},
                                   {"from": "gpt", "value": "hello"}], "class": "chat"}]
    prompts, _ = workload.load_prompts(str(write(tmp_path / "captured.jsonl", captured)))
    assert prompts == [Prompt(traffic_class="hard", max_tokens=2, token_ids=(4, 5, 6)),
                       Prompt(traffic_class="prompt:<256", max_tokens=3, token_ids=(7,)),
                       Prompt(messages=(("system", "s"), ("user", "hi")), traffic_class="chat")]
    work = workload.prepare(prompts, FakeTokenizer(), max_model_len=100, default_max_tokens=8)
    assert {tuple(p["prompt_token_ids"]) for p in work.prompts} >= {(4, 5, 6), (7,)}
    assert sorted(work.max_tokens)[:2] == [2, 3] and 4 <= max(work.max_tokens) <= 12  # the third's drawn
    assert set(work.classes) == {"hard", "prompt:<256", "chat"}
    for bad, why in (({"input_ids": [1, 2], "loss_mask": [0, 0]}, "the completion"),
                     ({"input_ids": [1], "loss_mask": [1]}, "no prompt"),
                     ({"conversations": [{"from": "gpt", "value": "x"}]}, "no turn before"),
                     ({"conversations": "x"}, "must be a list"),
                     ({"input_ids": [1, 2], "loss_mask": [0, 1], "secret": 1}, "unknown field 'secret'")):
        with pytest.raises(InputError, match=why):
            workload.load_prompts(str(write(tmp_path / "bad.jsonl", [bad])))


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(["evaluate", *args])
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                tiny: dict[str, Path]) -> None:
    good = write(tmp_path / "good.jsonl", [{"prompt": "x"}])
    files = {
        "missing": (tmp_path / "missing.jsonl", "cannot read"),
        "empty": (write(tmp_path / "empty.jsonl", []), "holds no prompts"),
        "blank": (write(tmp_path / "blank.jsonl", ["", "  "]), "holds no prompts"),
        "binary": (tmp_path / "blob.bin", "not UTF-8"),
        "not-json": (write(tmp_path / "nj.jsonl", [{"prompt": "x"}, "{nope"]), "nj.jsonl:2: not JSON"),
        "not-object": (write(tmp_path / "no.jsonl", ["42"]), "not a JSON object"),
        "unknown": (write(tmp_path / "u.jsonl", [{"prompt": "x", "temperature": 1}]), "unknown field 'temperature'"),
        "both": (write(tmp_path / "b.jsonl", [{"prompt": "x", "messages": []}]), "either \"prompt\""),
        "neither": (write(tmp_path / "n.jsonl", [{"class": "a"}]), "either \"prompt\""),
        "empty-prompt": (write(tmp_path / "e.jsonl", [{"prompt": " "}]), "non-empty string"),
        "messages": (write(tmp_path / "m.jsonl", [{"messages": [{"role": "user"}]}]), "\"messages\" must be"),
        "class": (write(tmp_path / "c.jsonl", [{"prompt": "x", "class": "has space"}]), "is not a class name"),
        "long-class": (write(tmp_path / "lc.jsonl", [{"prompt": "x", "class": "a" * 49}]), "is not a class name"),
        "max-tokens": (write(tmp_path / "mt.jsonl", [{"prompt": "x", "max_tokens": 0}]), "positive integer"),
        "max-tokens-bool": (write(tmp_path / "mb.jsonl", [{"prompt": "x", "max_tokens": True}]), "positive integer"),
        "sharegpt-bad": (tmp_path / "s.json", "no \"conversations\" list"),
        "sharegpt-nohuman": (tmp_path / "sn.json", "without a human turn"),
        "sharegpt-json": (tmp_path / "sj.json", "not JSON"),
    }
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "s.json").write_text(json.dumps([{"id": 1}]))
    (tmp_path / "sn.json").write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "x"}]}]))
    (tmp_path / "sj.json").write_text("[{")
    target, draft = str(tiny["target"]), str(tiny["copy"])
    cases: list[tuple[list[str], str]] = [
        ([target, "--draft", draft, "--prompts", str(path)], words) for path, words in files.values()]
    base = [target, "--prompts", str(good)]
    cases += [
        ([*base], "name at least one candidate"),
        ([*base, "--draft", draft, "--draft", draft], "named twice"),
        ([*base, "--draft", draft, "--eagle3", draft], "named twice"),
        ([*base, "--method", "mtp", "--method", "mtp"], "named twice"),
        ([*base, "--draft", draft, "--k", "0,2"], "--k takes positive integers"),
        ([*base, "--draft", draft, "--k", "two"], "--k takes positive integers"),
        ([*base, "--draft", draft, "--batch-sizes", ""], "--batch-sizes takes"),
        ([*base, "--draft", draft, "--rounds", "0"], "--rounds"),
        ([*base, "--draft", draft, "--window-s", "-1"], "--window-s"),
        ([*base, "--draft", draft, "--rounds", "x"], "invalid int value"),
        ([*base, "--draft", draft, "--method", "eagle3"], "invalid choice"),
        ([*base, "--draft", draft, "--engine-arg", "novalue"], "--engine-arg takes name=value"),
        ([*base, "--draft", draft, "--engine-arg", 'speculative_config={"method": "ngram"}'], "speculative_config"),
        ([*base, "--draft", draft, "-o", str(tmp_path / "no" / "dir.html")], "no such directory"),
        ([*base, "--draft", str(tmp_path / "no-such-draft")], "no such directory"),
        ([*base, "--draft", str(tiny["other-tokenizer"])], "tokenizer mismatches"),
        ([target, "--draft", draft], "--prompts"),
    ]
    for args, words in cases:
        code, out, err = run_cli(capsys, *args)
        assert code == 2, (args, out, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("specscope: error: "), (args, err)
        assert words in err and "Traceback" not in err, (args, err)


def test_each_kind_of_candidate_is_configured_as_vllm_takes_it(tiny: dict[str, Path]) -> None:
    """Drafts are tokenizer-checked; heads run with the target's tokenizer (none checked); model-free methods name
    no model. Each candidate's speculative_config is the one vLLM's method takes."""
    import argparse

    parser = argparse.ArgumentParser()
    evaluate_cli.add_arguments(parser)
    args = parser.parse_args([str(tiny["deep01-target"]), "--prompts", "p.jsonl", "--draft", str(tiny["deep01-draft"]),
                              "--eagle3", str(tiny["deep01-eagle3"]), "--eagle", str(tiny["deep01-eagle"]),
                              "--method", "ngram", "--method", "mtp"])
    got = {c.method: c for c in evaluate_cli._candidates(args)}
    assert list(got) == ["draft_model", "eagle3", "eagle", "ngram", "mtp"]
    assert got["draft_model"].tokenizer is not None and got["draft_model"].tokenizer["verdict"] == "identical"
    assert all(got[m].tokenizer is None and got[m].status == "pending" for m in ("eagle3", "eagle", "ngram", "mtp"))
    assert got["eagle3"].config(3) == {"method": "eagle3", "model": str(tiny["deep01-eagle3"]),
                                       "num_speculative_tokens": 3}
    assert got["eagle"].config(2) == {"method": "eagle", "model": str(tiny["deep01-eagle"]),
                                      "num_speculative_tokens": 2}
    assert got["mtp"].config(1) == {"method": "mtp", "num_speculative_tokens": 1}
    assert got["ngram"].config(4) == {**results.NGRAM, "num_speculative_tokens": 4}
    assert got["draft_model"].config(4)["method"] == "draft_model"


def cand(name: str, cells: dict[int, dict[int, list[float]]], method: str = "draft_model",
         k0: float | None = 0.9) -> Candidate:
    """A candidate with measured ratios by K and batch size (plain 100 tok/s a request: a plain step takes as long at
    every batch size)."""
    c = Candidate(name, method, None if method == "ngram" else name, status="measured",
                  tokenizer=None if method == "ngram" else {"verdict": "identical", "reasons": [], "warnings": []})
    for k, by_b in cells.items():
        run = c.runs[k] = KRun(k, acceptance=0.6, alpha=0.7, per_position=(0.8, 0.6),
                               by_class={"chat": ClassCounts(4, 20, 40, 30, (18, 12)),
                                         "code": ClassCounts(3, 15, 30, 12, (8, 4))})
        for b, ratios in by_b.items():
            run.cells[b] = Cell([100.0 * b] * len(ratios), [100.0 * b * r for r in ratios],
                                explained=ratios[0] * 1.05)
            if k0 is not None:
                run.k0_price[b] = k0
    return c


GOOD = {2: {1: [1.6, 1.7], 8: [1.2, 1.15]}, 4: {1: [2.0, 2.1], 8: [1.1, 1.0]}}
WEAK = {2: {1: [0.8, 0.85], 8: [0.6, 0.62]}, 4: {1: [0.6, 0.65], 8: [0.4, 0.41]}}


def test_schedule_best_k_by_batch_size_and_k0_priced() -> None:
    good = choose.choose_schedule(cand("good", GOOD), [1, 8], max_batch=256)
    assert good is not None
    assert [(c.batch_size, c.best_k, c.k) for c in good.choices] == [(1, 4, 4), (8, 2, 2)]
    # Between batch 1 and 8 the verdict's rule: step times linear in the batch size, so each K's speedup is the
    # harmonic mean of its two measured ones (K=4: 2.05x to 1.05x, K=2: 1.65x to 1.175x), K=4 best up to batch 4.
    assert good.ranges == [(1, 4, 4), (5, 256, 2)] and good.same_as_k is None
    assert good.config == {"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 4, 4],
                                                                                                   [5, 256, 2]]}
    weak = choose.choose_schedule(cand("weak", WEAK), [1, 8], 256)
    assert weak is not None and weak.config is None and all(c.best_k == 0 for c in weak.choices)
    assert "run without speculation" in render._verdict(weak)
    # Pays at batch 1 only; at batch 8 the best K loses to plain decoding but beats a K=0 range priced 0.9x: the
    # schedule keeps K=2 there, and says speculation costs at batch 8.
    mixed = choose.choose_schedule(cand("mixed", {2: {1: [1.3], 8: [0.95]}, 4: {1: [1.5], 8: [0.8]}}), [1, 8], 16)
    assert mixed is not None and [(c.best_k, c.k) for c in mixed.choices] == [(4, 4), (0, 2)]
    assert mixed.ranges == [(1, 3, 4), (4, 16, 2)] and "at batch 8 no K pays" in render._verdict(mixed)
    # Where K=0 is priced above the best K, the schedule runs K=0 there, and from where K=2 falls under its price.
    zero = choose.choose_schedule(cand("zero", {2: {1: [1.3], 8: [0.8]}}, k0=0.9), [1, 8], 16)
    assert zero is not None and zero.ranges == [(1, 5, 2), (6, 16, 0)]
    assert zero.choices[1].expected == pytest.approx(0.9)
    # One K throughout: no schedule, a plain K, measured by that K's engine.
    c = cand("one", {2: {1: [1.3], 8: [1.2]}, 4: {1: [1.2], 8: [1.1]}})
    c.schedule = one = choose.choose_schedule(c, [1, 8], 16)
    assert one is not None and one.ranges == [(1, 16, 2)] and one.same_as_k == 2
    assert one.config == {"num_speculative_tokens": 2} and one.cells is c.runs[2].cells
    ev = Evaluation("t", {"k": [2, 4], "batch_sizes": [1, 8], "rounds": 1, "window_s": 1.0}, [c])
    text, page = render.render_text(ev), render.render_html(ev)
    assert 'speculative_config: {"num_speculative_tokens": 2}\n' in text and "speculate with K=2 at every batch" in text
    assert html.escape(json.dumps({"speculative_config": {"method": "draft_model", "model": "one",
                                                          "num_speculative_tokens": 2}})) in page
    assert "per_batch_size" not in text + page
    assert choose.choose_schedule(Candidate("none", "ngram"), [1, 8], 16) is None


def test_under_data_parallel_the_advice_is_one_k() -> None:
    """vLLM drops a per-batch-size schedule when data_parallel_size > 1: GOOD's schedule (K=4 then K=2) would run
    K=4 everywhere. The advice is the K with the best geometric mean of its speedups over the batch sizes."""
    c = cand("good", GOOD)
    c.schedule = one = choose.choose_schedule(c, [1, 8], 256, one_k=True)
    # K=2: sqrt(1.65 * 1.175) = 1.39; K=4: sqrt(2.05 * 1.05) = 1.47 -> K=4.
    assert one is not None and one.ranges == [(1, 256, 4)] and one.config == {"num_speculative_tokens": 4}
    assert one.same_as_k == 4 and one.cells is c.runs[4].cells
    assert choose.choose_schedule(cand("weak", WEAK), [1, 8], 256, one_k=True).config is None  # type: ignore[union-attr]
    ev = Evaluation("t", {"k": [2, 4], "batch_sizes": [1, 8], "rounds": 1, "window_s": 1.0, "data_parallel_size": 2},
                    [c])
    text = render.render_text(ev)
    assert "data parallel size 2: vLLM drops a per-batch-size schedule there" in text
    assert "batch 1 (K=4)" in text and "batch 8 (K=4)" in text and "per_batch_size" not in text


def test_the_same_numbers_give_the_same_schedule_here_and_in_the_live_verdict() -> None:
    """One rule (verdict.schedule.k_ranges): an engine whose live step times and baseline give the verdict's schedule
    is measured here as those numbers say (plain tokens/s from the baseline, each K's speedup and the K = 0 price
    from the verdict's estimate at each measured batch size); the bake-off hands out the same ranges, K falling
    between the measured sizes where the interpolated step times say. The numbers tell each K from the running one
    (where they do not, the live verdict keeps the running K, which a bake-off that timed every K does not have)."""
    from specscope.core import acceptance as acc
    from specscope.core.model import CostRatio, EngineInfo, StepProfile, StepTime
    from specscope.state.hub import Hub
    from specscope.verdict import estimate, k_schedule, k_table
    from tests.verdict.test_verdict import SETUP, Clock, steps

    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4, method="draft_model", setup=SETUP))
    hub.set_cost_ratio(CostRatio(0.02, "estimated from parameters per token", 100, 2))  # under every c measured here
    for b, dt in ((1, 0.0040), (4, 0.006), (16, 0.012)):
        for accepted in (4, 4, 0, 4):  # each position as likely as the one before: extended geometrically past 4
            steps(hub, clock, b, dt, 10, accepted=accepted)
    plain = {1: 0.0036, 4: 0.0042, 16: 0.0060}
    hub.set_baseline(StepProfile(tuple(StepTime(b, 50, t) for b, t in plain.items()), "measured on /m/target", SETUP))
    snap = hub.snapshot()
    sizes = [c.batch_size for c in k_table(snap)]
    c = Candidate("d", "draft_model", "d", status="measured")
    for k in range(1, acc.K_MAX + 1):
        run = c.runs[k] = KRun(k)
        for b in sizes:
            est = estimate(snap, batch_size=b)
            assert est is not None
            run.cells[b] = Cell([b / plain[b]], [b / plain[b] * est.by_k[k]])
            run.k0_price[b] = est.k0_speedup
    sched = choose.choose_schedule(c, sizes, max_batch=16)
    assert sizes == [1, 4, 16] and sched is not None
    assert sched.ranges == k_schedule(snap) == [(1, 2, 16), (3, 3, 14), (4, 4, 13), (5, 5, 12), (6, 7, 11), (8, 10, 10),
                                                (11, 16, 9)]


def test_an_unpriced_k0_range_is_never_scheduled_and_rounds_default_to_3() -> None:
    """Without specscope's price a K = 0 range is not assumed to run at 1.0x: the best K measured stays, at its
    measured speed, and the verdict says K = 0 had no price there."""
    import argparse

    c = cand("unpriced", {2: {1: [1.3], 8: [0.8]}}, k0=None)
    c.schedule = sched = choose.choose_schedule(c, [1, 8], 16)
    assert sched is not None and sched.ranges == [(1, 16, 2)] and sched.same_as_k == 2
    assert sched.config == {"num_speculative_tokens": 2}
    eight = sched.choices[1]
    assert (eight.best_k, eight.k, eight.k0_price) == (0, 2, None) and eight.expected == pytest.approx(0.8)
    assert "not plain speed (0.80x; K = 0 unpriced at batch 8: the best K measured kept)" in render._verdict(sched)
    best = render.to_dict(Evaluation("t", {"batch_sizes": [1, 8]}, [c]))["candidates"][0]["schedule"]["best"]
    assert best["8"]["k0_price"] is None and best["1"]["k0_price"] is None
    parser = argparse.ArgumentParser()
    evaluate_cli.add_arguments(parser)
    assert parser.parse_args(["target", "--prompts", "p.jsonl"]).rounds is None  # resolved in main:
    assert evaluate_cli.DEFAULTS["rounds"] == 3  # a median of 3, not a mean of 2


def test_ranking_by_the_geometric_mean_of_the_best_speedups() -> None:
    good, weak = cand("good", GOOD), cand("weak", WEAK)
    ngram = cand("ngram", {2: {1: [1.9], 8: [1.0]}}, method="ngram", k0=None)  # 1.38 against good's 1.53
    refused = Candidate("bad", "draft_model", "bad", status="refused")
    ranked = choose.rank([refused, weak, ngram, good], [1, 8])
    assert [c.name for c, _ in ranked] == ["good", "ngram", "weak", "bad"]
    assert ranked[0][1] == pytest.approx((2.05 * 1.175) ** 0.5) and ranked[-1][1] is None


def synthetic(partial: bool = False) -> Evaluation:
    good, weak, ngram = cand("/m/good-draft", GOOD), cand("/m/weak-draft", WEAK), cand("ngram", {2: {1: [1.2]}},
                                                                                     method="ngram", k0=None)
    for c in (good, weak, ngram):
        c.schedule = choose.choose_schedule(c, [1, 8], 256)
    assert good.schedule is not None
    good.schedule.cells = {1: Cell([100.0], [195.0]), 8: Cell([100.0], [112.0])}
    # Its K=4 and its schedule predicted from its K=2 run before they were measured.
    by_k = {1: (1.0, 1.4, 1.7, 1.9, 2.0), 8: (1.0, 1.2, 1.2, 1.1, 1.0)}
    good.forecast_k, good.forecast = 2, {b: Forecast(ks, tuple(0.9 * x for x in ks), tuple(1.1 * x for x in ks), 0.9)
                                         for b, ks in by_k.items()}
    for b, ahead in good.forecast.items():
        ahead.predict(good.runs[4].cells[b], 4)
        ahead.predict(good.schedule.cells[b], next(ch.k for ch in good.schedule.choices if ch.batch_size == b))
    good.draft_kv = {"blocks": 85.0, "share": 0.077, "text": "the draft takes 85 KV blocks (7.7% of the capacity)"}
    if partial:
        ngram.status = "interrupted"
    settings = {"k": [2, 4], "batch_sizes": [1, 8], "rounds": 2, "window_s": 3.0, "max_tokens": 64,
                "engine_args": {}, "prompts_file": "p.jsonl"}
    return Evaluation("deep01-target", settings, [weak, ngram, good],
                      {"used": 40, "skipped_long": 2, "max_model_len": 1024, "classes": {"chat": 20, "code": 20}},
                      partial=partial, note="interrupted (Ctrl-C)" if partial else None, seconds=90)


def test_the_cross_k_error_is_judged_on_cells_predicted_before_they_were_measured() -> None:
    """The trust figure of evaluate: the first K's forecast of another K, set before that K is measured, against
    what it measured; the first K's own windows (explained, not predicted) are not counted."""
    c = cand("/m/d", {2: {1: [1.5], 8: [1.0]}, 4: {1: [2.0], 8: [0.8]}})
    by_k = {1: (1.0, 1.3, 1.5, 1.7, 2.1), 8: (1.0, 1.05, 1.0, 0.85, 0.7)}
    c.forecast_k, c.forecast = 2, {b: Forecast(ks, tuple(0.9 * x for x in ks), tuple(1.07 * x for x in ks), 0.9)
                                   for b, ks in by_k.items()}
    for b, ahead in c.forecast.items():
        ahead.predict(c.runs[4].cells[b], 4)
    assert c.runs[4].cells[1].predicted == 2.1 and c.runs[4].cells[1].interval == pytest.approx((1.89, 2.247))
    assert c.forecast[8].at(0) == (0.9, None)  # a K = 0 range: its price, no interval
    trust = render.cross_k(c)
    # K=4: 2.1x predicted, 2.0x measured (+5%, inside 1.89-2.25x); 0.7x predicted, 0.8x measured (-12.5%, outside
    # 0.63-0.75x). K=2's cells were what it predicted from.
    assert trust == {"from_k": 2, "cells": 2, "within_10pct": 1, "inside_interval": 1, "with_interval": 2,
                     "median_abs_error": 0.088, "worst": {"k": 4, "batch": 8, "error": -0.125}}
    text = render.cross_k_text(c)
    assert text is not None and "predicted from K=2's run before measuring" in text
    assert "1 of 2 cells within 10%" in text
    assert render.cross_k(cand("/m/e", GOOD)) is None  # nothing predicted before it was measured: no figure


def test_windows_walk_the_whole_file_and_engines_of_a_window_run_the_same_prompts() -> None:
    """Issue 26.9: each window starts where the furthest engine of the last one stopped."""
    from specscope.engine.measure import PromptOrder

    order = PromptOrder(10)
    first_plain = [order.take(j) for j in range(3)]  # the slower engine of the window
    first_spec = [order.take(j) for j in range(5)]  # the faster one reaches further on the same stretch
    assert first_spec[:3] == first_plain and first_spec == [0, 1, 2, 3, 4]
    order.next_window()
    second = [order.take(j) for j in range(5)]
    assert second == [5, 6, 7, 8, 9] and order.ran == set(range(10))  # the whole file, no repeats
    order.next_window()
    assert order.take(0) == 0  # round the file again


def test_json_and_text_of_an_evaluation() -> None:
    ev = synthetic()
    doc = json.loads(json.dumps(render.to_dict(ev)))
    assert doc["ranking"] == ["/m/good-draft", "ngram", "/m/weak-draft"] and not doc["partial"]
    assert doc["ranking_rule"].startswith("the geometric mean")
    good, ngram, weak = doc["candidates"]
    cell = good["by_k"]["4"]["batch"]["1"]
    assert cell["speedup"] == 2.05 and (cell["min"], cell["max"]) == (2.0, 2.1) and cell["rounds"] == [2.0, 2.1]
    assert cell["explained"] == 2.1 and cell["plain_tok_s"] == [100.0, 100.0]
    # K=4 was predicted from K=2's run before it was measured; K=2's own cells were what it predicted from.
    assert cell["predicted"] == 2.0 and cell["predicted_interval"] == [1.8, 2.2]
    assert good["by_k"]["2"]["batch"]["1"]["predicted"] is None and good["cross_k"]["from_k"] == 2
    assert good["by_k"]["2"]["by_class"]["code"] == {"requests": 3, "drafted": 30, "accepted": 12,
                                                    "acceptance": 0.4, "per_position": [0.533, 0.267]}
    assert good["schedule"]["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 4, 4],
                                                                                               [5, 256, 2]]
    assert good["schedule"]["measured"]["1"]["speedup"] == 1.95 and good["draft_kv_cost"]["blocks"] == 85.0
    assert weak["schedule"]["speculative_config"] is None and "run without speculation" in weak["schedule"]["verdict"]
    assert ngram["draft_kv_cost"] is None and ngram["tokenizer"] is None
    text = render.render_text(ev)
    assert "1. /m/good-draft" in text and "run without speculation" in text and "by class chat 75%" in text
    assert "no window ran" in text  # the synthetic evaluation ran none
    ev.prompts.update(ran=30, classes_ran={"chat": 18, "code": 12})
    assert "30 distinct prompts run (chat 18, code 12)" in render.render_text(ev)
    assert '"num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 256, 2]]' in text
    assert "acceptance 60% (by position 80% 60%; by class chat 75% (4 requests), code 40% (3 requests))" in text


def test_a_candidate_that_failed_reads_as_failed_with_nothing_measured_said_once() -> None:
    """The target's own MTP layers on a target without them: vLLM refuses the method, nothing is measured."""
    ev = synthetic()
    failed = Candidate("mtp", "mtp", status="failed", note="NotImplementedError: Unsupported speculative method: 'mtp'")
    failed.runs[2] = KRun(2)
    ev.candidates.append(failed)
    text = render.render_text(ev)
    assert "4. mtp (mtp) score n/a; failed: NotImplementedError: Unsupported speculative method: 'mtp'" in text
    assert "   K=2: batch 1 n/a  batch 8 n/a\n        acceptance n/a\n" in text
    assert "by position )" not in text and not text.rstrip().endswith("by class")
    doc = render.to_dict(ev)
    assert doc["ranking"][-1] == "mtp" and doc["candidates"][-1]["status"] == "failed"


def test_html_is_one_self_contained_page_with_its_plots() -> None:
    page = render.render_html(synthetic())
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    # speedup bars, predicted vs measured, and acceptance by class for each of the three candidates
    assert len(images) == 5 and all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "<script" not in page and 'src="http' not in page and "<link" not in page
    assert "Ranking" in page and "num_speculative_tokens_per_batch_size" in page and "PARTIAL" not in page
    assert "run without speculation" in page and "7.7% of the capacity" in page
    assert "PARTIAL" in render.render_html(synthetic(partial=True))


def test_an_interrupt_writes_what_was_measured_marked_partial(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              tiny: dict[str, Path]) -> None:
    class Interrupted(runner.Runner):
        def start_plain(self) -> tuple[Any, int, int]:
            return FakeTokenizer(), 1024, 256

        def run(self, ev: Evaluation, work: workload.Workload, max_batch: int) -> None:
            c = ev.candidates[0]
            c.runs[2] = KRun(2, cells={1: Cell([100.0], [150.0])})
            raise KeyboardInterrupt

        def close(self) -> None:
            pass

    monkeypatch.setattr(evaluate_cli, "Runner", Interrupted)
    prompts = write(tmp_path / "p.jsonl", [{"prompt": "a b", "class": "x"}, {"prompt": "c d"}])
    code, out, err = run_cli(capsys, str(tiny["target"]), "--draft", str(tiny["copy"]), "--method", "ngram",
                             "--prompts", str(prompts), "--k", "2,4", "--batch-sizes", "1,8",
                             "--json", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.html"))
    assert code == evaluate_cli.INTERRUPTED, err
    assert "interrupted; writing what was measured" in err and "Traceback" not in err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["partial"] and doc["note"] == "interrupted (Ctrl-C)"
    assert doc["prompts"]["classes"] == {"x": 1, "(prompt-length bucket)": 1}
    assert doc["candidates"][0]["by_k"]["2"]["batch"]["1"]["speedup"] == 1.5
    assert "PARTIAL" in (tmp_path / "r.html").read_text() and "PARTIAL" in out


def test_on_a_gpu_the_two_engines_split_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26.10: the plain target stays loaded while each candidate starts beside it; on a GPU each gets
    GPU_SHARE of it unless the user set gpu_memory_utilization; on this CPU nothing changes."""
    import vllm.platforms

    from specscope.read.evaluate.runner import GPU_SHARE, gpu_memory_split

    assert gpu_memory_split({}) is None  # the real platform here: a CPU

    class Cuda:
        @staticmethod
        def is_cpu() -> bool:
            return False

    monkeypatch.setattr(vllm.platforms, "current_platform", Cuda())
    assert gpu_memory_split({}) == GPU_SHARE and 2 * GPU_SHARE < 0.92
    assert gpu_memory_split({"gpu_memory_utilization": 0.3}) is None
