"""The rendered Prometheus rules: checked in, accepted by promtool, and right on firing and quiet series."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specscope.alerts.prometheus_rules import render, rule_groups
from specscope.alerts.rules import RULES, Thresholds

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus not installed")


def test_checked_in_rules_equal_what_specscope_rules_renders() -> None:
    assert (DEPLOY / "specscope-rules.yml").read_text() == render(), "run: specscope rules > deploy/prometheus/..."
    assert (DEPLOY / "specscope-vllm-rules.yml").read_text() == render(vllm_only=True)


def test_thresholds_reach_the_rendered_expressions() -> None:
    rules = rule_groups(Thresholds(weak_draft_acceptance=0.45, fragmentation=0.7))["groups"][0]["rules"]
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert "< 0.45" in exprs["SpecscopeWeakDraft"] and "> 0.7" in exprs["SpecscopeKVCacheFragmentation"]


@needs_promtool
def test_promtool_check_rules() -> None:
    r = subprocess.run(["promtool", "check", "rules", str(DEPLOY / "specscope-rules.yml"),
                        str(DEPLOY / "specscope-vllm-rules.yml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def labels(model: str, **extra: str) -> dict[str, str]:
    return {"draft_model": "d", "engine": "0", "method": "draft_model", "model": model, "server": "vllm", **extra}


def series(name: str, lab: dict[str, str], values: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
    return {"series": f"{name}{{{body}}}", "values": values}


def drafting(model: str, acceptance: float, mean_length: float, engine: str = "0") -> list[dict[str, str]]:
    """specscope's windowed gauges for one engine that drafts 300 tokens per 15 s."""
    lab = labels(model, engine=engine)
    return [series("specscope_spec_decode_acceptance_rate_ratio", lab, f"{acceptance}x40"),
            series("specscope_spec_decode_mean_acceptance_length", lab, f"{mean_length}x40"),
            series("specscope_spec_decode_draft_tokens_total", lab, "0+300x40")]


def vllm_drafting(model: str, accepted: int, engine: str = "0") -> list[dict[str, str]]:
    """vLLM's counters for one engine at K=4: 75 drafts (300 tokens) and ``accepted`` tokens per 15 s."""
    lab = {"engine": engine, "model_name": model}
    return [series("vllm:spec_decode_num_accepted_tokens_total", lab, f"0+{accepted}x40"),
            series("vllm:spec_decode_num_draft_tokens_total", lab, "0+300x40"),
            series("vllm:spec_decode_num_drafts_total", lab, "0+75x40")]


