"""The docs' benchmark figures match their results files, and a replay never replaces an as-run results file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _common
from tests.conftest import REPO

ROOT = REPO
SCRIPT = ROOT / "scripts" / "figures.py"


def figures(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_docs_quote_the_saved_results() -> None:
    done = figures("--check")
    assert done.returncode == 0, done.stderr


def test_a_changed_result_fails_the_check_naming_the_figure(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    record = json.loads((results / "record.json").read_text())
    record["ratio_specscope_over_vllm"] = 0.5
    (results / "record.json").write_text(json.dumps(record))
    done = figures("--check", "--results", str(results))
    assert done.returncode == 1
    assert "figure record.ratio" in done.stderr and "'0.500x'" in done.stderr
    assert "record.share" not in done.stderr


def test_an_unknown_figure_or_missing_key_is_one_line_and_exit_2(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    results = ROOT / "benchmarks" / "results"
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text() + "<!-- fig no.such -->1x<!-- /fig -->\n")
    done = figures("--check", "--root", str(tmp_path), "--results", str(results))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no.such" in done.stderr

    shutil.copy(ROOT / "README.md", readme)
    copied = tmp_path / "results"
    shutil.copytree(results, copied)
    (copied / "record.json").write_text("{}")
    done = figures("--check", "--root", str(tmp_path), "--results", str(copied))
    assert done.returncode == 2 and "record.json" in done.stderr


def test_rendering_rewrites_the_marked_spans(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text().replace(
        "<!-- fig demo.runs -->", "<!-- fig demo.runs -->WRONG<!-- /fig --><!-- fig demo.runs -->", 1))
    results = str(ROOT / "benchmarks" / "results")
    assert figures("--check", "--root", str(tmp_path), "--results", results).returncode == 1
    assert figures("--root", str(tmp_path), "--results", results).returncode == 0
    assert figures("--check", "--root", str(tmp_path), "--results", results).returncode == 0
    assert "WRONG" not in readme.read_text()


def test_write_records_provenance_and_a_replay_never_replaces_an_as_run_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    _common.write("bench", {"speedup": 1.5}, seed=11)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["judged"] == "as-run" and saved["seed"] == 11 and saved["speedup"] == 1.5
    assert saved["commit"] and "dirty" in saved and saved["date"].endswith("+00:00")

    replay = "replay of bench.json by abc123"
    with pytest.raises(FileExistsError, match="as-run"):
        _common.write("bench", {**saved, "speedup": 1.1}, judged=replay)
    assert json.loads((tmp_path / "bench.json").read_text()) == saved
    (tmp_path / "old.json").write_text(json.dumps({"speedup": 1.5}))  # saved before `judged` was recorded
    with pytest.raises(FileExistsError):
        _common.write("old", {"speedup": 1.1}, judged=replay)

    _common.write("bench_replay", {**saved, "speedup": 1.1}, judged=replay)  # carries the as-run file's keys
    assert json.loads((tmp_path / "bench_replay.json").read_text())["judged"] == replay
    _common.write("bench_replay", {"speedup": 1.2}, judged=replay)  # a replay may replace a replay
    _common.write("bench", {"speedup": 1.6})  # and a measurement a measurement
    assert json.loads((tmp_path / "bench.json").read_text())["speedup"] == 1.6
