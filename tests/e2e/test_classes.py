"""Acceptance by traffic class on a real engine: a class the draft predicts badly, which the aggregate hides.

The tiny target with its 10%-noise draft accepts anywhere from 3% to 95% of a request's drafts, depending on the
prompt (greedy text the draft happens to follow, or not). A first pass reads vLLM's own per-request numbers and
takes the prompts the draft predicts best as one class and the worst as another, in a mix whose engine-wide
acceptance stays above the weak-draft threshold (``tiny_models.split_by_acceptance``): the second class's alert
fires, the first's does not, the engine-wide weak-draft alert does not, and the per-class counts add up to vLLM's
own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specscope import Hub, tiny_models
from specscope.core import codec
from specscope.core.classes import PROMPT_BUCKETS
from specscope.engine import vllm_stats
from specscope.engine.capture import attached
from tests.conftest import ENGINE_KW, greedy, shutdown

pytestmark = pytest.mark.engine

PROMPTS = tiny_models.prompts(48, seed=43)
TOKENS = 48


def vllm_counts(outputs: list[Any]) -> list[tuple[int, int]]:
    """(accepted, drafted) of each request, from vLLM's own per-request metrics."""
    out = []
    for o in outputs:
        steps = vllm_stats.per_step_counts(o.outputs[0].spec_decode_metrics)
        assert steps is not None
        out.append((sum(steps[0]), sum(steps[1])))
    return out


def captured_while_weak(llm: Any, hard: list[str], first: list[Any], directory: Path) -> None:
    """Capture of the weak class (``specscope_capture``, classes ``weak``): once the hard class is under the line,
    its requests are written as training rows, every sample of ``n > 1`` and chats with their messages; the easy
    class is not. The hard class's ``first`` requests, which put it under the line, may be written too: the weak
    classes are read again at most once a second, and where a second had passed when they finished (a slow
    machine), they were read with those requests in."""
    from vllm import SamplingParams

    time.sleep(1.1)  # the weak classes are read again from the window at most once a second
    samples = llm.generate(hard, SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=TOKENS),
                           use_tqdm=False, specscope_class="hard")
    chat = [{"role": "system", "content": "answer"}, {"role": "user", "content": hard[0]}]
    chatted = llm.chat(chat, greedy(TOKENS), use_tqdm=False, specscope_class="hard")
    llm.generate(hard[:1], greedy(TOKENS), use_tqdm=False, specscope_class="easy")
    llm.specscope.wait_idle()
    cap = attached(llm.specscope)
    assert cap is not None
    cap.close()
    written = [json.loads(line) for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()]
    # The first pass's requests, sent without a class (classed by prompt length), may be written too: where a look
    # at the window, as the pass's slowest requests finished, found their class under the line (a slow machine).
    assert {r["class"] for r in written} - {"hard"} <= {PROMPT_BUCKETS[0]}, {r["class"] for r in written}
    rows = [r for r in written if r["class"] == "hard"]

    def served(outputs: list[Any]) -> set[tuple[Any, ...]]:
        return {(tuple(o.prompt_token_ids), tuple(c.token_ids), c.text) for o in outputs for c in o.outputs}

    got = {(tuple(i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if not m),
            tuple(i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m),
            r["conversations"][-1]["value"]) for r in rows}
    assert len(got) == len(rows), len(rows)  # a row a request (and a sample)
    # The target's own tokens and text, each sample of n = 2 a row of its own.
    assert served(samples + chatted) <= got <= served(samples + chatted + first), len(rows)
    chat_rows = [r for r in rows if r["conversations"][0]["from"] == "system"]
    assert [t["value"] for t in chat_rows[0]["conversations"][:2]] == ["answer", hard[0]] and len(chat_rows) == 1
    assert all(0 <= r["acceptance"] <= 1 and r["model"] == llm.snapshot().engine.model for r in rows)
    status = llm.snapshot().capture
    assert status is not None and status.rows == len(written) and status.weak_now == ("hard",)
    doc = json.dumps(codec.to_dict(llm.snapshot()))  # what the endpoint, the share files and records carry
    texts = [r["conversations"][-1]["value"] for r in written]
    assert hard[0] not in doc and not any(len(t) > 20 and t in doc for t in texts)
    read_by_speculators(directory, written, llm.llm_engine.vllm_config.model_config.tokenizer)
    config = llm.llm_engine.vllm_config
    finetuned(directory, config.speculative_config.draft_model_config.model, config.model_config.model)


