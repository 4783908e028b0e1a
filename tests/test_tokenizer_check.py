"""The tokenizer check on the tiny models, through the API and the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specscope.tokenizer_check import compare


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specscope.cli", "check-tokenizers", *args], capture_output=True,
                          text=True, timeout=120)


def test_identical(tiny: dict[str, Path]) -> None:
    report = compare(str(tiny["target"]), str(tiny["copy"]))
    assert report.verdict == "identical" and report.reasons == [] and report.probes_identical == 1.0
    r = cli(str(tiny["target"]), str(tiny["copy"]))
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


@pytest.mark.parametrize("args", [("/no/such/dir", "/no/such/draft"), ("only-one",)])
def test_bad_input_is_one_line_and_exit_2(tiny: dict[str, Path], args: Any) -> None:
    r = cli(*args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("specscope: error:")


def test_help_documents_the_exit_codes() -> None:
    r = cli("--help")
    assert r.returncode == 0 and "0 identical or compatible" in " ".join(r.stdout.split())
