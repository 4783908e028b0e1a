"""deploy/: generated or checked against the catalogue; Prometheus' own tools accept the files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from specscope.export import catalogue
from specscope.export.dashboards import render
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
PROM_NAMES = {m.prometheus_name for m in catalogue.METRICS}
HIST_NAMES = {m.prometheus_name for m in catalogue.METRICS if m.kind == "histogram"}


def series_names(expr: str) -> set[str]:
    """Identifiers in a PromQL expression that look like our metric names."""
    return set(re.findall(r"\b((?:specscope|gen_ai|hw)_[a-z0-9_]+)", expr))


def test_grafana_dashboard_is_generated_and_names_only_existing_metrics() -> None:
    path = DEPLOY / "grafana" / "specscope-dashboard.json"
    assert path.read_text() == render(), "run: specscope dashboard > deploy/grafana/specscope-dashboard.json"
    board = json.loads(path.read_text())
    names: set[str] = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):  # rows have none
            names |= series_names(target["expr"])
    names |= series_names(board["templating"]["list"][1]["query"])
    assert names
    for name in names:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert name in PROM_NAMES or base in HIST_NAMES, name
    # The acceptance panel shows the weak-draft threshold.
    acceptance = next(p for p in board["panels"] if p["title"].startswith("Acceptance rate"))
    assert acceptance["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.3


def test_grafana_dashboard_reads_back_through_grafanas_sdk_model() -> None:
    """Grafana's Foundation SDK decodes the file into its typed dashboard model and encodes it back unchanged:
    every field has the type and place Grafana's schema gives it."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import bargauge, prometheus, table, timeseries
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    raw = json.loads((DEPLOY / "grafana" / "specscope-dashboard.json").read_text())
    model = Dashboard.from_json(raw)
    assert json.loads(JSONEncoder(sort_keys=True).encode(model)) == raw
    panels = [p for p in model.panels or [] if getattr(p, "type_val", None) != "row"]
    assert all(isinstance(p.options, timeseries.Options | bargauge.Options | table.Options) for p in panels)
    assert all(isinstance(t, prometheus.Dataquery) for p in panels for t in p.targets or [])
    assert [p.id_val for p in model.panels or []] == list(range(1, len(model.panels or []) + 1))


def test_grafana_dashboard_has_per_engine_panels_from_the_recording_rules() -> None:
    board = json.loads((DEPLOY / "grafana" / "specscope-dashboard.json").read_text())
    recorded = {r["record"] for g in yaml.safe_load((DEPLOY / "prometheus" / "specscope-vllm-rules.yml").read_text())
                ["groups"] for r in g["rules"] if "record" in r}
    used = {name for p in board["panels"] for t in p.get("targets", [])
            for name in re.findall(r"[a-z_]+:vllm_[a-z_]+:rate\w+", t["expr"])}
    assert used and used <= recorded
    per_engine = [p for p in board["panels"] for t in p.get("targets", [])
                  if t["expr"].startswith("engine:") and "engine {{engine}}" in t["legendFormat"]]
    assert {p["title"] for p in per_engine} >= {"Acceptance rate per engine and fleet",
                                                 "Mean acceptance length per engine and fleet",
                                                 "Per-position acceptance per engine"}


def test_grafana_dashboard_has_acceptance_by_traffic_class() -> None:
    board = json.loads((DEPLOY / "grafana" / "specscope-dashboard.json").read_text())
    panels = {p["title"]: p for p in board["panels"]}
    assert panels["Acceptance by traffic class"]["type"] == "row"
    series = panels["Acceptance by traffic class (window)"]
    assert series["targets"][0]["expr"].startswith(catalogue.exported_name("specscope.class.acceptance_rate"))
    assert "{{traffic_class}}" in series["targets"][0]["legendFormat"]
    assert series["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.3  # the weak-draft line
    table = panels["Traffic classes over the time range"]
    exprs = [t["expr"] for t in table["targets"]]
    assert all(e.startswith("sum by (traffic_class)") and t["instant"] and t["format"] == "table"
               for e, t in zip(exprs, table["targets"], strict=True))
    assert "specscope_class_requests_total" in exprs[0]
    assert {"merge", "organize"} == {t["id"] for t in table["transformations"]}  # one row per class
    assert table["options"]["sortBy"] == [{"desc": False, "displayName": "acceptance"}]  # worst first


def test_otel_collector_config_is_consistent_with_the_catalogue() -> None:
    config = yaml.safe_load((DEPLOY / "otel-collector" / "config.yaml").read_text())
    for pipeline in config["service"]["pipelines"].values():
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline[section]:
                assert component in config[section], component
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].startswith("127.0.0.1:")
    patterns = config["processors"]["filter/specscope"]["metrics"]["include"]["metric_names"]
    for m in catalogue.METRICS:  # the filter keeps every catalogue metric
        assert any(re.fullmatch(p, m.name) for p in patterns), m.name


@pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus not installed")
def test_prometheus_scrape_config_is_valid() -> None:
    r = subprocess.run(["promtool", "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["specscope"]["static_configs"][0]["targets"] == ["127.0.0.1:9464"]
    relabel = jobs["vllm"]["metric_relabel_configs"][0]
    assert re.sub(relabel["regex"], relabel["replacement"].replace("$1", r"\1"),
                  "vllm_spec_decode_num_drafts_total") == "vllm:spec_decode_num_drafts_total"


def test_metrics_reference_is_generated_from_the_catalogue() -> None:
    text = (DEPLOY.parent / "docs" / "metrics.md").read_text()
    assert text.endswith(catalogue.markdown_table()), "run: specscope metrics (see docs/metrics.md's header)"
    assert len(set(PROM_NAMES)) == len(catalogue.METRICS)  # no two metrics share a Prometheus name