def finetuned(directory: Path, draft: str, target: str) -> None:
    """docs/classes.md's example fine-tune (examples/finetune_draft.py) on the captured class, distilled from
    the target: the draft's divergence from the target on those rows falls, and what it saves loads as a model with the
    draft's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = directory.parent / "draft-hard"
    r = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "examples" / "finetune_draft.py"), draft,
                        str(directory), "--target", target, "--class", "hard", "--epochs", "2", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    done = json.loads(r.stdout.strip().splitlines()[-1])
    assert done["rows"] > 0 and done["loss"] == "kl" and done["loss_after"] < 0.8 * done["loss_before"], done
    assert AutoModelForCausalLM.from_pretrained(out) is not None
    assert AutoTokenizer.from_pretrained(out).get_vocab() == AutoTokenizer.from_pretrained(draft).get_vocab()


def read_by_speculators(directory: Path, rows: list[dict[str, Any]], tokenizer: str) -> None:
    """The reader that will train on the file: vllm-project/speculators' own data preparation (``speculators
    prepare-data``, offline, no server: the rows' exact token ids are used as they are) reads every captured row,
    training on the completion's tokens and on nothing else."""
    import datasets

    out = directory.parent / "speculators"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run([str(Path(sys.executable).parent / "speculators"), "prepare-data", "--model", tokenizer,
                        "--data", str(directory), "--output", str(out), "--seq-length", "512",
                        "--num-preprocessing-workers", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    prepared = datasets.load_from_disk(str(out)).with_format(None)
    assert sorted((tuple(x["input_ids"]), tuple(x["loss_mask"])) for x in prepared) == sorted(
        (tuple(x["input_ids"]), tuple(x["loss_mask"])) for x in rows)
    assert sum(x["seq_len"] for x in prepared) == sum(len(x["input_ids"]) for x in rows)


def test_a_class_the_draft_fails_on_alerts_while_the_engine_looks_healthy(tiny: dict[str, Path], engines: Any,
                                                                          tmp_path: Path) -> None:
    import specscope
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import Thresholds

    engines.close()
    llm = specscope.LLM(str(tiny["target"]), specscope_hub=Hub(), **ENGINE_KW,
                        speculative_config={"method": "draft_model", "model": str(tiny["noise10"]),
                                            "num_speculative_tokens": 4},
                        specscope_capture={"directory": tmp_path / "capture", "classes": "weak"})
    try:
        easy, hard = tiny_models.split_by_acceptance(llm, PROMPTS, TOKENS)
        assert len(hard) >= 2, "the draft's acceptance does not vary enough by prompt here"
        llm.specscope.reset_window()
        outputs = {"easy": llm.generate(easy, greedy(TOKENS), use_tqdm=False, specscope_class="easy"),
                   "hard": llm.generate(hard, greedy(TOKENS), use_tqdm=False, specscope_class="hard")}
        snap = llm.snapshot()
        classes = {c.name: c for c in snap.classes}
        engine = snap.window.spec
        assert engine is not None and engine.acceptance_rate > 0.3  # type: ignore[operator]
        for name, outs in outputs.items():
            counts = vllm_counts(outs)
            cls = classes[name]
            # The class's counts are vLLM's own per-request numbers, summed.
            assert (cls.window.accepted, cls.window.draft_tokens) == (sum(a for a, _ in counts),
                                                                      sum(d for _, d in counts)), name
            assert cls.window.requests == len(outs) == cls.lifetime.requests
        assert classes["hard"].window.acceptance_rate < 0.3 < classes["easy"].window.acceptance_rate
        # The classes add up to the engine's own counters (vLLM's, through the stat logger).
        assert sum(c.window.draft_tokens for c in classes.values()) == engine.draft_tokens
        assert sum(c.window.accepted for c in classes.values()) == engine.accepted
        print({n: (c.window.acceptance_rate, c.window.draft_tokens) for n, c in classes.items()},
              engine.acceptance_rate)
        # The class alert fires for the hard class only; the engine-wide one does not fire at all.
        alerts = Evaluator(llm.specscope, thresholds=Thresholds(weak_draft_for_s=0)).evaluate(snap)
        firing = {(a.rule, dict(a.labels).get("traffic_class")) for a in alerts if a.state == "firing"}
        assert ("SpecscopeWeakDraftForClass", "hard") in firing, firing
        assert not any(r == "SpecscopeWeakDraftForClass" and c != "hard" for r, c in firing), firing
        assert not any(r == "SpecscopeWeakDraft" for r, _ in firing), firing
        captured_while_weak(llm, hard, outputs["hard"], tmp_path / "capture")
    finally:
        shutdown(llm)
