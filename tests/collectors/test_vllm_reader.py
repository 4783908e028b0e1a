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


def test_rejections_are_read_per_step() -> None:
    sched, it = make_stats()
    s = vllm_reader.read_step(sched, it)
    # Drafts of 4, 4 and 2 tokens accepting 4, 1 and 0: two stopped at a rejection, one ended on its own.
    assert s.rejections == 2


def decode_step(running: int, finished: int, itl: list[float], ttft: list[float]) -> tuple[object, object]:
    sched = stats.SchedulerStats(num_running_reqs=running, num_waiting_reqs=0)
    it = stats.IterationStats()
    it.inter_token_latencies_iter.extend(itl)  # one per request that produced tokens after an earlier step
    it.time_to_first_tokens_iter.extend(ttft)  # one per request whose prefill ended in this step
    for i in range(finished):
        it.finished_requests.append(stats.FinishedRequestStats(
            finish_reason="length", request_id=f"f{i}", e2e_latency=1.0, num_prompt_tokens=1,
            num_generation_tokens=1))
    return sched, it


@pytest.mark.parametrize(("running", "finished", "itl", "ttft", "batch", "decode_s", "prefill"), [
    (3, 1, [0.02] * 4, [], 4, 0.02, False),  # every request decoded after the previous step: pure decode
    (3, 0, [0.02] * 2, [], 3, None, True),  # one running request produced nothing: a prompt chunk
    (3, 0, [0.02] * 2, [0.5], 3, None, True),  # one request's prefill ended here
    (2, 0, [0.02, 0.09], [], 2, None, False),  # one came back from preemption: not a clean step
    (0, 0, [], [], 0, None, False),
])
def test_step_timing_from_the_engine_cores_intervals(running: int, finished: int, itl: list[float],
                                                      ttft: list[float], batch: int, decode_s: float | None,
                                                      prefill: bool) -> None:
    s = vllm_reader.read_step(*decode_step(running, finished, itl, ttft))
    assert (s.batch, s.decode_s, s.prefill) == (batch, decode_s, prefill)
    assert s.first_tokens == len(ttft) and s.first_token_s == (min(ttft) if ttft else None)


def test_detailed_per_request_metrics_give_acceptance_by_output_position() -> None:
    m = stats.RequestSpecDecodeMetrics.new(4)
    for accepted in (4, 4, 4, 0, 1):
        m.observe(num_draft_tokens=4, num_accepted=accepted, detailed=True)
    steps = vllm_reader.per_step_counts(m)
    assert steps == ([4, 4, 4, 0, 1], [4, 4, 4, 4, 4]) == vllm_reader.per_step_counts(m.to_dict())
    summary = stats.RequestSpecDecodeMetrics.new(4)
    summary.observe(num_draft_tokens=4, num_accepted=2)
    assert vllm_reader.per_step_counts(summary) is None
    hub = Hub()
    hub.record_draft_positions(*steps)
    pos = hub.snapshot().acceptance_by_output_position
    assert pos is not None
    # Drafts made at output positions 1, 6, 11 (bin 0-15: 12 of 12 accepted), then 16 and 17 (bin 16-31: 1 of 8).
    assert pos.draft_tokens[:2] == (12, 8) and pos.accepted[:2] == (12, 1)
    assert pos.rates[0] == 1.0 and pos.rates[1] == pytest.approx(1 / 8) and pos.rates[2] is None
