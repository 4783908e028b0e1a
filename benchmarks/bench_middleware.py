"""How long a poll of ``GET /specscope/snapshot`` holds vLLM's event loop, with 1,000 request records.

The middleware runs on the server's event loop. A ticker task on the same loop measures, between two of its
turns while a poll is served, the wall time (the longest the loop went without running it: what a token stream on
that loop would have waited) and this process's CPU time (the same, less the time this busy machine gave to other
processes, so it measures the work that held the loop and not the machine's noise). Per poll: the longest gap of
each. Four ways of serving, in alternating rounds of the same run:

- whole: the snapshot built and JSON-encoded in one go on the loop (the first version);
- before: the snapshot assembled (kept steps added, other processes merged) and its head encoded in one turn of
  the loop, records encoded a few at a time with the loop running between pieces (the previous version);
- on a thread: the same assembly and head on a thread of its own, records in pieces on the loop (what issue 17
  proposed; the thread holds the GIL, which the loop gets back only when the thread is done or after Python's
  switch interval, 5 ms);
- now: the middleware, the assembly and the head's encoding in separate turns of the loop, records in pieces.

Two servers: ``plain``, one API-server process whose hub has nothing waiting; ``server``, the same hub with 64
steps kept by the stat logger (vLLM's own stats objects, read as the plugin reads them) to add at each poll (its
largest batch) and 3 other API-server processes' snapshots
(1,000 records each) to merge, as under ``vllm serve --api-server-count 4`` (a merged snapshot is always sent
whole, so it has no incremental poll). The incremental poll (``?since=``) has 20 new records per poll, as 20
requests a second at a 1 s interval. The ratios are the medians of the rounds' ratios to ``before``.
Goal: <= 1 ms per poll.
Run: python benchmarks/bench_middleware.py
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write
from specscope.core import codec
from specscope.core.model import EngineInfo
from specscope.engine import vllm_stats
from specscope.engine.middleware import SpecscopeMiddleware
from specscope.state.hub import Hub, StepStats

RECORDS = 1000
ROUNDS = 8
POLLS = 8  # per way and round
KEPT_STEPS = 64
OTHER_PROCESSES = 3

STEP = StepStats(running=8, waiting=2, kv_usage=0.4, generation_tokens=24, batch=8, decode_s=0.01,
                 num_spec_tokens=4, drafts=8, draft_tokens=32, accepted=16, accepted_per_pos=[6, 5, 3, 2],
                 draft_tokens_per_pos=[8] * 4, rejections=6)


def filled_hub() -> Hub:
    hub = Hub(max_requests=RECORDS)
    hub.set_engine(EngineInfo(model="/models/target", draft_model="/models/draft", method="draft_model",
                              num_speculative_tokens=4, block_size=16, num_blocks=1001))
    for i in range(RECORDS):
        hub.record_step(STEP)
        hub.requests.record(f"cmpl-{i:06d}-0", finish_reason="length", prompt_tokens=120, generation_tokens=256,
                           cached_tokens=64, e2e_s=2.5, ttft_s=0.08, tpot_s=0.009, queued_s=0.01, prefill_s=0.07,
                           decode_s=2.4, num_spec_tokens=4, spec_steps=90, draft_tokens=360, accepted_tokens=170,
                           acceptance_histogram=(20, 20, 20, 15, 15), engine=0)
    return hub


class Kept:
    """A stat logger's kept steps: :data:`KEPT_STEPS` of vLLM's own stats objects (an 8-request speculative batch,
    K=4) read and added to the hub at every read of it, as the plugin's flush does."""

    def __init__(self, hub: Hub) -> None:
        from vllm.v1.metrics.stats import IterationStats, SchedulerStats
        from vllm.v1.spec_decode.metrics import SpecDecodingStats

        self.steps = []
        for i in range(KEPT_STEPS):
            sds = SpecDecodingStats.new(4)
            for r in range(8):
                sds.observe_draft(4, (i + r) % 5)
            it = IterationStats()
            it.num_generation_tokens = 8 * 3
            it.inter_token_latencies_iter = [0.01] * 8
            self.steps.append((SchedulerStats(num_running_reqs=8, num_waiting_reqs=0, kv_cache_usage=0.3,
                                              spec_decoding_stats=sds), it))
        self.hub = hub
        hub.add_pending_source(self.flush)

    def flush(self) -> None:
        now = time.time()
        self.hub.record_steps(0, vllm_stats.read_steps([now] * KEPT_STEPS, [s for s, _ in self.steps],
                                                       [i for _, i in self.steps]))


class Share:
    """Other API-server processes' published snapshots."""

    def __init__(self, others: list[Any]) -> None:
        self._others = others

    def others(self) -> list[Any]:
        return list(self._others)


def server_hub() -> tuple[Hub, Kept]:
    hub = filled_hub()
    hub.attach_share(Share([filled_hub().local_snapshot() for _ in range(OTHER_PROCESSES)]))
    return hub, Kept(hub)


async def whole(hub: Hub, scope: Any, receive: Any, send: Any) -> None:
    """The first version: build and encode everything on the loop."""
    payload = json.dumps(codec.to_dict(hub.snapshot())).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


