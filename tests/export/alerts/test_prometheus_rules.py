"""The rendered Prometheus rules: checked in, accepted by promtool, and right on firing and quiet series."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specscope.export.alerts.prometheus_rules import render, rule_groups
from specscope.export.alerts.rules import RULES, Thresholds
from tests.conftest import REPO

DEPLOY = REPO / "deploy" / "prometheus"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus not installed")


def test_checked_in_rules_equal_what_specscope_rules_renders() -> None:
    assert (DEPLOY / "specscope-rules.yml").read_text() == render(), "run: specscope rules > deploy/prometheus/..."
    assert (DEPLOY / "specscope-vllm-rules.yml").read_text() == render(vllm_only=True)


def test_thresholds_reach_the_rendered_expressions() -> None:
    records, alerts = rule_groups(Thresholds(weak_draft_acceptance=0.45, fragmentation=0.7, window_s=120))["groups"]
    exprs = {r["alert"]: r["expr"] for r in alerts["rules"]}
    assert "< 0.45" in exprs["SpecscopeWeakDraft"] and "> 0.7" in exprs["SpecscopeKVCacheFragmentation"]
    # The window reaches the recorded rates and the alerts that read them.
    recorded = {r["record"]: r["expr"] for r in records["rules"]}
    assert recorded["engine:specscope_spec_decode_draft_tokens:rate2m"] == \
        "rate(specscope_spec_decode_draft_tokens_total[2m])"
    assert "engine:specscope_spec_decode_acceptance_rate:rate2m < 0.45" in exprs["SpecscopeWeakDraft"]
    assert "draft_tokens:rate2m * 120 >= 200" in exprs["SpecscopeWeakDraft"]


def test_alerts_read_only_series_the_recording_rules_record_or_exporters_export() -> None:
    for vllm_only in (False, True):
        records, alerts = rule_groups(vllm_only=vllm_only)["groups"]
        recorded = {r["record"] for r in records["rules"]}
        for rule in alerts["rules"]:
            for name in re.findall(r"[a-z_]+:[a-z_]+:rate\w+", rule["expr"]):
                assert name in recorded, (rule["alert"], name)


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


def drafting(model: str, accepted: int, engine: str = "0") -> list[dict[str, str]]:
    """specscope's counters for one engine at K=4: 75 drafts (300 tokens) and ``accepted`` tokens per 15 s."""
    lab = labels(model, engine=engine)
    return [series("specscope_spec_decode_accepted_tokens_total", lab, f"0+{accepted}x40"),
            series("specscope_spec_decode_draft_tokens_total", lab, "0+300x40"),
            series("specscope_spec_decode_drafts_total", lab, "0+75x40")]


def allocator(model: str, gpu: str, *, reserved: float, allocated: float, used: float) -> list[dict[str, str]]:
    """One GPU of one specscope exporter (its ``instance``): torch's allocator in GiB and the device's use."""
    gib = 1 << 30
    inst = {"instance": f"{model}:9464"}
    alloc = {**inst, "server": "vllm", "model": model, "hw_id": gpu}
    device = {**inst, "hw_id": gpu, "hw_name": "H100", "hw_type": "gpu"}
    return [series("specscope_gpu_allocator_memory_bytes", {**alloc, "state": "reserved"}, f"{reserved * gib:.0f}x40"),
            series("specscope_gpu_allocator_memory_bytes", {**alloc, "state": "allocated"},
                   f"{allocated * gib:.0f}x40"),
            series("hw_gpu_memory_usage_bytes", device, f"{used * 80 * gib:.0f}x40"),
            series("hw_gpu_memory_limit_bytes", device, f"{80 * gib:.0f}x40")]


def vllm_drafting(model: str, accepted: int, engine: str = "0") -> list[dict[str, str]]:
    """vLLM's counters for one engine at K=4: 75 drafts (300 tokens) and ``accepted`` tokens per 15 s."""
    lab = {"engine": engine, "model_name": model}
    return [series("vllm:spec_decode_num_accepted_tokens_total", lab, f"0+{accepted}x40"),
            series("vllm:spec_decode_num_draft_tokens_total", lab, "0+300x40"),
            series("vllm:spec_decode_num_drafts_total", lab, "0+75x40")]


def class_drafting(cls: str, accepted: int, draft_tokens: int = 300, model: str = "m") -> list[dict[str, str]]:
    """specscope's per-class counters of a server: ``draft_tokens`` and ``accepted`` tokens per 15 s."""
    lab = {**labels(model), "traffic_class": cls}
    del lab["engine"]
    return [series("specscope_class_accepted_tokens_total", lab, f"0+{accepted}x40"),
            series("specscope_class_draft_tokens_total", lab, f"0+{draft_tokens}x40"),
            series("specscope_class_requests_total", lab, "0+5x40")]


