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
    return {"draft_model": "d", "engine": "vllm", "method": "draft_model", "model": model, **extra}


def series(name: str, lab: dict[str, str], values: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
    return {"series": f"{name}{{{body}}}", "values": values}


# Per rule: input series with one engine that must fire ("bad") and others that must stay quiet, and the labels
# of the expected alert. 41 samples at 15 s: 10 minutes of data.
CASES: dict[str, tuple[list[dict[str, str]], dict[str, str]]] = {
    "SpecscopeWeakDraft": ([
        series("specscope_spec_decode_acceptance_rate_ratio", labels("bad"), "0.2x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("bad"), "0+300x40"),
        series("specscope_spec_decode_acceptance_rate_ratio", labels("good"), "0.8x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("good"), "0+300x40"),
        series("specscope_spec_decode_acceptance_rate_ratio", labels("idle"), "0.1x40"),  # stale, not drafting
        series("specscope_spec_decode_draft_tokens_total", labels("idle"), "500x40"),
    ], labels("bad")),
    "SpecscopeSpeculationNotPaying": ([
        series("specscope_spec_decode_expected_speedup_ratio", labels("bad"), "0.7x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("bad"), "0+300x40"),
        series("specscope_spec_decode_expected_speedup_ratio", labels("good"), "1.8x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("good"), "0+300x40"),
    ], labels("bad")),
    "SpecscopeTokenizerMismatch": ([
        series("specscope_tokenizer_mismatch_ratio", labels("bad", state="mismatch"), "1x40"),
        series("specscope_tokenizer_mismatch_ratio", labels("good", state="identical"), "0x40"),
    ], labels("bad", state="mismatch")),
    "SpecscopeKVCacheFragmentation": ([
        series("specscope_kv_cache_fragmentation_ratio", labels("bad"), "0.7x40"),
        series("specscope_kv_cache_fragmentation_ratio", labels("good"), "0.3x40"),
    ], labels("bad")),
    "SpecscopeKVCachePressure": ([
        series("specscope_kv_cache_block_usage_ratio", labels("bad"), "0.95x40"),
        series("specscope_engine_preemptions_total", labels("bad"), "0+1x40"),
        series("specscope_kv_cache_block_usage_ratio", labels("full-but-calm"), "0.95x40"),
        series("specscope_engine_preemptions_total", labels("full-but-calm"), "3x40"),
    ], labels("bad")),
    "SpecscopeGPUMemoryHigh": ([
        series("hw_gpu_memory_usage_bytes", {"hw_id": "0", "hw_name": "G", "hw_type": "gpu"}, "96x40"),
        series("hw_gpu_memory_limit_bytes", {"hw_id": "0", "hw_name": "G", "hw_type": "gpu"}, "100x40"),
        series("hw_gpu_memory_usage_bytes", {"hw_id": "1", "hw_name": "G", "hw_type": "gpu"}, "50x40"),
        series("hw_gpu_memory_limit_bytes", {"hw_id": "1", "hw_name": "G", "hw_type": "gpu"}, "100x40"),
    ], {"hw_id": "0", "hw_name": "G", "hw_type": "gpu"}),
}

VLLM_CASES: dict[str, tuple[list[dict[str, str]], dict[str, str]]] = {
    "SpecscopeWeakDraft": ([
        series("vllm:spec_decode_num_accepted_tokens_total", {"engine": "0", "model_name": "bad"}, "0+60x40"),
        series("vllm:spec_decode_num_draft_tokens_total", {"engine": "0", "model_name": "bad"}, "0+300x40"),
        series("vllm:spec_decode_num_accepted_tokens_total", {"engine": "0", "model_name": "good"}, "0+240x40"),
        series("vllm:spec_decode_num_draft_tokens_total", {"engine": "0", "model_name": "good"}, "0+300x40"),
    ], {"engine": "0", "model_name": "bad"}),
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
