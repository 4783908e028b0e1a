"""specscope's cost per engine step: its stat-logger record() against vLLM's own PrometheusStatLogger.record() on
the same stats, and as a share of the tiny model's real decode step.

The stats are vLLM's own classes filled as an 8-request speculative batch fills them (K=4; one request finishing
every 8 steps, with the per-request metrics the output-processor hook attaches, detailed). Both loggers are built
from a real VllmConfig of the tiny models. The decode step is the tiny 4-layer target's at batch 8, timed by
specscope on a real engine in the same run (the smallest, cheapest step specscope is tested on: its worst case).
specscope's record() keeps each step's stats and adds them to the hub in batches (every 64 steps here, where the
engine never idles and nothing reads the hub): the cost per call is the total, batches included, over many calls.
Batches are also cut after 5 s and at every read of the hub, so an engine whose steps take longer than 78 ms, or
a hub read often, adds fewer steps at a time: the same is measured with 16-step batches (steps of ~310 ms, or a
reader every 16 steps).
Goals: record() <= 0.25 x vLLM's Prometheus logger's; <= 0.5% of a decode step.
Run: python benchmarks/bench_record.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from benchmarks._common import paired_ns, write


def main() -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, RequestSpecDecodeMetrics, SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from specscope import Hub, tiny_models
    from specscope.engine import vllm_logger
    from specscope.engine.vllm_hook import ATTRIBUTE
    from specscope.engine.vllm_logger import SpecscopeStatLogger

    models = tiny_models.build()
    config = EngineArgs(
        model=str(models["target"]), enforce_eager=True, dtype="float32", max_model_len=512,
        speculative_config={"method": "draft_model", "model": str(models["noise2"]), "num_speculative_tokens": 4},
    ).create_engine_config()
    config.cache_config.num_gpu_blocks = 1024

    steps = []
    for i in range(64):
        sds = SpecDecodingStats.new(4)
        for r in range(8):
            sds.observe_draft(4, (i + r) % 5)
        # Every step runs 8 requests; in one of 8 steps one of them finishes (7 are still running after it).
        sched = SchedulerStats(num_running_reqs=7 if i % 8 == 0 else 8, num_waiting_reqs=0, kv_cache_usage=0.3,
                               spec_decoding_stats=sds)
        it = IterationStats()
        it.num_generation_tokens = 8 * 3
        it.inter_token_latencies_iter = [0.01] * 8
        if i % 8 == 0:
            finished = FinishedRequestStats(
                finish_reason=FinishReason.LENGTH, request_id=f"r{i}", e2e_latency=1.0, num_prompt_tokens=50,
                num_generation_tokens=128, queued_time=0.01, prefill_time=0.05, inference_time=0.9,
                decode_time=0.85, mean_time_per_output_token=0.007)
            metrics = RequestSpecDecodeMetrics.new(4)
            for j in range(32):
                metrics.observe(num_draft_tokens=4, num_accepted=j % 5, detailed=True)
            setattr(finished, ATTRIBUTE, (None, metrics, 0.06))
            it.finished_requests.append(finished)
        steps.append((sched, it))

    prom = PrometheusStatLogger(config, [0])
    hub = Hub()
    ours = SpecscopeStatLogger.bound_to(hub)(config, [0])

    def feeder(logger: object) -> object:
        state = {"i": 0}

        def call() -> None:
            sched, it = steps[state["i"] % len(steps)]
            state["i"] += 1
            for fin in it.finished_requests:  # a new request each time, as in a server (ids never repeat)
                fin.request_id = f"r{state['i']}"
            logger.record(scheduler_stats=sched, iteration_stats=it, mm_cache_stats=None, engine_idx=0)  # type: ignore[attr-defined]

        return call

    calls, repeats = 2000, 15
    ns_prom, ns_ours, ratio = paired_ns(feeder(prom), feeder(ours), calls, repeats)
    counted = hub.snapshot().lifetime
    assert counted.steps == repeats * calls and counted.requests == repeats * calls // 8, counted  # all of them
    (timed,) = counted.step_times.times  # every step a decode step of the batch of 8, as an engine's would be
    assert timed.batch_size == 8 and timed.steps == counted.steps and not timed.prefill_steps, timed
    # Batches are also cut after BATCH_S and at reads: on an engine with slow steps they hold fewer.
    vllm_logger.BATCH_STEPS = 16
    short = SpecscopeStatLogger.bound_to(Hub())(config, [0])
    _, ns_short, ratio_short = paired_ns(feeder(prom), feeder(short), calls, repeats)
    step_us = 1e6 * decode_step_s(str(models["target"]))
    write("record", {
        "specscope_record_us": round(ns_ours / 1000, 2),
        "vllm_prometheus_record_us": round(ns_prom / 1000, 2),
        "ratio_specscope_over_vllm": round(ratio, 3),
        "batch_steps": 64,
        "ratio_at_16_step_batches": round(ratio_short, 3),
        "specscope_record_us_at_16_step_batches": round(ns_short / 1000, 2),
        "method": f"median of {repeats} alternating rounds of {calls} calls each",
        "tiny_target_decode_step_us_at_batch_8": round(step_us, 1),
        "specscope_share_of_a_decode_step": round(ns_ours / 1000 / step_us, 5),
        "goal": "ratio <= 0.25; share of a decode step <= 0.005",
    })


def decode_step_s(target: str) -> float:
    """The tiny target's decode step at batch 8, timed in its engine core (specscope's own measurement)."""
    from vllm import SamplingParams

    import specscope

    llm = specscope.LLM(target, specscope_hub=specscope.Hub(), enforce_eager=True, dtype="float32", max_model_len=512)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    for _ in range(3):
        llm.generate([f"prompt {i}" for i in range(8)], params, use_tqdm=False)
    step = llm.snapshot().lifetime.step_times.get(8)
    llm.llm_engine.engine_core.shutdown()
    assert step is not None
    return step.mean_s


if __name__ == "__main__":
    main()
