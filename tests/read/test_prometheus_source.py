"""`specscope top --prometheus`: a fleet read from a real Prometheus scraping two replicas (one data parallel)."""

from __future__ import annotations

import contextlib
import http.server
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from specscope.read.fleet import Target
from specscope.read.metrics_snapshot import vllm_snapshot
from specscope.read.prometheus_source import PrometheusFleet, selector_matchers
from specscope.read.promtext import parse
from specscope.read.scrape import SourceError
from tests.conftest import FIXTURES, free_port, start_prometheus

FIXTURE = (FIXTURES / "vllm_metrics.txt").read_text()
pytestmark = pytest.mark.server
#: Prometheus-compatible storages, each from Debian: a test runs against every one.
STORAGES = ["prometheus", "victoriametrics"]


def storage_installed(kind: str) -> None:
    if shutil.which("prometheus" if kind == "prometheus" else "victoria-metrics") is None:
        pytest.skip(f"Debian's {kind} not installed")


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
    """A /metrics page served on 127.0.0.1 (what a vLLM API server's /metrics answers): fixed text, or a function
    of the time."""

    def __init__(self, text: str | Callable[[], str]) -> None:
        page = text if callable(text) else (lambda: text)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the scraper gave up (a timeout)
                    self.wfile.write(page().encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Storage:
    """One storage scraping every page this module reads, started once per kind (a start is seconds): the two
    replicas of the fleet tests (``pages``, jobs ``single`` and ``dp2``), a replica whose acceptance changed
    (job ``g``, :func:`serving`), and a specscope endpoint beside vLLM's page (jobs ``specscope`` and ``vllm``,
    ``hub`` the endpoint's); ``started``: when every job had been scraped once."""

    url: str
    pages: dict[str, str]
    started: float
    hub: Any

    def since_start(self, seconds: float) -> None:
        """Wait until the storage has scraped for ``seconds`` since every job's first scrape (the time of the tests
        that ran before counts)."""
        time.sleep(max(0.0, self.started + seconds - time.monotonic()))


@pytest.fixture(scope="module", params=STORAGES)
def storage(request: Any, tmp_path_factory: Any) -> Iterator[Storage]:
    from specscope.core.model import TokenizerStatus
    from specscope.export.endpoint import Endpoint
    from tests.export.test_otel_export import filled_hub

    storage_installed(request.param)
    pages = {"single": FIXTURE, "dp2": data_parallel(FIXTURE)}
    serving_since = time.monotonic()
    hub = filled_hub()
    hub.set_tokenizer(TokenizerStatus("warning", ("2 added tokens",), overlap=0.98))
    endpoint = Endpoint(hub.snapshot, port=0)
    exporters = {name: Exporter(text) for name, text in pages.items()}
    exporters |= {"g": Exporter(lambda: serving(serving_since)), "vllm": Exporter(FIXTURE)}
    jobs = {name: e.target for name, e in exporters.items()} | {"specscope": endpoint.url.removeprefix("http://")}
    url, proc = start_prometheus(jobs, tmp_path_factory.mktemp("prom"), kind=request.param)
    try:
        yield Storage(url, {f"{name}/{exporters[name].target}": text for name, text in pages.items()},
                      time.monotonic(), hub)
    finally:
        proc.terminate()
        proc.wait(30)
        for e in exporters.values():
            e.close()
        endpoint.close()


#: The fleet tests' two replicas.
FLEET = '{job=~"single|dp2"}'


def test_every_replica_and_engine_reads_as_its_own_metrics_page(storage: Storage) -> None:
    url, pages = storage.url, storage.pages
    fleet = PrometheusFleet(url, FLEET)
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


def test_a_selector_narrows_the_fleet_and_one_matching_nothing_says_so_and_recovers(storage: Storage) -> None:
    url, pages = storage.url, storage.pages
    assert [s.name for s in PrometheusFleet(url, 'job="dp2"').sources()] == [n for n in pages if n.startswith("dp2")]
    (waiting,) = PrometheusFleet(url, '{job="later"}').sources()
    with pytest.raises(SourceError, match=r'no series match \{__name__=~"vllm\[:_\]\(.*",job="later"\}'):
        waiting.fetch()
    waiting.fleet.query = waiting.fleet.query.replace('job="later"', 'job="single"')  # the replica appears
    waiting.fleet._at = 0.0
    assert waiting.fetch().lifetime.spec is not None and waiting.replica is not None


def test_bad_input_is_one_line(storage: Storage) -> None:
    url, pages = storage.url, storage.pages
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


def test_top_once_over_prometheus(storage: Storage) -> None:
    url, pages = storage.url, storage.pages
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


def serving(started: float) -> str:
    """A replica that drafted 1,000 times at 10% acceptance before, and now drafts 10 times a second (K=4) at 75%:
    per position 100%, 80%, 70% and 50% of its drafts."""
    t = time.monotonic() - started
    lab = 'engine="0",model_name="g"'
    per_pos = [100 + 10 * t * r for r in (1.0, 0.8, 0.7, 0.5)]
    return "\n".join([
        f"vllm:num_requests_running{{{lab}}} 1",
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {1000 + 10 * t}",
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {4000 + 40 * t}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {sum(per_pos)}",
        *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {n}'
          for i, n in enumerate(per_pos)),
        f"vllm:generation_tokens_total{{{lab}}} {40 * t}",
    ]) + "\n"


