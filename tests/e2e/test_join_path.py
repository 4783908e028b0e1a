"""The join path, where vLLM's output processor is not hooked (``SPECSCOPE_HOOK=off``, or a vLLM without the
method): each request's record is joined from the stat logger's part and the engine's outputs (offline) or the
server's response (the middleware). Each request is counted once and its numbers add up to vLLM's counters, even
when its second part comes after the first was released alone; one span per request."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from specscope import Hub, tiny_models
from specscope.engine import vllm_hook
from specscope.state import request_log
from tests.conftest import ENGINE_KW, free_port, greedy, hf_cache, shutdown, spec_config, vllm_counters
from tests.e2e.test_server import AUTH, DRAFT, KEY, TARGET, server_command, settle, start_server, stop, vllm_metrics
from tests.otlp_receiver import HttpReceiver

pytestmark = pytest.mark.engine

PROMPTS = tiny_models.prompts(12, seed=41)


@pytest.fixture
def unhooked(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if the hook had never been installed and ``SPECSCOPE_HOOK=off`` (restored afterwards)."""
    for owner, name, original in vllm_hook._replaced:
        monkeypatch.setattr(owner, name, original)
    for name, fresh in (("_installed", None), ("_holders", 0), ("_replaced", [])):
        monkeypatch.setattr(vllm_hook, name, fresh)
    monkeypatch.setenv("SPECSCOPE_HOOK", "off")


def test_offline_join_counts_each_request_once_even_when_its_second_part_is_late(
        tiny: Any, engines: Any, unhooked: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import specscope
    from specscope.export.otel_export import OtelExporter

    engines.close()  # two cores: one engine at a time
    hub = Hub()
    memory = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(memory))
    # In-memory providers, as the application's own: nothing waits on a collector that is not there.
    exporter = OtelExporter(hub, meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
                            tracer_provider=tracers)
    llm = specscope.LLM(str(tiny["target"]), specscope_hub=hub, disable_log_stats=False,
                        speculative_config=spec_config(tiny, "noise10"), **ENGINE_KW)
    try:
        assert not vllm_hook.installed()
        outs = llm.generate(PROMPTS[:6], greedy(24), use_tqdm=False)
        # Every first part is released alone at once, so the other part always comes after it was made final.
        monkeypatch.setattr(request_log, "PENDING_TIMEOUT_S", 0.0)
        outs += llm.generate(PROMPTS[6:], greedy(24), use_tqdm=False)
        hub.wait_idle()
        snap, c = hub.snapshot(), vllm_counters(llm)
    finally:
        exporter.shutdown()
        shutdown(llm)
    ids = {o.request_id for o in outs}
    recs = {r.request_id: r for r in snap.requests}
    assert set(recs) == ids and len(ids) == len(PROMPTS)
    for r in recs.values():  # both parts in each: the engine's token counts and the outputs' speculative numbers
        assert r.generation_tokens == 24 and r.draft_tokens and r.ttft_s, r
    att = snap.attributed
    assert att is not None and att.requests == len(PROMPTS)
    assert att.draft_tokens == c["spec_decode_num_draft_tokens"] == snap.lifetime.spec.draft_tokens  # type: ignore[union-attr]
    assert att.accepted == c["spec_decode_num_accepted_tokens"]
    assert att.spec_steps == c["spec_decode_num_drafts"]
    assert snap.request_duration is not None and snap.request_duration.count == len(PROMPTS)
    assert snap.request_acceptance_rate is not None and snap.request_acceptance_rate.count == len(PROMPTS)
    spans = [s.attributes["gen_ai.response.id"] for s in memory.get_finished_spans()]
    assert sorted(spans) == sorted(ids)  # one span per request


@pytest.fixture(scope="module")
def receiver() -> Iterator[HttpReceiver]:
    r = HttpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def joined_server(tiny: Any, engines: Any, tmp_path_factory: Any, receiver: HttpReceiver) -> Iterator[str]:
    """A server whose records come from the plugin and the middleware's join of each response."""
    engines.close()
    port = free_port()
    root = tmp_path_factory.mktemp("joined")
    env = {**os.environ, **hf_cache(root / "hf", {TARGET: tiny["target"], DRAFT: tiny["noise10"]}),
           "VLLM_PLUGINS": "specscope", "SPECSCOPE_HOOK": "off", "SPECSCOPE_OTLP": "1",
           "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    spec = {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 4}
    proc = start_server(server_command(TARGET, spec, port, "--api-key", KEY), env, root / "server.log")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def test_the_middleware_join_counts_each_request_once(joined_server: str, receiver: HttpReceiver) -> None:
    url = joined_server
    body = {"model": TARGET, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    ids = []
    for prompt in PROMPTS[:3]:
        r = httpx.post(f"{url}/v1/completions", headers=AUTH, json={**body, "prompt": prompt}, timeout=120).json()
        ids.append(f"{r['id']}-0")
    chat = httpx.post(f"{url}/v1/chat/completions", headers=AUTH, timeout=120,
                      json={**body, "messages": [{"role": "user", "content": PROMPTS[3]}]}).json()
    ids.append(chat["id"])
    snap = settle(url)
    c = vllm_metrics(url)
    recs = {r["request_id"]: r for r in snap["requests"]}
    assert set(recs) == set(ids)
    for rid in ids:  # joined: the engine's timing and the response's speculative numbers
        assert recs[rid]["generation_tokens"] == 24 and recs[rid]["draft_tokens"] > 0, recs[rid]
    att = snap["attributed"]
    assert att["requests"] == len(ids)
    assert att["draft_tokens"] == c["vllm:spec_decode_num_draft_tokens_total"]
    assert att["accepted"] == c["vllm:spec_decode_num_accepted_tokens_total"]
    assert snap["unattributed_draft_tokens"] == 0
    deadline = time.monotonic() + 30
    spans: list[str] = []
    while time.monotonic() < deadline:
        spans = [str(a["gen_ai.response.id"]) for _, a in receiver.received.spans() if "gen_ai.response.id" in a]
        if len(spans) >= len(ids):
            break
        time.sleep(0.5)
    time.sleep(1.0)  # a second span for any of them would have come by now
    spans = [str(a["gen_ai.response.id"]) for _, a in receiver.received.spans() if "gen_ai.response.id" in a]
    assert sorted(spans) == sorted(ids)  # one span per request