def idle(model: str, engine: str = "0") -> list[dict[str, str]]:
    """An engine that drafted once (a low acceptance) and has been idle since: its counters stand still."""
    lab = labels(model, engine=engine)
    return [series("specscope_spec_decode_accepted_tokens_total", lab, "10x40"),
            series("specscope_spec_decode_draft_tokens_total", lab, "500x40"),
            series("specscope_spec_decode_drafts_total", lab, "125x40")]


# Per rule: input series with one engine that must fire ("bad") and others that must stay quiet, and the labels
# of the expected alert. 41 samples at 15 s: 10 minutes of data.
CASES: dict[str, tuple[list[dict[str, str]], dict[str, str]]] = {
    "SpecscopeWeakDraft": ([
        *drafting("bad", 60),  # acceptance 0.2, 1.8 tokens a step
        *drafting("good", 240),
        *drafting("collapsed", 3),  # 1.04 tokens a step: its own, critical alert
        *idle("idle"),
    ], labels("bad")),
    "SpecscopeWeakDraftForClass": ([
        *class_drafting("code", 60),  # 0.2, while the server's steps accept 0.4
        *class_drafting("chat", 96),  # 0.32: not weak
        *class_drafting("rare", 1, draft_tokens=2),  # too few drafts to judge
        # The classes' records sum to 0.26 (their windows' edges differ from the steps'; exaggerated here): the
        # steps decide, as SpecscopeWeakDraft's do, so the class alert is not silenced with SpecscopeWeakDraft quiet.
        *drafting("m", 120),
        # A server weak as a whole: SpecscopeWeakDraft says so; its classes do not alert again.
        *class_drafting("code", 30, model="weak"), *class_drafting("chat", 60, model="weak"), *drafting("weak", 45),
    ], {**{k: v for k, v in labels("m").items() if k != "engine"}, "traffic_class": "code"}),
    "SpecscopeAcceptanceCollapse": ([
        *drafting("collapsed", 3),
        *drafting("weak", 60),
        *drafting("good", 240),
        *idle("idle"),
    ], labels("collapsed")),
    "SpecscopeEngineDiverging": ([
        *drafting("m", 240, engine="0"), *drafting("m", 234, engine="1"),
        *drafting("m", 120, engine="2"),  # the one that diverges
        *drafting("alone", 60, engine="0"),  # a single engine has no peers
        *drafting("alike", 150, engine="0"), *drafting("alike", 135, engine="1"),  # within 0.15
        *idle("m", engine="3"),  # an idle engine of the same model is no peer and no outlier
    ], labels("m", engine="2")),
    "SpecscopeSpeculationNotPaying": ([
        series("specscope_spec_decode_expected_speedup_ratio", labels("bad"), "0.7x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("bad"), "0+300x40"),
        series("specscope_spec_decode_expected_speedup_ratio", labels("good"), "1.8x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("good"), "0+300x40"),
        series("specscope_spec_decode_expected_speedup_ratio", labels("idle"), "0.7x40"),  # not drafting now
        series("specscope_spec_decode_draft_tokens_total", labels("idle"), "500x40"),
        # Decoding without drafts: the operating batch in a K = 0 range of vLLM's schedule, the draft's pass alone.
        series("specscope_spec_decode_expected_speedup_ratio", labels("k0"), "0.82x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("k0"), "500x40"),
        series("specscope_tokens_total", labels("k0", state="output"), "0+160x40"),
        series("specscope_spec_decode_expected_speedup_ratio", labels("k0-idle"), "0.82x40"),
        series("specscope_spec_decode_draft_tokens_total", labels("k0-idle"), "500x40"),
        series("specscope_tokens_total", labels("k0-idle", state="output"), "900x40"),
    ], [labels("bad"), labels("k0")]),
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
    "SpecscopeAllocatorFragmentation": ([
        *allocator("bad", "0", reserved=30, allocated=18, used=0.96),  # 12 GiB idle on a full GPU
        *allocator("bad", "1", reserved=30, allocated=29, used=0.96),  # the same host's other GPU: 1 GiB idle
        *allocator("roomy", "0", reserved=30, allocated=18, used=0.5),  # as idle, but the GPU has room
        *allocator("small", "0", reserved=1, allocated=0.2, used=0.96),  # 80% idle, but under 1 GiB
    ], {"instance": "bad:9464", "server": "vllm", "hw_id": "0", "model": "bad"}),
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
    rendered = {r["alert"]: r for g in rule_groups(vllm_only=vllm_only)["groups"] for r in g["rules"]
                if "alert" in r}
    assert set(cases) == set(rendered)  # every rule has a firing and a quiet case
    tests = []
    for name, (inputs, fired) in cases.items():
        rule = rendered[name]
        expected = []
        for fired_labels in fired if isinstance(fired, list) else [fired]:  # one alert, or several in order
            annotations = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m, lab=fired_labels: lab[m.group(1)], v)
                           for k, v in rule["annotations"].items()}  # as Prometheus expands the templates
            expected.append({"exp_labels": {**fired_labels, **rule["labels"]}, "exp_annotations": annotations})
        checks = [{"eval_time": "10m", "alertname": name, "exp_alerts": expected}]
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


def vllm_engine(instance: str, engine: str, drafts: int, accepted_per_pos: list[int]) -> list[dict[str, str]]:
    """One engine's vLLM counters at K=4, rising by these amounts every 15 s."""
    lab = {"instance": instance, "job": "vllm", "engine": engine, "model_name": "m"}
    return [series("vllm:spec_decode_num_drafts_total", lab, f"0+{drafts}x40"),
            series("vllm:spec_decode_num_draft_tokens_total", lab, f"0+{4 * drafts}x40"),
            series("vllm:spec_decode_num_accepted_tokens_total", lab, f"0+{sum(accepted_per_pos)}x40"),
            *(series("vllm:spec_decode_num_accepted_tokens_per_pos_total", {**lab, "position": str(i)}, f"0+{n}x40")
              for i, n in enumerate(accepted_per_pos))]


@needs_promtool
def test_recording_rules_per_engine_and_per_model(tmp_path: Path) -> None:
    """A DP=2 server (two engines) and a second server: per-engine series keep every label; the model's fleet
    series weigh engines by their drafts, as one pooled engine would."""
    engines = {("a:8000", "0"): (80, [80, 64, 48, 48]), ("a:8000", "1"): (80, [64, 48, 32, 16]),
               ("b:8000", "0"): (160, [96, 32, 16, 16])}
    inputs = [s for (inst, eng), (d, pp) in engines.items() for s in vllm_engine(inst, eng, d, pp)]

    def check(expr: str, expected: dict[str, float]) -> dict[str, Any]:
        """``expr``'s samples (label sets without the name) equal ``expected``, both rounded to 1/1024 (exact in
        binary: promtool compares floats exactly)."""
        return {"expr": f"round({expr}, {1 / 1024})",
                "exp_samples": [{"labels": f"{{{lab}}}", "value": round(v * 1024) / 1024}
                                for lab, v in expected.items()]}

    def per_engine(values: dict[tuple[str, str], float]) -> dict[str, float]:
        return {f'engine="{e}",instance="{i}",job="vllm",model_name="m"': v for (i, e), v in values.items()}

    drafts = sum(d for d, _ in engines.values())
    accepted = sum(sum(pp) for _, pp in engines.values())
    checks = [
        check("engine:vllm_spec_decode_acceptance_rate:rate1m",
              per_engine({k: sum(pp) / (4 * d) for k, (d, pp) in engines.items()})),
        check("engine:vllm_spec_decode_mean_acceptance_length:rate1m",
              per_engine({k: 1 + sum(pp) / d for k, (d, pp) in engines.items()})),
        check('engine:vllm_spec_decode_position_acceptance_rate:rate1m{instance="a:8000",engine="1"}',
              {f'engine="1",instance="a:8000",job="vllm",model_name="m",position="{i}"': n / 80
               for i, n in enumerate([64, 48, 32, 16])}),
        check("model_name:vllm_spec_decode_acceptance_rate:rate1m", {'model_name="m"': accepted / (4 * drafts)}),
        check("model_name:vllm_spec_decode_mean_acceptance_length:rate1m", {'model_name="m"': 1 + accepted / drafts}),
        check("model_name:vllm_spec_decode_position_acceptance_rate:rate1m",
              {f'model_name="m",position="{i}"': sum(pp[i] for _, pp in engines.values()) / drafts
               for i in range(4)}),
    ]
    spec = {"rule_files": [str(DEPLOY / "specscope-vllm-rules.yml")], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": inputs,
                       "promql_expr_test": [{**c, "eval_time": "10m"} for c in checks]}]}
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