def test_the_window_comes_from_the_storage_history(storage: Storage) -> None:
    """The first refresh already has a window (``increase()`` over the storage's history), apart from lifetime."""
    url = storage.url
    storage.since_start(6)  # a few scrapes a second apart
    fleet = PrometheusFleet(url, '{job="g"}', window_s=5)
    (source,) = fleet.sources()
    target = Target(source)
    target.poll()
    snap = target.windowed(5)
    assert snap is not None and snap.window_seconds == 5 and "window" not in snap.unavailable
    w, life = snap.window.spec, snap.lifetime.spec
    assert w is not None and life is not None
    assert w.acceptance_rate == pytest.approx(0.75, abs=0.02)  # lifetime: dominated by the 10% before
    assert life.acceptance_rate is not None and life.acceptance_rate < 0.4
    assert [round(r, 1) for r in w.per_position] == [1.0, 0.8, 0.7, 0.5]
    assert snap.engines[0].window.spec is not None
    assert snap.engines[0].window.spec.acceptance_rate == pytest.approx(0.75, abs=0.02)
    # Another window is asked of the storage from the next refresh on; until then the polls' own window.
    assert target.windowed(3) is not None and fleet.window_s == 3
    fleet._at = 0.0
    target.poll()
    again = target.windowed(3)
    assert again is not None and again.window_seconds == 3
    assert again.window.spec is not None and again.window.spec.acceptance_rate == pytest.approx(0.75, abs=0.02)


def test_a_specscope_endpoint_is_a_replica_with_what_only_specscope_knows(storage: Storage) -> None:
    """Prometheus scraping vLLM's /metrics and specscope's endpoint: each is a replica; specscope's adds the draft,
    the method and the tokenizer check, and the dashboard's rules fire on it."""
    # A window that begins after the series' first scrape (VictoriaMetrics counts a series that appears within the
    # window from zero; Prometheus from its first sample).
    storage.since_start(5)
    fleet = PrometheusFleet(storage.url, '{job=~"specscope|vllm"}', window_s=3)
    sources = {s.name.split("/")[0]: s for s in fleet.sources()}
    assert set(sources) == {"specscope", "vllm"}
    got, want = sources["specscope"].fetch(), storage.hub.snapshot()
    assert got.lifetime.spec is not None and want.lifetime.spec is not None
    for field in ("drafts", "draft_tokens", "accepted", "accepted_per_pos", "num_spec_tokens"):
        assert getattr(got.lifetime.spec, field) == getattr(want.lifetime.spec, field), field
    assert (got.lifetime.generation_tokens, got.lifetime.prompt_tokens, got.lifetime.preemptions) == (
        want.lifetime.generation_tokens, want.lifetime.prompt_tokens, want.lifetime.preemptions)
    assert (got.running, got.waiting, got.kv.block_usage) == (want.running, want.waiting, want.kv.block_usage)
    assert [e.index for e in got.engines] == [0]
    assert (got.engine.model, got.engine.draft_model, got.engine.method) == ("tgt", "drf", "draft_model")
    assert got.tokenizer is not None and (got.tokenizer.verdict, got.tokenizer.overlap) == ("warning", 0.98)
    assert "tokenizer" not in got.unavailable and "window" not in got.unavailable  # increase() of its counters
    assert got.window.spec is not None and got.window.spec.drafts == 0  # nothing drafted since: a still hub
    target = Target(sources["specscope"])
    target.poll()
    assert "SpecscopeTokenizerWarning" in {a.rule for a in target.evaluate() if a.state == "firing"}
    assert sources["vllm"].fetch().tokenizer is None  # vLLM's own series know nothing of it
