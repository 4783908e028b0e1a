"""How long a poll of ``GET /specscope/snapshot`` holds vLLM's event loop, with 1,000 request records.

The middleware runs on the server's event loop. A ticker task on the same loop records the longest time between
two of its turns while polls are served: that is the longest the loop was held. Three ways of serving, in the same
run: the old one (the whole snapshot built and JSON-encoded in one go), the middleware's full snapshot (records
encoded a few at a time, the loop running between pieces), and its incremental poll (``?since=``: only records
that became final since the poller's last one; 20 new per poll here, as 20 requests a second at a 1 s interval).
Goal: <= 1 ms per poll.
Run: python benchmarks/bench_middleware.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write
from specscope.collectors.middleware import SpecscopeMiddleware
from specscope.hub import Hub, StepStats
from specscope.model import EngineInfo

RECORDS = 1000
POLLS = 60


def filled_hub() -> Hub:
    hub = Hub(max_requests=RECORDS)
    hub.set_engine(EngineInfo(model="/models/target", draft_model="/models/draft", method="draft_model",
                              num_speculative_tokens=4, block_size=16, num_blocks=1001))
    for i in range(RECORDS):
        hub.record_step(StepStats(running=8, waiting=2, kv_usage=0.4, generation_tokens=24, batch=8, decode_s=0.01,
                                  num_spec_tokens=4, drafts=8, draft_tokens=32, accepted=16,
                                  accepted_per_pos=[6, 5, 3, 2], draft_tokens_per_pos=[8] * 4, rejections=6))
        hub.record_request(f"cmpl-{i:06d}-0", finish_reason="length", prompt_tokens=120, generation_tokens=256,
                           cached_tokens=64, e2e_s=2.5, ttft_s=0.08, tpot_s=0.009, queued_s=0.01, prefill_s=0.07,
                           decode_s=2.4, num_spec_tokens=4, spec_steps=90, draft_tokens=360, accepted_tokens=170,
                           acceptance_histogram=(20, 20, 20, 15, 15), engine=0)
    return hub


async def old_way(hub: Hub, scope: Any, receive: Any, send: Any) -> None:
    """What the middleware did before: build and encode everything on the loop."""
    payload = json.dumps(hub.snapshot().to_dict()).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


def held_per_poll(handler: Any, query: Any) -> list[float]:
    """For each poll, the longest the loop went without running the ticker (ms)."""

    async def main() -> list[float]:
        gaps: list[float] = []
        running = True

        async def ticker() -> None:
            last = time.perf_counter()
            while running:
                await asyncio.sleep(0)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        async def send(m: Any) -> None:
            await asyncio.sleep(0)  # a transport hands control back as it writes

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        worst = []
        for i in range(POLLS):
            gaps.clear()
            await handler({"type": "http", "path": "/specscope/snapshot", "method": "GET", "headers": [],
                           "query_string": query(i)}, receive, send)
            await asyncio.sleep(0)
            worst.append(1e3 * max(gaps, default=0.0))
        running = False
        await task
        return worst

    return asyncio.run(main())


def main() -> None:
    hub = filled_hub()
    mw = SpecscopeMiddleware(None, hub=hub, argv=[], join=False)  # type: ignore[arg-type]  # the app is never called
    last = hub.snapshot().requests[-1].final_seq
    results = {
        "old: whole snapshot encoded on the loop": held_per_poll(lambda *a: old_way(hub, *a), lambda i: b""),
        "full snapshot, encoded in pieces": held_per_poll(mw, lambda i: b""),
        "incremental poll (?since=, 20 new records)": held_per_poll(mw, lambda i: f"since={last - 20}".encode()),
    }
    summary = {name: {"median_ms": round(statistics.median(v), 3), "worst_ms": round(max(v), 3)}
               for name, v in results.items()}
    old = summary["old: whole snapshot encoded on the loop"]["median_ms"]
    write("middleware", {
        "records": RECORDS,
        "polls": POLLS,
        "loop_held_per_poll": summary,
        "ratio_incremental_over_old": round(summary["incremental poll (?since=, 20 new records)"]["median_ms"] / old,
                                            4),
        "ratio_full_over_old": round(summary["full snapshot, encoded in pieces"]["median_ms"] / old, 4),
        "goal": "loop held <= 1 ms per poll",
    })


if __name__ == "__main__":
    main()
