"""Memory held by the hub after 100k, 300k and 1M recorded requests (and as many engine steps).

Measured with tracemalloc (bytes allocated by Python and still alive) after each checkpoint; the goal is a flat
line: memory at 1M within ±5% of memory at 100k. At 100 requests a second the first checkpoint is 1,000 s in, past
the hub's 900 s of per-second history, which is allocated as each of its seconds is first used.
Run: python benchmarks/bench_hub_memory.py [--max 1000000]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write
from specscope.core.model import EngineInfo
from specscope.state.hub import Hub, StepStats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max", type=int, default=1_000_000)
    args = parser.parse_args()

    clock = [1_000_000.0]
    step = StepStats(running=8, waiting=0, kv_usage=0.3, num_spec_tokens=4, drafts=8, draft_tokens=32, accepted=20,
                     accepted_per_pos=[7, 6, 4, 3], draft_tokens_per_pos=[8, 8, 8, 8], generation_tokens=28,
                     finished=1, finished_tokens=178, prompt_tokens=50)
    timing = {"prompt_tokens": 50, "generation_tokens": 128, "e2e_s": 1.0, "ttft_s": 0.05, "tpot_s": 0.007}
    spec = {"num_spec_tokens": 4, "spec_steps": 32, "draft_tokens": 128, "accepted_tokens": 80,
            "acceptance_histogram": (4, 4, 8, 8, 8)}

    def new_hub() -> Hub:
        hub = Hub(max_requests=1000, clock=lambda: clock[0])
        hub.set_engine(EngineInfo(num_speculative_tokens=4, block_size=128, num_blocks=1024))
        hub.requests.expect_parts(2)
        return hub

    def feed(hub: Hub, start: int, stop: int) -> None:
        for i in range(start, stop):
            hub.record_step(step)
            hub.requests.record(f"cmpl-{i}", **timing)
            hub.requests.record(f"cmpl-{i}", **spec)
            clock[0] += 0.01  # 100 requests a second: the window and its history fill and roll over

    # Speed on its own (tracemalloc slows allocation), then memory of a hub traced from its creation.
    hub = new_hub()
    t0 = time.perf_counter()
    feed(hub, 0, 20_000)
    record_us = (time.perf_counter() - t0) / 20_000 * 1e6
    del hub
    gc.collect()
    tracemalloc.start()
    hub = new_hub()
    memory = {}
    done = 0
    for target in sorted({c for c in (100_000, 300_000, 1_000_000, args.max) if c <= args.max}):
        feed(hub, done, target)
        done = target
        hub.snapshot()
        gc.collect()
        memory[target] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    first, last = memory[min(memory)], memory[max(memory)]
    write("hub_memory", {
        "bytes_after_requests": {str(k): v for k, v in memory.items()},
        "ratio_last_over_first": round(last / first, 4),
        "us_per_request_one_step_two_parts": round(record_us, 2),
        "goal": "ratio within 0.95..1.05",
    })


if __name__ == "__main__":
    main()
