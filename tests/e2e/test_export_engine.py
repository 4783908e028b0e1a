"""Export from a real engine: OTLP spans and metrics, the Prometheus endpoint, a collector that is down or slow."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from specscope import Hub, start_exports, tiny_models
from specscope.export.otel_export import resolve_config
from tests.conftest import ENGINE_KW, greedy, spec_config, vllm_counters
from tests.export.test_endpoint import expected, scrape
from tests.otlp_receiver import HttpReceiver

pytestmark = pytest.mark.engine

PROMPTS = tiny_models.prompts(8, seed=17)


@pytest.fixture(scope="module")
def engine(tiny: Any, engines: Any) -> tuple[Any, Hub, list[list[int]], float]:
    import specscope

    def make() -> tuple[Any, Hub, list[list[int]], float]:
        hub = Hub()
        llm = specscope.LLM(str(tiny["target"]), speculative_config=spec_config(tiny, "noise10"),
                            disable_log_stats=False, specscope_hub=hub, **ENGINE_KW)
        llm.generate(PROMPTS, greedy(32), use_tqdm=False)  # warm up
        t0 = time.perf_counter()
        reference = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy(32), use_tqdm=False)]
        return llm, hub, reference, time.perf_counter() - t0

    return engines.get("export-noise10", make)


def test_spans_and_metrics_equal_the_engine_numbers(engine: Any) -> None:
    llm, hub, _, _ = engine
    receiver = HttpReceiver()
    exports = start_exports(hub, prometheus_port=0,
                            otlp=resolve_config(endpoint=receiver.endpoint, export_interval_ms=60_000, env={}))
    try:
        before = {r.request_id for r in hub.snapshot().requests}
        outs = llm.generate(PROMPTS, greedy(32), use_tqdm=False)
        hub.wait_idle()
        assert exports.otel is not None and exports.endpoint is not None
        exports.otel.force_flush()
        snap = hub.snapshot()
        spans = {a["gen_ai.response.id"]: a for _, a in receiver.received.spans()}
        assert set(spans) == {o.request_id for o in outs} and not set(spans) & before
        for o in outs:
            m = o.outputs[0].spec_decode_metrics.to_dict()
            a = spans[o.request_id]
            assert a["specscope.spec_decode.draft_tokens"] == m["num_draft_tokens"]
            assert a["specscope.spec_decode.accepted_tokens"] == m["num_accepted_draft_tokens"]
            assert a["specscope.spec_decode.steps"] == m["num_spec_steps"]
            assert a["specscope.spec_decode.acceptance_rate"] == pytest.approx(m["draft_acceptance_rate"])
            assert a["specscope.spec_decode.acceptance_length"] == pytest.approx(m["mean_acceptance_length"])
            assert a["gen_ai.usage.output_tokens"] == 32
        counters = vllm_counters(llm)
        got = receiver.received.metrics()
        (dp,) = got["specscope.spec_decode.accepted_tokens"][0].sum.data_points
        assert dp.as_double == counters["spec_decode_num_accepted_tokens"] == snap.lifetime.spec.accepted
        scraped = scrape(exports.endpoint.url)
        labels = next(iter(expected(hub)["specscope_spec_decode_draft_tokens_total"]))
        assert scraped["specscope_spec_decode_draft_tokens_total"][labels] == counters[
            "spec_decode_num_draft_tokens"]
        assert scraped["specscope_spec_decode_drafts_total"][labels] == counters["spec_decode_num_drafts"]
    finally:
        exports.close()
        receiver.close()


def test_collector_down_or_slow_leaves_generation_untouched(engine: Any) -> None:
    """A collector that hangs past the timeout and fails: outputs and timing unaffected, failures counted,
    export recovers when it is back."""
    llm, hub, reference, reference_s = engine
    receiver = HttpReceiver()
    receiver.fail = True
    receiver.delay_s = 2.0
    exports = start_exports(hub, prometheus_port=0,
                            otlp=resolve_config(endpoint=receiver.endpoint, export_interval_ms=200, timeout_s=1,
                                                env={}))
    stop = threading.Event()

    def scraper() -> None:  # Prometheus scraping all the while, 20 times a second (it scrapes every 15 s)
        while not stop.wait(0.05):
            httpx.get(f"{exports.endpoint.url}/metrics", timeout=5)  # type: ignore[union-attr]

    t = threading.Thread(target=scraper, daemon=True)
    t.start()
    try:
        t0 = time.perf_counter()
        outs = llm.generate(PROMPTS, greedy(32), use_tqdm=False)
        elapsed = time.perf_counter() - t0
        assert [list(o.outputs[0].token_ids) for o in outs] == reference
        time.sleep(3)
        errors = dict(hub.snapshot().health.errors)
        assert errors.get("otlp metrics export", 0) >= 1
        receiver.fail, receiver.delay_s = False, 0.0  # the collector comes back
        deadline = time.monotonic() + 10
        while "specscope.spec_decode.accepted_tokens" not in receiver.received.metrics():
            assert time.monotonic() < deadline, "export did not recover"
            time.sleep(0.2)
        assert elapsed < 2 * reference_s + 2  # no blocking on the collector in the engine's path
    finally:
        stop.set()
        t.join(10)
        exports.close()
        receiver.close()
