"""``specscope evaluate --gate`` on real engines over the deep family's f = 0.01 target and its two classes of
prompts (tests/fixtures/evaluate-prompts.jsonl): its layer-0 draft against the tiny family's ``independent`` model
(same tokenizer, unrelated weights), each way round. The good draft over the unrelated one is promoted (exit 0),
the unrelated one over the good one rejected (exit 3): effects far outside the noise, decided in three short rounds.
Whether the gate decides as a long measurement does on closer pairs is the benchmark's to show, not this test's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specscope.cli import main
from tests.conftest import ENGINE_KW, FIXTURES

pytestmark = pytest.mark.engine

PROMPTS = FIXTURES / "evaluate-prompts.jsonl"


def gate(tiny: dict[str, Path], tmp_path: Path, candidate: str, incumbent: str) -> tuple[int, dict[str, Any], str]:
    args = [str(tiny["deep01-target"]), "--draft", str(tiny[candidate]), "--incumbent", str(tiny[incumbent]),
            "--prompts", str(PROMPTS), "--gate", "--weak", "chat", "--k", "2", "--batch-sizes", "1", "--rounds", "3",
            "--window-s", "2", "--max-tokens", "64", "--json", str(tmp_path / f"{candidate}.json"),
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
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
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
    assert r.out.startswith("PROMOTE (exit 0): deep01-draft over independent at K=2")

    code, doc, page = gate(tiny, tmp_path, "independent", "deep01-draft")
    r = capsys.readouterr()
    print(r.out)
    g = doc["gate"]
    assert code == 3 and g["decision"] == "reject", (g["reasons"], r.err[-3000:])
    assert g["by_batch"]["1"]["weighted"]["ratio"]["high"] < 1.0
    assert page.index("Decision: REJECT (exit 3)") < page.index("<table")