class OnTheLoop(SpecscopeMiddleware):
    """The previous version: the snapshot assembled and its head encoded in one turn of the loop, records in
    pieces."""

    async def _snapshot(self, scope: Any, send: Any) -> None:
        assert self.guard.allows(scope)
        await self._send(send, *self._assemble(_since(scope)))

    def _assemble(self, since: int | None) -> tuple[bytes, Iterator[bytes]]:
        pieces = codec.encode(self.hub.snapshot(), since)
        return next(pieces), pieces

    async def _send(self, send: Any, first: bytes, pieces: Iterator[bytes]) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": first, "more_body": True})
        for piece in pieces:
            await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


class OnAThread(OnTheLoop):
    """The same assembly and head on a thread of its own, records in pieces on the loop."""

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specscope-snapshot")

    async def _snapshot(self, scope: Any, send: Any) -> None:
        assert self.guard.allows(scope)
        loop = asyncio.get_running_loop()
        await self._send(send, *await loop.run_in_executor(self.executor, self._assemble, _since(scope)))


def _since(scope: Any) -> int | None:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return int(query["since"][0]) if "since" in query else None


def held_per_poll(handler: Any, query: bytes, polls: int) -> list[tuple[float, float]]:
    """For each poll, the longest the loop went without running the ticker: (wall ms, this process's CPU ms)."""

    async def main() -> list[tuple[float, float]]:
        gaps: list[tuple[float, float]] = []
        running = True

        async def ticker() -> None:
            last, last_cpu = time.perf_counter(), time.process_time()
            while running:
                await asyncio.sleep(0)
                now, cpu = time.perf_counter(), time.process_time()
                gaps.append((now - last, cpu - last_cpu))
                last, last_cpu = now, cpu

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        async def send(m: Any) -> None:
            await asyncio.sleep(0)  # a transport hands control back as it writes

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        worst = []
        for _ in range(polls):
            gaps.clear()
            await handler({"type": "http", "path": "/specscope/snapshot", "method": "GET", "headers": [],
                           "query_string": query}, receive, send)
            await asyncio.sleep(0)
            worst.append((1e3 * max((g[0] for g in gaps), default=0.0), 1e3 * max((g[1] for g in gaps), default=0.0)))
        running = False
        await task
        return worst

    return asyncio.run(main())


def main() -> None:
    load = round(os.getloadavg()[0], 2)
    plain = filled_hub()
    server, _kept = server_hub()
    since = f"since={plain.snapshot().requests[-1].final_seq - 20}".encode()
    cases: dict[str, tuple[Hub, bytes]] = {
        "plain, full": (plain, b""),
        "plain, incremental (?since=, 20 new records)": (plain, since),
        f"server ({KEPT_STEPS} kept steps, {OTHER_PROCESSES} other processes), full": (server, b""),
    }
    classes = {"before": OnTheLoop, "on a thread": OnAThread, "now": SpecscopeMiddleware}
    ways = ("whole", *classes)

    def handler(way: str, hub: Hub) -> Any:
        if way == "whole":
            return lambda *a: whole(hub, *a)
        return classes[way](None, hub=hub, argv=[], join=False)  # type: ignore[arg-type]  # the app is never called

    polls: dict[tuple[str, str], list[tuple[float, float]]] = {}
    ratios: dict[str, dict[str, dict[str, list[float]]]] = {
        way: {case: {"wall": [], "cpu": []} for case in cases} for way in ("now", "on a thread")}
    for r in range(ROUNDS):
        for case, (hub, query) in cases.items():
            medians = {}
            for way in (ways if r % 2 == 0 else ways[::-1]):
                if case.startswith("plain, incremental") and way == "whole":
                    continue
                got = held_per_poll(handler(way, hub), query, POLLS)
                polls.setdefault((case, way), []).extend(got)
                medians[way] = [statistics.median(g[i] for g in got) for i in (0, 1)]
            for way, by_case in ratios.items():
                for i, unit in enumerate(("wall", "cpu")):
                    by_case[case][unit].append(medians[way][i] / medians["before"][i])

    held: dict[str, Any] = {}
    for (case, way), got in polls.items():
        held.setdefault(case, {})[way] = {
            f"{stat}_{unit}_ms": round(fn(g[i] for g in got), 3)
            for unit, i in (("wall", 0), ("cpu", 1)) for stat, fn in (("median", statistics.median), ("worst", max))}
    write("middleware", {
        "load_average_1min": [load, round(os.getloadavg()[0], 2)],  # this machine's, at start and end
        "records": RECORDS,
        "polls_per_way": ROUNDS * POLLS,
        "method": f"{ROUNDS} alternating rounds of {POLLS} polls per way; per poll the longest gap between two turns "
                  "of a ticker on the loop, in wall time and in this process's CPU time",
        "loop_held_per_poll": held,
        "median_ratio_over_before": {way: {case: {unit: round(statistics.median(v), 3) for unit, v in r.items()}
                                           for case, r in by_case.items()} for way, by_case in ratios.items()},
        "goal": "loop held <= 1 ms per poll",
    })


if __name__ == "__main__":
    main()
