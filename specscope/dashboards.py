"""The Grafana dashboard for specscope's Prometheus metrics, generated from the catalogue.

``specscope dashboard > deploy/grafana/specscope-dashboard.json`` regenerates the checked-in file; a test keeps
the two equal. Every query names metrics through :mod:`specscope.catalogue`, so it cannot name one that does
not exist.
"""

from __future__ import annotations

import json
from typing import Any

from specscope.catalogue import BY_NAME

#: Acceptance rate below which a draft is considered useless (the diagnostics' default).
WEAK_DRAFT_THRESHOLD = 0.3
_SEL = '{model=~"$model", engine=~"$engine"}'
#: Legend of a per-engine series (vLLM's engine label: the data-parallel index).
_E = "{{model}} engine {{engine}}"


def _p(name: str) -> str:
    return BY_NAME[name].prometheus_name


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], unit: str, x: int, y: int, w: int = 8,
           kind: str = "timeseries", thresholds: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit}
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
        defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": 8},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [{"refId": chr(65 + i), "expr": e, "legendFormat": legend} for i, (e, legend) in enumerate(exprs)],
    }


def _rate(prometheus_name: str) -> str:
    return f"rate({prometheus_name}{_SEL}[$__rate_interval])"


def grafana_dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    red_below: list[dict[str, Any]] = [{"color": "red", "value": None},
                                       {"color": "green", "value": WEAK_DRAFT_THRESHOLD}]
    acceptance_buckets = _rate(_p("specscope.request.acceptance_rate") + "_bucket")
    panels = [
        _panel(1, "Acceptance rate (window)", [(_p("specscope.spec_decode.acceptance_rate") + _SEL, _E)],
               "percentunit", 0, 0, thresholds=red_below),
        _panel(2, "Per-token acceptance probability α", [(_p("specscope.spec_decode.alpha") + _SEL, _E)],
               "percentunit", 8, 0),
        _panel(3, "Mean acceptance length (tokens / step)",
               [(_p("specscope.spec_decode.mean_acceptance_length") + _SEL, _E)], "none", 16, 0),
        _panel(4, "Per-position acceptance (window)",
               [(_p("specscope.spec_decode.position_acceptance_rate") + _SEL, _E + " position {{position}}")],
               "percentunit", 0, 8, kind="bargauge"),
        _panel(5, "Drafted vs accepted tokens / s",
               [(_rate(_p("specscope.spec_decode.draft_tokens")), "drafted, engine {{engine}}"),
                (_rate(_p("specscope.spec_decode.accepted_tokens")), "accepted, engine {{engine}}")], "short", 8, 8),
        _panel(6, "Per-request acceptance rate (p10, p50)",
               [(f"histogram_quantile({q}, sum by (le) ({acceptance_buckets}))", f"p{int(q * 100)}")
                for q in (0.1, 0.5)], "percentunit", 16, 8),
        _panel(7, "KV cache: block vs token usage",
               [(_p("specscope.kv_cache.block_usage") + _SEL, "blocks, engine {{engine}}"),
                (_p("specscope.kv_cache.token_usage") + _SEL, "tokens (estimate), engine {{engine}}")],
               "percentunit", 0, 16),
        _panel(8, "KV fragmentation", [(_p("specscope.kv_cache.fragmentation") + _SEL, "engine {{engine}}")],
               "percentunit", 8, 16),
        _panel(9, "Preemptions / s and prefix-cache hit rate",
               [(_rate(_p("specscope.engine.preemptions")), "preemptions/s, engine {{engine}}"),
                (_p("specscope.prefix_cache.hit_rate") + _SEL, "prefix hit rate, engine {{engine}}")], "short", 16, 16),
        _panel(10, "GPU memory used", [(_p("hw.gpu.memory.usage"), "gpu {{hw_id}}"),
                                       (_p("hw.gpu.memory.limit"), "gpu {{hw_id}} total")], "bytes", 0, 24),
        _panel(11, "GPU memory by process role",
               [(_p("specscope.gpu.process.memory.usage") + _SEL, "gpu {{hw_id}} {{process_role}}")], "bytes",
               8, 24),
        _panel(12, "Request latency p95: end to end, first token",
               [(f"histogram_quantile(0.95, sum by (le) (rate({_p(n)}_bucket[$__rate_interval])))", label)
                for n, label in (("gen_ai.server.request.duration", "e2e"),
                                 ("gen_ai.server.time_to_first_token", "ttft"))], "s", 16, 24),
        _panel(13, "Requests running / waiting", [(_p("specscope.engine.requests") + _SEL, _E + " {{state}}")],
               "short", 0, 32),
        _panel(14, "specscope health: errors / s",
               [(f"rate({_p('specscope.errors')}[$__rate_interval])", "{{source}}")], "short", 8, 32),
        _panel(15, "Expected speedup and recommended K",
               [(_p("specscope.spec_decode.expected_speedup") + _SEL, "expected speedup, engine {{engine}}"),
                (_p("specscope.spec_decode.recommended_k") + _SEL, "recommended K, engine {{engine}}")], "none", 16, 32,
               thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1.0}]),
    ]
    return {
        "title": "specscope: speculative decoding",
        "uid": "specscope-overview",
        "schemaVersion": 39,
        "tags": ["vllm", "speculative-decoding", "specscope"],
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {"name": "model", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
                 "query": f"label_values({_p('specscope.spec_decode.draft_tokens')}, model)", "includeAll": True,
                 "allValue": ".*", "refresh": 2},
                {"name": "engine", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
                 "query": f"label_values({_p('specscope.spec_decode.draft_tokens')}, engine)", "includeAll": True,
                 "allValue": ".*", "refresh": 2, "label": "engine (data-parallel index)"},
            ]
        },
        "panels": panels,
    }


def render() -> str:
    """The dashboard as the checked-in file's text."""
    return json.dumps(grafana_dashboard(), indent=2) + "\n"
