"""The reader on vLLM's own stats classes, built the way vLLM's scheduler and output processor fill them."""

from __future__ import annotations

import pytest

from specscope.collectors import vllm_reader
from specscope.collectors.vllm_logger import SpecscopeStatLogger
from specscope.hub import Hub

stats = pytest.importorskip("vllm.v1.metrics.stats")
spec_metrics = pytest.importorskip("vllm.v1.spec_decode.metrics")


def make_stats() -> tuple[object, object]:
    sds = spec_metrics.SpecDecodingStats.new(4)
    sds.observe_draft(num_draft_tokens=4, num_accepted_tokens=4)
    sds.observe_draft(num_draft_tokens=4, num_accepted_tokens=1)
    sds.observe_draft(num_draft_tokens=2, num_accepted_tokens=0)
    sched = stats.SchedulerStats(num_running_reqs=3, num_waiting_reqs=1, num_skipped_waiting_reqs=1,
                                 kv_cache_usage=0.25, spec_decoding_stats=sds)
    sched.prefix_cache_stats.record(num_tokens=100, num_hits=64, preempted=False)
    it = stats.IterationStats()
    it.num_generation_tokens = 8
    it.prompt_token_stats.total = 100
    it.num_preempted_reqs = 1
    it.finished_requests.append(
        stats.FinishedRequestStats(
            finish_reason="length", request_id="req-1", e2e_latency=2.0, num_prompt_tokens=30,
            num_generation_tokens=12, queued_time=0.1, prefill_time=0.2, decode_time=1.5,
            mean_time_per_output_token=0.125, num_cached_tokens=16, num_preemptions=1,
        )
    )
    return sched, it


def test_read_step_counts_like_vllms_prometheus_logger() -> None:
    sched, it = make_stats()
    s = vllm_reader.read_step(sched, it)
    assert (s.running, s.waiting, s.kv_usage) == (3, 2, 0.25)
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (100, 64)
    assert (s.num_spec_tokens, s.drafts, s.draft_tokens, s.accepted) == (4, 3, 10, 5)
    assert list(s.accepted_per_pos) == [2, 1, 1, 1]
    assert list(s.draft_tokens_per_pos) == [3, 3, 2, 2]
    assert (s.prompt_tokens, s.generation_tokens, s.preemptions) == (100, 8, 1)
    assert (s.finished, s.finished_tokens) == (1, 42)


def test_finished_requests_and_spec_fields() -> None:
    _, it = make_stats()
    ((rid, f),) = vllm_reader.finished_requests(it)
    assert rid == "req-1"
    assert f["finish_reason"] == "length" and f["cached_tokens"] == 16
    assert f["ttft_s"] == pytest.approx(0.3) and f["tpot_s"] == 0.125
    m = stats.RequestSpecDecodeMetrics.new(4)
    m.observe(num_draft_tokens=4, num_accepted=3)
    m.observe(num_draft_tokens=4, num_accepted=0)
    assert vllm_reader.spec_fields(m) == vllm_reader.spec_fields(m.to_dict()) == {
        "num_spec_tokens": 4, "spec_steps": 2, "draft_tokens": 8, "accepted_tokens": 3,
        "acceptance_histogram": (1, 0, 0, 1, 0),
    }


def test_stat_logger_feeds_the_hub_and_survives_garbage() -> None:
    hub = Hub()
    sched, it = make_stats()

    class Config:
        model_config = None

    logger = SpecscopeStatLogger.bound_to(hub)(Config(), [0])
    logger.record(scheduler_stats=sched, iteration_stats=it, mm_cache_stats=None, engine_idx=0)
    logger.record(scheduler_stats=object(), iteration_stats=None)  # a future vLLM with other fields
    snap = hub.snapshot()
    assert snap.lifetime.spec.accepted == 5 and snap.lifetime.requests == 1
    assert snap.requests[0].request_id == "req-1"
    assert dict(snap.health.errors) == {"stat logger step": 1}
