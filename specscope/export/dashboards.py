"""The Grafana dashboard for specscope's and vLLM's Prometheus series, built with Grafana's own Foundation SDK.

``specscope dashboard > deploy/grafana/specscope-dashboard.json`` regenerates the checked-in file; a test keeps
the two equal and reads the file back through the SDK's dashboard model. Every query names series through
:mod:`specscope.export.catalogue` and :mod:`specscope.export.alerts.recording`, so it cannot name one that does not
exist.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, prometheus, table, timeseries
from grafana_foundation_sdk.builders.common import (
    GraphThresholdsStyleConfig,
    ReduceDataOptions,
    TableSortByFieldState,
    VizLegendOptions,
)
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BarGaugeDisplayMode,
    GraphTresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from specscope.export.alerts.recording import VLLM
from specscope.export.alerts.rules import Thresholds
from specscope.export.catalogue import exported_name as _p

_DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
_SEL = '{model=~"$model", engine=~"$engine"}'
#: Legend of a per-engine series (vLLM's engine label: the data-parallel index).
_E = "{{model}} engine {{engine}}"
#: vLLM's own series, read through the recording rules (deploy/prometheus/specscope-vllm-rules.yml).
_VSEL = '{model_name=~"$vllm_model"}'
_VE = "{{instance}} engine {{engine}}"
#: Traffic-class series carry the server's labels, not an engine's (a request's class is the server's to know).
_CSEL = '{model=~"$model"}'


def _rate(prometheus_name: str) -> str:
    return f"rate({prometheus_name}{_SEL}[$__rate_interval])"


def _red_below(value: float) -> ThresholdsConfig:
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=None, color="red"), Threshold(value=value, color="green")])


def _targets(panel: timeseries.Panel | bargauge.Panel | table.Panel, exprs: list[tuple[str, str]]) -> None:
    for i, (expr, legend) in enumerate(exprs):
        panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(65 + i)))


def _series(title: str, exprs: list[tuple[str, str]], unit: str, *, threshold: float | None = None,
            description: str = "", width: int = 8) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).datasource(_DS).unit(unit).span(width).height(8).line_width(1)
             .legend(VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
                     .placement(LegendPlacement.BOTTOM)))
    if description:
        panel.description(description)
    if threshold is not None:
        panel.thresholds(_red_below(threshold)).thresholds_style(
            GraphThresholdsStyleConfig().mode(GraphTresholdsStyleMode.LINE))
    _targets(panel, exprs)
    return panel


def _bars(title: str, exprs: list[tuple[str, str]], unit: str, *, description: str = "",
          width: int = 8) -> bargauge.Panel:
    panel = (bargauge.Panel().title(title).datasource(_DS).unit(unit).span(width).height(8).min(0).max(1)
             .display_mode(BarGaugeDisplayMode.GRADIENT)
             .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if description:
        panel.description(description)
    _targets(panel, exprs)
    return panel


def _class_table(title: str, exprs: list[tuple[str, str, str]], description: str) -> table.Panel:
    """One row per traffic class: instant queries (expression, column, unit) in table format, joined on the
    class, lowest acceptance first."""
    panel = (table.Panel().title(title).datasource(_DS).span(12).height(8).description(description)
             .with_transformation(DataTransformerConfig(id_val="merge", options={}))
             .with_transformation(DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"Time": True},
                 "renameByName": {f"Value #{chr(65 + i)}": column for i, (_, column, _) in enumerate(exprs)}}))
             .sort_by([TableSortByFieldState().display_name(exprs[-1][1]).desc(False)]))
    for i, (expr, column, unit) in enumerate(exprs):
        panel.with_target(prometheus.Dataquery().expr(expr).instant().format(PromQueryFormat.TABLE)
                          .ref_id(chr(65 + i)))
        panel.override_by_name(column, [DynamicConfigValue(id_val="unit", value=unit)])
    return panel


def _vllm(what: str, level: str = "engine") -> str:
    return VLLM.series(what, Thresholds().window_s, level) + _VSEL


def build() -> Dashboard:
    """The dashboard as an SDK builder."""
    weak = Thresholds().weak_draft_acceptance
    acceptance_buckets = _rate(_p("specscope.request.acceptance_rate") + "_bucket")
    fleet = VLLM.model_level
    d = (Dashboard("specscope: speculative decoding").uid("specscope-overview")
         .tags(["vllm", "speculative-decoding", "specscope"]).time("now-1h", "now").refresh("10s")
         .with_variable(DatasourceVariable("datasource").type("prometheus"))
         .with_variable(QueryVariable("model").label("model (specscope)").datasource(_DS)
                        .query(f"label_values({_p('specscope.spec_decode.draft_tokens')}, model)")
                        .include_all(True).all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))
         .with_variable(QueryVariable("engine").label("engine (data-parallel index)").datasource(_DS)
                        .query(f"label_values({_p('specscope.spec_decode.draft_tokens')}, engine)")
                        .include_all(True).all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))
         .with_variable(QueryVariable("vllm_model").label("model (vLLM)").datasource(_DS)
                        .query("label_values(vllm:spec_decode_num_drafts_total, model_name)")
                        .include_all(True).all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)))

    d.with_row(Row("Speculative decoding (specscope)"))
    d.with_panel(_series("Acceptance rate (window)", [(_p("specscope.spec_decode.acceptance_rate") + _SEL, _E)],
                         "percentunit", threshold=weak))
    d.with_panel(_series("Per-token acceptance probability α", [(_p("specscope.spec_decode.alpha") + _SEL, _E)],
                         "percentunit"))
    d.with_panel(_series("Mean acceptance length (tokens / step)",
                         [(_p("specscope.spec_decode.mean_acceptance_length") + _SEL, _E)], "none"))
    d.with_panel(_bars("Per-position acceptance (window)",
                       [(_p("specscope.spec_decode.position_acceptance_rate") + _SEL, _E + " position {{position}}")],
                       "percentunit"))
    d.with_panel(_series("Drafted vs accepted tokens / s",
                         [(_rate(_p("specscope.spec_decode.draft_tokens")), "drafted, engine {{engine}}"),
                          (_rate(_p("specscope.spec_decode.accepted_tokens")), "accepted, engine {{engine}}")],
                         "short"))
    d.with_panel(_series("Per-request acceptance rate (p10, p50)",
                         [(f"histogram_quantile({q}, sum by (le) ({acceptance_buckets}))", f"p{int(q * 100)}")
                          for q in (0.1, 0.5)], "percentunit"))
    d.with_panel(_series("Speedup (this traffic, operating batch) and recommended K",
                         [(_p("specscope.spec_decode.traffic_speedup") + _SEL, "this traffic, engine {{engine}}"),
                          (_p("specscope.spec_decode.traffic_speedup_low") + _SEL, "its low end, engine {{engine}}"),
                          (_p("specscope.spec_decode.expected_speedup") + _SEL,
                           "at the operating batch, engine {{engine}}"),
                          (_p("specscope.spec_decode.recommended_k") + _SEL, "recommended K, engine {{engine}}")],
                         "none", threshold=1.0, width=24))

    per_engine = ("From vLLM's own counters through specscope's recording rules "
                  "(deploy/prometheus/specscope-vllm-rules.yml): each engine of each server, and the fleet "
                  "serving the model (engines weighed by their drafts).")
    d.with_row(Row("Per engine and fleet (vLLM's counters, recording rules)"))
    d.with_panel(_series("Acceptance rate per engine and fleet",
                         [(_vllm("acceptance_rate"), _VE), (_vllm("acceptance_rate", fleet), "fleet {{model_name}}")],
                         "percentunit", threshold=weak, description=per_engine))
    d.with_panel(_series("Mean acceptance length per engine and fleet",
                         [(_vllm("mean_acceptance_length"), _VE),
                          (_vllm("mean_acceptance_length", fleet), "fleet {{model_name}}")],
                         "none", description=per_engine))
    d.with_panel(_bars("Per-position acceptance per engine",
                       [(_vllm("position_acceptance_rate"), _VE + " position {{position}}")], "percentunit",
                       description=per_engine))

    classes = ("Finished requests by traffic class (baggage traffic_class, the operator's class header, the LoRA "
               "adapter, else the prompt-length bucket): a class the draft predicts badly is hidden in the "
               "engine's acceptance when other traffic outweighs it.")

    def by_class(name: str) -> str:
        return f"sum by (traffic_class) (rate({_p(name)}{_CSEL}[$__range]))"

    requests = by_class("specscope.class.requests")
    d.with_row(Row("Acceptance by traffic class"))
    d.with_panel(_series("Acceptance by traffic class (window)",
                         [(_p("specscope.class.acceptance_rate") + _CSEL, "{{traffic_class}} ({{server}})")],
                         "percentunit", threshold=weak, description=classes, width=12))
    d.with_panel(_class_table(
        "Traffic classes over the time range",
        [(requests, "requests / s", "reqps"),
         (f"{requests} / scalar(sum(rate({_p('specscope.class.requests')}{_CSEL}[$__range])))", "share", "percentunit"),
         (f"{by_class('specscope.class.accepted_tokens')} / {by_class('specscope.class.draft_tokens')}",
          "acceptance", "percentunit")],
        classes))

    d.with_row(Row("KV cache and memory"))
    d.with_panel(_series("KV cache: block vs token usage",
                         [(_p("specscope.kv_cache.block_usage") + _SEL, "blocks, engine {{engine}}"),
                          (_p("specscope.kv_cache.token_usage") + _SEL, "tokens (estimate), engine {{engine}}")],
                         "percentunit"))
    d.with_panel(_series("KV fragmentation", [(_p("specscope.kv_cache.fragmentation") + _SEL, "engine {{engine}}")],
                         "percentunit"))
    d.with_panel(_series("The draft's share of the KV capacity",
                         [(_p("specscope.kv_cache.draft_share") + _SEL, "engine {{engine}}")], "percentunit"))
    d.with_panel(_series("Preemptions / s and prefix-cache hit rate",
                         [(_rate(_p("specscope.engine.preemptions")), "preemptions/s, engine {{engine}}"),
                          (_p("specscope.prefix_cache.hit_rate") + _SEL, "prefix hit rate, engine {{engine}}")],
                         "short"))
    d.with_panel(_series("GPU memory used", [(_p("hw.gpu.memory.usage"), "gpu {{hw_id}}"),
                                             (_p("hw.gpu.memory.limit"), "gpu {{hw_id}} total")], "bytes"))
    d.with_panel(_series("GPU memory by process role",
                         [(_p("specscope.gpu.process.memory.usage"), "gpu {{hw_id}} {{process_role}}")], "bytes"))

    d.with_row(Row("Requests and specscope itself"))
    d.with_panel(_series("Request latency p95: end to end, first token",
                         [(f"histogram_quantile(0.95, sum by (le) (rate({_p(n)}_bucket[$__rate_interval])))", label)
                          for n, label in (("gen_ai.server.request.duration", "e2e"),
                                           ("gen_ai.server.time_to_first_token", "ttft"))], "s"))
    d.with_panel(_series("Requests running / waiting",
                         [(_p("specscope.engine.requests") + _SEL, _E + " {{state}}")], "short"))
    d.with_panel(_series("specscope health: errors / s",
                         [(f"rate({_p('specscope.errors')}[$__rate_interval])", "{{source}}")], "short"))
    return d


def render() -> str:
    """The dashboard as the checked-in file's text (panels numbered in order: links and alerts name them)."""
    board = build().build()
    for i, panel in enumerate(board.panels or [], 1):
        panel.id_val = i
    return JSONEncoder(sort_keys=True, indent=2).encode(board) + "\n"
