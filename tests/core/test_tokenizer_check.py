"""The tokenizer check on the tiny models, through the API and the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specscope.core.tokenizer_check import compare


def cli(*args: str, process: bool = False) -> subprocess.CompletedProcess[str]:
    """``specscope check-tokenizers ARGS``: in this process (its ``main``, output captured), or with ``process`` as
    the console script runs it (a new interpreter: ~5 s of imports)."""
    if process:
        return subprocess.run([sys.executable, "-m", "specscope.cli", "check-tokenizers", *args],
                              capture_output=True, text=True, timeout=120)
    from specscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["check-tokenizers", *args])
        except SystemExit as exc:  # argparse: --help, usage errors
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def test_identical(tiny: dict[str, Path]) -> None:
    report = compare(str(tiny["target"]), str(tiny["copy"]))
    assert report.verdict == "identical" and report.reasons == [] and report.probes_identical == 1.0
    r = cli(str(tiny["target"]), str(tiny["copy"]), process=True)
    assert r.returncode == 0 and r.stdout.startswith("verdict: IDENTICAL")


def test_cosmetic_difference_is_compatible(tiny: dict[str, Path], tmp_path: Path) -> None:
    cosmetic = tmp_path / "cosmetic"
    shutil.copytree(tiny["target"], cosmetic, ignore=shutil.ignore_patterns("*.safetensors"))
    spec = json.loads((cosmetic / "tokenizer.json").read_text())
    spec["decoder"]["trim_offsets"] = not spec["decoder"].get("trim_offsets", True)
    (cosmetic / "tokenizer.json").write_text(json.dumps(spec))
    report = compare(str(tiny["target"]), str(cosmetic))
    assert report.verdict == "compatible"
    assert report.pipeline_differences == ["decoder"] and report.ids_differing == 0
    assert cli(str(tiny["target"]), str(cosmetic)).returncode == 0


def test_same_size_other_tokenizer_is_a_mismatch_with_examples(tiny: dict[str, Path]) -> None:
    report = compare(str(tiny["target"]), str(tiny["other-tokenizer"]))
    assert report.verdict == "mismatch"
    assert report.vocab_size == (2000, 2000)  # what vLLM checks, and passes
    assert report.ids_differing > 1000
    _token, a, b = report.id_examples[0]
    assert a is not None and b is not None and a != b  # a token both know, under different ids
    assert report.probes_identical < 0.5 and report.first_divergence is not None
    r = cli(str(tiny["target"]), str(tiny["other-tokenizer"]), "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["verdict"] == "mismatch"


def test_other_vocabulary_size_is_a_mismatch(tiny: dict[str, Path]) -> None:
    report = compare(str(tiny["target"]), str(tiny["other-vocab"]))
    assert report.verdict == "mismatch"
    assert any("vocabulary sizes differ" in r for r in report.reasons)


def _variant(src: Path, dest: Path, edit: Any = None, vocab_size: int | None = None) -> str:
    """A weightless copy of ``src`` with its tokenizer edited (``edit(tokenizer)``) or its configured vocabulary
    size changed."""
    from transformers import AutoTokenizer

    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.safetensors"))
    if edit is not None:
        tok = AutoTokenizer.from_pretrained(dest, local_files_only=True)
        edit(tok)
        tok.save_pretrained(dest)
    if vocab_size is not None:
        config = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**config, "vocab_size": vocab_size}))
    return str(dest)


def test_added_token_is_a_warning_not_a_mismatch(tiny: dict[str, Path], tmp_path: Path) -> None:
    target = str(tiny["target"])
    draft = _variant(tiny["target"], tmp_path / "added", lambda t: t.add_tokens(["<tool_call>"]))
    report = compare(target, draft)
    assert report.verdict == "warning" and report.reasons == []
    assert any("one vocabulary only (target 0, draft 1)" in w for w in report.warnings)
    assert report.overlap == 1.0  # every target token is proposable
    reverse = compare(draft, target)  # the target has a token the draft lacks: a ceiling below 1
    assert reverse.verdict == "warning" and reverse.overlap == pytest.approx(2000 / 2001)
    r = cli(target, draft)
    assert r.returncode == 0 and r.stdout.startswith("verdict: WARNING") and "warning: " in r.stdout
    assert report.status().verdict == "warning" and report.status().reasons == tuple(report.warnings)


@pytest.mark.parametrize("edit, expected", [
    (lambda t: setattr(t, "pad_token", t.eos_token), "pad_token differs"),  # pad = eos, a common setup
    (lambda t: setattr(t, "chat_template", "{{ messages[0]['content'] }}"), "chat templates differ"),
], ids=["pad", "chat-template"])
def test_special_token_or_chat_template_difference_is_a_warning(tiny: dict[str, Path], tmp_path: Path,
                                                               edit: Any, expected: str) -> None:
    report = compare(str(tiny["target"]), _variant(tiny["target"], tmp_path / "d", edit))
    assert report.verdict == "warning" and report.reasons == [] and report.ids_differing == 0
    assert any(expected in w for w in report.warnings), report.warnings


def test_padded_vocabulary_is_judged_by_the_configured_size(tiny: dict[str, Path], tmp_path: Path) -> None:
    # Tokenizer of 2000 tokens, embedding padded to 2048 (as Qwen models ship): what vLLM compares is the config.
    padded_t = _variant(tiny["target"], tmp_path / "t", vocab_size=2048)
    padded_d = _variant(tiny["target"], tmp_path / "d", vocab_size=2048)
    assert compare(padded_t, padded_d).verdict == "identical"
    unpadded = compare(padded_t, str(tiny["copy"]))
    assert unpadded.verdict == "mismatch"
    assert unpadded.reasons == ["vocabulary sizes differ: target 2048, draft 2000 (vLLM refuses to start)"]


@pytest.mark.parametrize("args", [("/no/such/dir", "/no/such/draft"), ("only-one",)])
def test_bad_input_is_one_line_and_exit_2(tiny: dict[str, Path], args: Any) -> None:
    r = cli(*args, process=True)  # what a user sees: no traceback
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("specscope: error:")


def test_help_documents_the_exit_codes() -> None:
    r = cli("--help")
    text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "0 identical, compatible" in text and "or warning" in text and "1 mismatch" in text


def test_a_tokenizer_that_cannot_be_loaded_shows_in_health() -> None:
    """No verdict is not a quiet INFO line: the failed check is counted where the snapshot and top show it."""
    from specscope.core.tokenizer_check import record_verdict
    from specscope.state.hub import Hub

    hub = Hub()
    record_verdict("/nonexistent/target", "/nonexistent/draft", hub)
    snap = hub.snapshot()
    assert snap.tokenizer is None
    assert dict(snap.health.errors) == {"tokenizer check": 1}
    assert "no such directory" in (snap.health.last_error or "")
