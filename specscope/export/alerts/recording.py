"""Recording rules: acceptance, mean acceptance length and per-position acceptance, per engine and per model.

Two sources carry the same counters: vLLM's own ``vllm:spec_decode_*`` (labels ``model_name``, ``engine``) and
specscope's exported ``specscope_spec_decode_*`` (labels ``server``, ``model``, ``draft_model``, ``method``,
``engine``). For each, rates over the window are recorded per engine (every label of the scraped series kept:
``job``, ``instance``, the engine index and any target labels) and per model across the fleet (summed over
servers and engines before dividing, so busy engines weigh more). The alerting rules read these series.

Per traffic class (specscope's export only) the same rates are recorded by class, with the class's share of its
server's requests (:func:`class_rules`).

Names follow Prometheus' ``level:metric:operations`` convention, e.g.
``engine:vllm_spec_decode_acceptance_rate:rate1m`` and ``model_name:vllm_spec_decode_acceptance_rate:rate1m``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specscope.export.catalogue import exported_name as _p

#: Per-engine series: every label of the scraped series kept.
ENGINE = "engine"


def duration(seconds: float) -> str:
    """Prometheus' duration for ``seconds`` (``60`` -> ``1m``, ``90`` -> ``90s``)."""
    s = int(seconds)
    return f"{s // 60}m" if s and s % 60 == 0 else f"{s}s"


@dataclass(frozen=True)
class Source:
    """One family of speculative-decoding counters and the labels that name a model in it."""

    prefix: str
    accepted: str
    draft_tokens: str
    drafts: str
    accepted_per_position: str
    #: Labels that make "the same model" across a fleet (and the level name of the per-model series).
    model_labels: tuple[str, ...]

    @property
    def model_level(self) -> str:
        """The level part of a per-model series' name."""
        return self.model_labels[0]

    def series(self, what: str, window_s: float, level: str = ENGINE) -> str:
        """The recorded series' name: ``level:<prefix>_spec_decode_<what>:rate<window>``."""
        return f"{level}:{self.prefix}_spec_decode_{what}:rate{duration(window_s)}"

    def rules(self, window_s: float) -> list[dict[str, Any]]:
        """The recording rules of this source, per engine then per model (each reads the ones above it)."""
        w = duration(window_s)
        out: list[dict[str, Any]] = []
        for level in (ENGINE, self.model_level):
            def s(what: str, level: str = level) -> str:
                return self.series(what, window_s, level)

            for what, metric in (("draft_tokens", self.draft_tokens), ("accepted_tokens", self.accepted),
                                 ("drafts", self.drafts), ("accepted_tokens_per_position", self.accepted_per_position)):
                if level == ENGINE:
                    expr = f"rate({metric}[{w}])"
                else:
                    by = ", ".join(self.model_labels + (("position",) if what.endswith("position") else ()))
                    expr = f"sum by ({by}) ({self.series(what, window_s)})"
                out.append({"record": s(what), "expr": expr})
            out += [
                {"record": s("acceptance_rate"), "expr": f"{s('accepted_tokens')} / {s('draft_tokens')}"},
                {"record": s("mean_acceptance_length"), "expr": f"1 + {s('accepted_tokens')} / {s('drafts')}"},
                {"record": s("position_acceptance_rate"),
                 "expr": f"{s('accepted_tokens_per_position')} / ignoring(position) group_left() {s('drafts')}"},
            ]
        return out


#: Per-traffic-class series (specscope's export only: vLLM's counters are engine-wide).
CLASS = "traffic_class"


def class_series(what: str, window_s: float) -> str:
    """A recorded per-class series: ``traffic_class:specscope_class_<what>:rate<window>``."""
    return f"{CLASS}:specscope_class_{what}:rate{duration(window_s)}"


def class_rules(window_s: float) -> list[dict[str, Any]]:
    """Per traffic class: requests, drafts and accepted tokens per second, acceptance, and the class's share of
    its server's requests (every label of the scraped series kept)."""
    w = duration(window_s)

    def s(what: str) -> str:
        return class_series(what, window_s)

    return [
        *({"record": s(what), "expr": f"rate({_p(f'specscope.class.{what}')}[{w}])"}
          for what in ("requests", "draft_tokens", "accepted_tokens")),
        {"record": s("acceptance_rate"), "expr": f"{s('accepted_tokens')} / {s('draft_tokens')}"},
        {"record": s("request_share"),
         "expr": f"{s('requests')} / ignoring({CLASS}) group_left() sum without({CLASS}) ({s('requests')})"},
    ]

VLLM = Source("vllm", "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
              "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
              ("model_name",))
SPECSCOPE = Source("specscope", _p("specscope.spec_decode.accepted_tokens"),
                   _p("specscope.spec_decode.draft_tokens"), _p("specscope.spec_decode.drafts"),
                   _p("specscope.spec_decode.accepted_tokens_per_position"), ("model", "draft_model", "method"))
