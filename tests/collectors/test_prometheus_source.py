"""`specscope top --prometheus`: a fleet read from a real Prometheus scraping two replicas (one data parallel)."""

from __future__ import annotations

import contextlib
import http.server
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specscope.collectors.prometheus_source import PrometheusFleet, selector_matchers
from specscope.collectors.promtext import parse
from specscope.collectors.scrape import SourceError, vllm_snapshot
from tests.conftest import free_port, start_prometheus

FIXTURE = (Path(__file__).resolve().parent.parent / "fixtures" / "vllm_metrics.txt").read_text()
needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus not installed")


def data_parallel(text: str) -> str:
    """The page of a two-engine server: every engine-0 sample again for engine 1, counters 10 higher."""
    out = []
    for line in text.splitlines():
        out.append(line)
        if 'engine="0"' in line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            bump = 10.0 if name.split("{")[0].endswith(("_total", "_count")) else 0.0
            out.append(name.replace('engine="0"', 'engine="1"') + f" {float(value) + bump}")
    return "\n".join(out) + "\n"


class Exporter:
    """A /metrics page served on 127.0.0.1 (what a vLLM API server's /metrics answers)."""

    def __init__(self, text: str) -> None:
        page = text.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError):  # the scraper gave up (a timeout under load)
                    self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fleet_prometheus(tmp_path_factory: Any) -> Iterator[tuple[str, dict[str, str]]]:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus not installed")
    pages = {"single": FIXTURE, "dp2": data_parallel(FIXTURE)}
    exporters = {name: Exporter(text) for name, text in pages.items()}
    url, proc = start_prometheus({name: e.target for name, e in exporters.items()}, tmp_path_factory.mktemp("prom"))
    try:
        yield url, {f"{name}/{e.target}": pages[name] for name, e in exporters.items()}
    finally:
        proc.terminate()
        proc.wait(30)
        for e in exporters.values():
            e.close()


@needs_prometheus
def test_every_replica_and_engine_reads_as_its_own_metrics_page(fleet_prometheus: tuple[str, dict[str, str]]) -> None:
    url, pages = fleet_prometheus
    fleet = PrometheusFleet(url)
    sources = fleet.sources()
    assert sorted(s.name for s in sources) == sorted(pages)
    for source in sources:
        got = source.fetch()
        direct = vllm_snapshot(parse(pages[source.name]), got.time)  # what --vllm reads from the page itself
        assert got.lifetime.spec == direct.lifetime.spec and got.engine.model == direct.engine.model
        assert [e.index for e in got.engines] == [e.index for e in direct.engines]
        for a, b in zip(got.engines, direct.engines, strict=True):
            assert a.lifetime.spec == b.lifetime.spec and a.kv.block_usage == b.kv.block_usage
    dp = next(s for s in sources if s.name.startswith("dp2")).fetch()
    assert [e.index for e in dp.engines] == [0, 1]
    assert dp.engines[1].lifetime.spec.drafts == dp.engines[0].lifetime.spec.drafts + 10  # type: ignore[union-attr]
    # One query serves every replica of a refresh.
    fleet.samples()
    at = fleet._at
    for source in sources:
        source.fetch()
    assert fleet._at == at


@needs_prometheus
def test_a_selector_narrows_the_fleet_and_one_matching_nothing_says_so_and_recovers(
        fleet_prometheus: tuple[str, dict[str, str]]) -> None:
    url, pages = fleet_prometheus
    assert [s.name for s in PrometheusFleet(url, 'job="dp2"').sources()] == [n for n in pages if n.startswith("dp2")]
    (waiting,) = PrometheusFleet(url, '{job="later"}').sources()
    with pytest.raises(SourceError, match=r'no series match \{__name__=~"vllm\[:_\]\(.*\)",job="later"\}'):
        waiting.fetch()
    waiting.fleet.query = waiting.fleet.query.replace('job="later"', 'job="single"')  # the replica appears
    waiting.fleet._at = 0.0
    assert waiting.fetch().lifetime.spec is not None and waiting.replica is not None


@needs_prometheus
def test_bad_input_is_one_line(fleet_prometheus: tuple[str, dict[str, str]]) -> None:
    url, pages = fleet_prometheus
    with pytest.raises(ValueError, match="not a label selector"):
        selector_matchers("job=vllm")
    bad_regex = PrometheusFleet(url, 'job=~"("')
    with pytest.raises(SourceError, match=r"refused \(PromQL error\)"):
        bad_regex.samples()
    exporter_page = "http://" + next(iter(pages)).split("/", 1)[1]  # a /metrics server, not a query API
    with pytest.raises(SourceError, match="not a Prometheus query API"):
        PrometheusFleet(exporter_page).samples()
    with pytest.raises(SourceError, match="Connection refused"):
        PrometheusFleet(f"http://127.0.0.1:{free_port()}").samples()


@needs_prometheus
def test_top_once_over_prometheus(fleet_prometheus: tuple[str, dict[str, str]]) -> None:
    url, pages = fleet_prometheus
    cli = [sys.executable, "-m", "specscope.cli", "top", "--prometheus", url, "--once"]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for name in pages:
        assert name in r.stdout
    r = subprocess.run([*cli[:-1], "--selector", "job=vllm", "--once"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a label selector" in r.stderr
    down = subprocess.run([*cli[:5], f"http://127.0.0.1:{free_port()}", "--once"], capture_output=True, text=True,
                          timeout=60)
    assert down.returncode == 1 and "Traceback" not in down.stderr + down.stdout
    assert re.search(r"Connection refused", down.stdout + down.stderr)
