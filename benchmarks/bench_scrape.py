"""Cost of one Prometheus scrape of specscope's endpoint with 1,000 recorded requests.

Measures the full HTTP round trip (what Prometheus waits for) and, separately, the collector alone
(snapshot + exposition, no HTTP), against the baseline of prometheus-client exposing an empty registry over the
same HTTP path. Goal: a scrape under 5 ms. Run: python benchmarks/bench_scrape.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from benchmarks._common import per_call_ns, write
from specscope.core.model import EngineInfo
from specscope.export.endpoint import Endpoint
from specscope.export.prometheus_export import SnapshotCollector
from specscope.state.hub import Hub, StepStats


def main() -> None:
    hub = Hub(max_requests=1000)
    hub.set_engine(EngineInfo(model="target", draft_model="draft", method="draft_model", num_speculative_tokens=4,
                              block_size=16, num_blocks=4096, engine_version="0.32.0"))
    for i in range(1000):
        hub.record_step(StepStats(running=8, waiting=0, kv_usage=0.4, num_spec_tokens=4, drafts=8, draft_tokens=32,
                                  accepted=20, accepted_per_pos=[7, 6, 4, 3], draft_tokens_per_pos=[8] * 4,
                                  generation_tokens=28, finished=1, finished_tokens=178, prompt_tokens=50))
        hub.requests.record(f"cmpl-{i}", prompt_tokens=50, generation_tokens=128, e2e_s=1.0 + i % 7, ttft_s=0.05,
                           tpot_s=0.007, num_spec_tokens=4, spec_steps=32, draft_tokens=128, accepted_tokens=80,
                           acceptance_histogram=(4, 4, 8, 8, 8))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(hub.snapshot))
    collector_us = per_call_ns(lambda: generate_latest(registry), 200) / 1000
    snapshot_us = per_call_ns(hub.snapshot, 2000) / 1000

    endpoint = Endpoint(hub.snapshot, port=0)
    # Baseline: prometheus-client's own HTTP server exposing an empty registry.
    empty_server, _ = start_http_server(0, addr="127.0.0.1", registry=CollectorRegistry())
    empty_url = f"http://127.0.0.1:{empty_server.server_address[1]}"

    def round_trip_ms(url: str, n: int = 300) -> float:
        with httpx.Client() as client:
            client.get(url)
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                client.get(url)
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1000

    scrape_ms = round_trip_ms(f"{endpoint.url}/metrics")
    baseline_ms = round_trip_ms(f"{empty_url}/metrics")
    size = len(httpx.get(f"{endpoint.url}/metrics").content)
    endpoint.close()
    empty_server.shutdown()
    write("scrape", {
        "requests_recorded": 1000,
        "scrape_round_trip_ms_median": round(scrape_ms, 3),
        "empty_registry_round_trip_ms_median": round(baseline_ms, 3),
        "collector_only_us": round(collector_us, 1),
        "snapshot_us": round(snapshot_us, 1),
        "exposition_bytes": size,
        "goal": "scrape < 5 ms",
    })


if __name__ == "__main__":
    main()
