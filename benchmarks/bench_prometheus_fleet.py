"""`top --prometheus` against direct polling: time and CPU per refresh of a fleet of 200 vLLM replicas.

200 exporters on 127.0.0.1 serve a real vLLM /metrics page (tests/fixtures/vllm_metrics.txt, one engine each),
from separate processes (``--servers`` of them, each serving its share of the ports), never from the benchmark's
own: the benchmark process is the dashboard alone. A real Prometheus scrapes them all. One refresh is what
``specscope top`` does per interval, by its own code: :meth:`TopApp.poll_now` polls every target on its pool of 8
threads, then evaluates the alert rules on each target. With ``--prometheus`` the targets' sources share two
instant queries per refresh (the series' values, and the counters' increase over the window) and convert their
replica's series; with ``--vllm`` per replica, each target GETs its replica's page, parses and converts it.

Timed in alternating rounds (this machine's speed drifts by tens of percent over minutes), each way's refresh,
its polls alone (the pool's, without the alert rules), and the Prometheus way's two queries alone: the dashboard
process's CPU time (``process_time``: every thread of this process, which serves nothing) and the wall time.
The ratios (Prometheus over direct) are the medians of the rounds' ratios
(benchmarks/results/prometheus_fleet.json). Prometheus's own CPU and the replicas' are not counted on either
side: they are other processes (Prometheus answers two queries per refresh; direct polling has every replica
serve its page once more per refresh). The wall time of the Prometheus way includes Prometheus evaluating the
queries, here on the same two cores as everything else.
Run: python benchmarks/bench_prometheus_fleet.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import write  # noqa: E402


def serve(replicas: int) -> None:
    """In a child process: serve the fixture on ``replicas`` ports, print their addresses (one JSON line), and
    serve until stdin closes."""
    from tests.read.test_prometheus_source import FIXTURE, Exporter

    exporters = [Exporter(FIXTURE) for _ in range(replicas)]
    print(json.dumps([e.target for e in exporters]), flush=True)
    sys.stdin.read()


def start_servers(replicas: int, servers: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """``servers`` processes serving ``replicas`` ports between them; the processes and every address."""
    procs, targets = [], []
    for i in range(servers):
        n = replicas // servers + (i < replicas % servers)
        procs.append(subprocess.Popen([sys.executable, __file__, "--serve", str(n)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, cwd=ROOT))
    for p in procs:
        assert p.stdout is not None
        targets += json.loads(p.stdout.readline())
    return procs, targets


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall and CPU milliseconds (this process, all its threads) of one call of ``fn``."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - w) * 1e3, (time.process_time() - c) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--replicas", type=int, default=200)
    p.add_argument("--servers", type=int, default=4, help="processes serving the replicas' pages")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return 0

    from specscope.read.fleet import Target
    from specscope.read.prometheus_source import PrometheusFleet
    from specscope.read.scrape import vllm_source
    from specscope.read.tui.app import TopApp
    from tests.conftest import start_prometheus

    load = round(os.getloadavg()[0], 2)
    procs, targets = start_servers(args.replicas, args.servers)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            jobs = {f"r{i:03d}": t for i, t in enumerate(targets)}
            url, prom = start_prometheus(jobs, Path(tmp), up_within_s=180)
            try:
                # max_age: one refresh queries once (`top` sets half its interval; rounds here are back to back,
                # so each refresh starts by making the last result stale).
                fleet = PrometheusFleet(url, timeout=30.0, max_age=1e9)
                deadline = time.monotonic() + 60
                while len(fleet.samples()) < args.replicas and time.monotonic() < deadline:  # raises if it fails
                    time.sleep(0.5)
                    fleet._at = float("-inf")
                via_prometheus = TopApp([Target(s) for s in fleet.sources()], interval=0)
                direct = TopApp([Target(vllm_source(t, timeout=30.0)) for t in targets], interval=0)
                assert len(via_prometheus.targets) == len(direct.targets) == args.replicas

                def stale() -> None:  # `top` refreshes every interval; max_age is half of it
                    fleet._at = float("-inf")

                def polls(app: TopApp) -> None:  # what poll_now does before the alert rules
                    list(app._pool.map(Target.poll, app.targets))

                def prometheus_refresh() -> None:
                    stale()
                    via_prometheus.poll_now()

                def prometheus_polls() -> None:
                    stale()
                    polls(via_prometheus)

                def prometheus_queries() -> None:
                    stale()
                    fleet.samples()

                ways: dict[str, Callable[[], None]] = {
                    "prometheus refresh": prometheus_refresh,
                    "direct refresh": direct.poll_now,
                    "prometheus polls": prometheus_polls,
                    "direct polls": lambda: polls(direct),
                    "prometheus queries": prometheus_queries,
                }
                for fn in ways.values():  # the first poll of a target has no window yet
                    fn()
                    fn()
                for app in (via_prometheus, direct):
                    bad = [t.error for t in app.targets if t.error or t.snapshot is None]
                    assert not bad, bad[:3]
                wall: dict[str, list[float]] = {k: [] for k in ways}
                cpu: dict[str, list[float]] = {k: [] for k in ways}
                for r in range(args.rounds):
                    for name in (list(ways) if r % 2 == 0 else list(reversed(ways))):
                        w, c = timed(ways[name])
                        wall[name].append(w)
                        cpu[name].append(c)
            finally:
                prom.terminate()
                prom.wait(30)
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)

    def med(xs: Any) -> float:
        return round(statistics.median(xs), 2)

    def ratio(xs: dict[str, list[float]], what: str) -> float:
        pairs = zip(xs[f"prometheus {what}"], xs[f"direct {what}"], strict=True)
        return round(statistics.median(a / b for a, b in pairs), 3)

    result: dict[str, Any] = {
        "replicas": args.replicas,
        "replica_server_processes": args.servers,
        "rounds": args.rounds,
        "method": ("one refresh = TopApp.poll_now(): every target polled on its pool of 8 threads, then the alert "
                   "rules; polls = the pool's polls alone; all timed in alternating rounds; CPU = process_time of "
                   "the dashboard process, which serves nothing; ratios = medians of the rounds' ratios"),
    }
    for name in ways:
        result[name.replace(" ", "_")] = {"wall_ms": med(wall[name]), "cpu_ms": med(cpu[name])}
    for what in ("refresh", "polls"):
        result[f"ratio_{what}_cpu"] = ratio(cpu, what)
        result[f"ratio_{what}_wall"] = ratio(wall, what)
    result["load_average_1min"] = [load, round(os.getloadavg()[0], 2)]  # this machine's, at start and end
    write("prometheus_fleet", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