# Per rule: input series with one engine that must fire ("bad") and others that must stay quiet, and the labels
# of the expected alert. 41 samples at 15 s: 10 minutes of data.
CASES: dict[str, tuple[list[dict[str, str]], dict[str, str]]] = {
    "SpecscopeWeakDraft": ([
        *drafting("bad", 0.2, 1.8),
        *drafting("good", 0.8, 4.2),
        *drafting("collapsed", 0.01, 1.04),  # its own, critical alert
        series("specscope_spec_decode_acceptance_rate_ratio", labels("idle"), "0.1x40"),  # stale, not drafting
        series("specscope_spec_decode_mean_acceptance_length", labels("idle"), "1.4x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("idle"), "500x40"),
    ], labels("bad")),
    "SpecscopeAcceptanceCollapse": ([
        *drafting("collapsed", 0.01, 1.04),
        *drafting("weak", 0.2, 1.8),
        *drafting("good", 0.8, 4.2),
        series("specscope_spec_decode_mean_acceptance_length", labels("idle"), "1.0x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("idle"), "500x40"),
    ], labels("collapsed")),
    "SpecscopeEngineDiverging": ([
        *drafting("m", 0.8, 4.2, engine="0"), *drafting("m", 0.78, 4.1, engine="1"),
        *drafting("m", 0.4, 2.6, engine="2"),  # the one that diverges
        *drafting("alone", 0.2, 1.8, engine="0"),  # a single engine has no peers
        *drafting("alike", 0.5, 3.0, engine="0"), *drafting("alike", 0.45, 2.8, engine="1"),  # within 0.15
    ], labels("m", engine="2")),
    "SpecscopeSpeculationNotPaying": ([
        series("specscope_spec_decode_expected_speedup_ratio", labels("bad"), "0.7x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("bad"), "0+300x40"),
        series("specscope_spec_decode_expected_speedup_ratio", labels("good"), "1.8x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("good"), "0+300x40"),
    ], labels("bad")),
    "SpecscopeTokenizerMismatch": ([
        series("specscope_tokenizer_verdict", labels("bad", state="mismatch"), "1x40"),
        series("specscope_tokenizer_verdict", labels("bad", state="warning"), "0x40"),
        series("specscope_tokenizer_verdict", labels("good", state="mismatch"), "0x40"),
        series("specscope_tokenizer_verdict", labels("good", state="identical"), "1x40"),
        series("specscope_tokenizer_verdict", labels("added", state="mismatch"), "0x40"),
        series("specscope_tokenizer_verdict", labels("added", state="warning"), "1x40"),
    ], labels("bad", state="mismatch")),
    "SpecscopeTokenizerWarning": ([
        series("specscope_tokenizer_verdict", labels("added", state="warning"), "1x40"),
        series("specscope_tokenizer_verdict", labels("added", state="mismatch"), "0x40"),
        series("specscope_tokenizer_verdict", labels("bad", state="warning"), "0x40"),
        series("specscope_tokenizer_verdict", labels("bad", state="mismatch"), "1x40"),
    ], labels("added", state="warning")),
    "SpecscopeKVCacheFragmentation": ([
        series("specscope_kv_cache_fragmentation_ratio", labels("bad"), "0.7x40"),
        series("specscope_kv_cache_block_usage_ratio", labels("bad"), "0.8x40"),
        series("specscope_kv_cache_fragmentation_ratio", labels("good"), "0.3x40"),
        series("specscope_kv_cache_block_usage_ratio", labels("good"), "0.8x40"),
        # One short request in a large block on an idle engine: fragmented, but nothing runs short.
        series("specscope_kv_cache_fragmentation_ratio", labels("idle"), "0.69x40"),
        series("specscope_kv_cache_block_usage_ratio", labels("idle"), "0.01x40"),
    ], labels("bad")),
    "SpecscopeKVCachePressure": ([
        series("specscope_kv_cache_block_usage_ratio", labels("bad"), "0.95x40"),
        series("specscope_engine_preemptions_total", labels("bad"), "0+1x40"),
        series("specscope_kv_cache_block_usage_ratio", labels("full-but-calm"), "0.95x40"),
        series("specscope_engine_preemptions_total", labels("full-but-calm"), "3x40"),
    ], labels("bad")),
    "SpecscopeDraftCrowdsKVCache": ([
        series("specscope_kv_cache_draft_share_ratio", labels("bad"), "0.2x40"),
        series("specscope_kv_cache_block_usage_ratio", labels("bad"), "0.95x40"),
        # The same draft with blocks to spare (vLLM preallocates by design): quiet.
        series("specscope_kv_cache_draft_share_ratio", labels("spare"), "0.2x40"),
        series("specscope_kv_cache_block_usage_ratio", labels("spare"), "0.5x40"),
        series("specscope_kv_cache_draft_share_ratio", labels("small"), "0.01x40"),  # a draft that costs little
        series("specscope_kv_cache_block_usage_ratio", labels("small"), "0.95x40"),
    ], labels("bad")),
}

VLLM_CASES: dict[str, tuple[list[dict[str, str]], dict[str, str]]] = {
    "SpecscopeWeakDraft": ([
        *vllm_drafting("bad", 60), *vllm_drafting("good", 240), *vllm_drafting("collapsed", 2),
    ], {"engine": "0", "model_name": "bad"}),
    "SpecscopeAcceptanceCollapse": ([
        *vllm_drafting("bad", 60), *vllm_drafting("good", 240), *vllm_drafting("collapsed", 2),
    ], {"engine": "0", "model_name": "collapsed"}),
    "SpecscopeEngineDiverging": ([
        *vllm_drafting("m", 240, "0"), *vllm_drafting("m", 234, "1"), *vllm_drafting("m", 120, "2"),
        *vllm_drafting("alone", 60), *vllm_drafting("alike", 150, "0"), *vllm_drafting("alike", 135, "1"),
    ], {"engine": "2", "model_name": "m"}),
    "SpecscopeKVCachePressure": ([
        series("vllm:kv_cache_usage_perc", {"engine": "0", "model_name": "bad"}, "0.95x40"),
        series("vllm:num_preemptions_total", {"engine": "0", "model_name": "bad"}, "0+1x40"),
        series("vllm:kv_cache_usage_perc", {"engine": "0", "model_name": "good"}, "0.5x40"),
        series("vllm:num_preemptions_total", {"engine": "0", "model_name": "good"}, "0+1x40"),
    ], {"engine": "0", "model_name": "bad"}),
}


def promtool_tests(rule_file: Path, cases: dict[str, Any], vllm_only: bool) -> dict[str, Any]:
    rendered = {r["alert"]: r for r in rule_groups(vllm_only=vllm_only)["groups"][0]["rules"]}
    assert set(cases) == set(rendered)  # every rule has a firing and a quiet case
    tests = []
    for name, (inputs, fired_labels) in cases.items():
        rule = rendered[name]
        expected = {"exp_labels": {**fired_labels, **rule["labels"]}, "exp_annotations": rule["annotations"]}
        checks = [{"eval_time": "10m", "alertname": name, "exp_alerts": [expected]}]
        if "for" in rule:  # before `for` has elapsed the alert is only pending: nothing fires
            checks.insert(0, {"eval_time": "30s", "alertname": name, "exp_alerts": []})
        tests.append({"interval": "15s", "input_series": inputs, "alert_rule_test": checks})
    return {"rule_files": [str(rule_file)], "evaluation_interval": "15s", "tests": tests}


@needs_promtool
@pytest.mark.parametrize("vllm_only", [False, True])
def test_promtool_test_rules_fire_and_stay_quiet(tmp_path: Path, vllm_only: bool) -> None:
    rule_file = DEPLOY / ("specscope-vllm-rules.yml" if vllm_only else "specscope-rules.yml")
    spec = promtool_tests(rule_file, VLLM_CASES if vllm_only else CASES, vllm_only)
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_rule_has_a_runbook_section() -> None:
    runbook = (DEPLOY.parents[1] / "docs" / "runbook.md").read_text().lower()
    for rule in RULES:
        assert f"## {rule.name.lower()}" in runbook, rule.name
