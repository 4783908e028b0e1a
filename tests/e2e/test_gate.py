"""``specscope evaluate --gate`` on real engines over the deep family's f = 0.01 target and its two classes of
prompts (tests/fixtures/evaluate-prompts.jsonl): its layer-0 draft against the tiny family's ``independent`` model
(same tokenizer, unrelated weights). The good draft over the unrelated one is promoted (exit 0); the same paired
rounds, read the other way round, reject the unrelated one over the good one (exit 3): effects far outside the
noise, decided in three short rounds.
Whether the gate decides as a long measurement does on closer pairs is the benchmark's to show, not this test's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specscope.cli import main
from specscope.read.evaluate import gate as gating
from specscope.read.evaluate import gate_report
from tests.conftest import ENGINE_KW, FIXTURES

pytestmark = pytest.mark.engine

PROMPTS = FIXTURES / "evaluate-prompts.jsonl"


def gate(tiny: dict[str, Path], tmp_path: Path, candidate: str, incumbent: str) -> tuple[int, dict[str, Any], str]:
    args = [str(tiny["deep01-target"]), "--draft", str(tiny[candidate]), "--incumbent", str(tiny[incumbent]),
            "--prompts", str(PROMPTS), "--gate", "--weak", "chat", "--k", "2", "--batch-sizes", "1", "--rounds", "3",
            "--window-s", "2", "--max-tokens", "32", "--json", str(tmp_path / f"{candidate}.json"),
            "-o", str(tmp_path / f"{candidate}.html")]
    for key, value in {**ENGINE_KW, "max_model_len": 1024}.items():
        args += ["--engine-arg", f"{key}={json.dumps(value)}"]
    code = main(["evaluate", *args])
    doc = json.loads((tmp_path / f"{candidate}.json").read_text())
    return code, doc, (tmp_path / f"{candidate}.html").read_text()


def test_the_gate_promotes_the_good_draft_over_an_unrelated_one_and_rejects_the_reverse(
        tiny: dict[str, Path], engines: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    engines.close()  # the command starts its own engines
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "")  # recorded, so that what the command sets is undone after the test
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")  # the command sets it for its process
    code, doc, page = gate(tiny, tmp_path, "deep01-draft", "independent")
    r = capsys.readouterr()
    print(r.out)
    g = doc["gate"]
    assert code == 0 and g["decision"] == "promote", (g["reasons"], r.err[-3000:])
    assert not doc["partial"] and g["candidate"]["status"] == g["incumbent"]["status"] == "measured"
    assert g["shares_source"] == "prompts file (output tokens)" and set(g["shares"]) == {"prose", "chat"}
    batch = g["by_batch"]["1"]
    assert batch["weighted"]["ratio"]["low"] > 1.0 and batch["weighted"]["ratio"]["rounds"] == 3
    for name in ("prose", "chat"):
        c = batch["classes"][name]
        assert c["regresses"] is False and c["candidate"]["value"] > c["incumbent"]["value"]
        # Every round ran both drafts, plain and speculative, on that class's prompts alone.
        for arm in ("candidate", "incumbent"):
            m = g[arm]["measured"]["1"][name]
            assert len(m["plain_tok_s"]) == len(m["speculative_tok_s"]) == 3
        assert g["candidate"]["acceptance"][name]["acceptance"] > g["incumbent"]["acceptance"][name]["acceptance"]
    assert "[incumbent independent] batch 1 class chat round 3/3" in r.err
    assert page.index("Decision: PROMOTE (exit 0)") < page.index("<table")
    # The decision is the summary's first line (vLLM's own log lines may reach stdout too, depending on what
    # configured its logging before this test).
    ours = [line for line in r.out.splitlines() if not line.startswith("(") and " WARNING " not in line
            and " INFO " not in line]
    assert ours[0].startswith("PROMOTE (exit 0): deep01-draft over independent at K=2"), r.out[-2000:]

    # The reverse, from the same paired rounds (the engines' order is the only difference a second run would make):
    # the unrelated draft over the good one is rejected, its traffic ratio's interval under 1.
    measured = gate_report.from_dict(g)
    reverse = gating.decide(replace(measured, candidate=measured.incumbent, incumbent=measured.candidate))
    (batch1,) = reverse.batches
    assert reverse.decision == "reject" and reverse.exit_code == 3, reverse.reasons
    assert batch1.ratio is not None and batch1.ratio.high is not None and batch1.ratio.high < 1.0
