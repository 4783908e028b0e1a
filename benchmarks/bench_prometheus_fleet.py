"""`top --prometheus` against direct polling: time and CPU per refresh of a fleet of 200 vLLM replicas.

200 exporters on 127.0.0.1 serve a real vLLM /metrics page (tests/fixtures/vllm_metrics.txt, one engine each);
a real Prometheus scrapes them all. One refresh is what the dashboard does per interval: with ``--prometheus``,
two instant queries (the series' values, and the counters' increase over the window) and 200 conversions; with
``--vllm`` per replica, 200 GETs, parses and conversions. The ratio
of the two, in the same run, is the result (benchmarks/results/prometheus_fleet.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import write  # noqa: E402
from specscope.collectors.prometheus_source import PrometheusFleet  # noqa: E402
from specscope.collectors.scrape import vllm_source  # noqa: E402
from tests.collectors.test_prometheus_source import FIXTURE, Exporter  # noqa: E402
from tests.conftest import start_prometheus  # noqa: E402


def per_refresh(fn: object, rounds: int) -> dict[str, float]:
    """Median wall and CPU milliseconds of ``fn()`` over ``rounds``."""
    wall, cpu = [], []
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        fn()  # type: ignore[operator]
        wall.append((time.perf_counter() - w) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return {"wall_ms": round(statistics.median(wall), 2), "cpu_ms": round(statistics.median(cpu), 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--replicas", type=int, default=200)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()
    exporters = [Exporter(FIXTURE) for _ in range(args.replicas)]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {f"r{i:03d}": e.target for i, e in enumerate(exporters)}
        url, proc = start_prometheus(jobs, Path(tmp), up_within_s=180)
        try:
            fleet = PrometheusFleet(url, timeout=30.0, max_age=0.0)
            fleet.samples()  # raises with the reason if the query fails
            sources = fleet.sources()
            assert len(sources) == args.replicas, len(sources)
            direct = [vllm_source(e.target) for e in exporters]

            def via_prometheus() -> None:
                for s in sources:
                    s.fetch()

            def polling() -> None:
                for s in direct:
                    s.fetch()

            fleet.max_age = 1e9  # the sources of one refresh share its queries: time them separately
            query = per_refresh(lambda: (setattr(fleet, "_at", float("-inf")), fleet.samples()), args.rounds)
            convert = per_refresh(via_prometheus, args.rounds)
            prom = {k: round(query[k] + convert[k], 2) for k in query}
            poll = per_refresh(polling, args.rounds)
        finally:
            proc.terminate()
            proc.wait(30)
    for e in exporters:
        e.close()
    result = {
        "replicas": args.replicas,
        "prometheus_query": query,
        "prometheus_conversions": convert,
        "prometheus_refresh": prom,
        "direct_polling_refresh": poll,
        "ratio_wall": round(prom["wall_ms"] / poll["wall_ms"], 3),
        "ratio_cpu": round(prom["cpu_ms"] / poll["cpu_ms"], 3),
    }
    write("prometheus_fleet", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
