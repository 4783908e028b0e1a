"""Sources map what they fetch into the snapshot model; targets survive bad sources; windows come from history."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from specscope.core import codec
from specscope.core.intervals import since
from specscope.core.model import Snapshot
from specscope.export.endpoint import Endpoint
from specscope.read.fleet import Target
from specscope.read.metrics_snapshot import sglang_snapshot, vllm_snapshot
from specscope.read.promtext import parse
from specscope.read.scrape import EndpointSource, SourceError, sglang_source
from tests.conftest import FIXTURES
from tests.read.tui.helpers import Clock, busy_hub, feed, http_server, reply


def test_snapshot_round_trips_through_json() -> None:
    snap = busy_hub(Clock()).snapshot()
    assert codec.from_dict(json.loads(json.dumps(codec.to_dict(snap)))) == snap
    with pytest.raises(ValueError, match="not a specscope snapshot"):
        codec.from_dict({"time": "yesterday"})


def test_endpoint_source_reads_the_full_snapshot() -> None:
    hub = busy_hub(Clock())
    ep = Endpoint(hub.snapshot, "127.0.0.1", 0)
    try:
        got = EndpointSource(ep.url).fetch()
    finally:
        ep.close()
    assert got == hub.snapshot()
    assert len(got.requests) == 30 and got.unavailable == ()


@pytest.mark.parametrize(("dropped", "unknown"), [
    ("vllm:spec_decode_num_accepted_tokens_total", "spec_counts"),
    ("vllm:spec_decode_num_draft_tokens_total", "spec_counts"),
    ("vllm:num_preemptions_total", "preemptions"),
    ("vllm:generation_tokens_total", "generation_tokens"),
])
def test_a_counter_missing_from_the_page_is_unavailable_not_zero(dropped: str, unknown: str) -> None:
    """A vLLM that renamed a counter: its number is listed unavailable (shown n/a); acceptance without its
    accepted or drafted count is None, and the weak-draft and collapse alerts stay quiet."""
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import RULES
    from specscope.read.tui import view

    samples = parse((FIXTURES / "vllm_metrics.txt").read_text())
    assert dropped in samples
    del samples[dropped]
    snap = vllm_snapshot(samples, time.time())
    assert unknown in snap.unavailable
    if unknown == "spec_counts":
        assert snap.lifetime.spec is None
        assert Evaluator(on_error=lambda where, exc: None, rules=[r for r in RULES if "Draft" in r.name
                         or "Collapse" in r.name]).evaluate(snap) == []
    text = view.kv_panel(snap).plain + view.spec_panel(snap, 0.3).plain
    if unknown == "preemptions":
        assert "preemptions n/a" in text
    if unknown == "generation_tokens":  # not exported as 0 either
        from specscope.export.catalogue import BY_NAME

        states = {attrs["state"] for attrs, _ in BY_NAME["specscope.tokens"].read(snap)}
        assert states == {"input"}


def test_vllm_page_maps_to_engine_counters() -> None:
    samples = parse((FIXTURES / "vllm_metrics.txt").read_text())
    snap = vllm_snapshot(samples, time.time())

    def total(name: str) -> float:
        return sum(v for _, v in samples[name])

    spec = snap.lifetime.spec
    assert spec is not None and spec.num_spec_tokens == 4
    assert spec.drafts == total("vllm:spec_decode_num_drafts_total")
    assert spec.draft_tokens == total("vllm:spec_decode_num_draft_tokens_total")
    assert spec.accepted == total("vllm:spec_decode_num_accepted_tokens_total")
    assert snap.lifetime.generation_tokens == total("vllm:generation_tokens_total")
    assert snap.kv.block_size and snap.kv.num_blocks
    assert snap.request_duration is not None and snap.request_duration.count == total(
        "vllm:e2e_request_latency_seconds_count")
    assert {"requests", "gpu", "kv_tokens"} <= set(snap.unavailable)
    assert snap.requests == () and snap.kv.fragmentation is None  # unavailable, not zero


def test_a_data_parallel_page_is_read_engine_by_engine() -> None:
    """Two engines (vLLM's engine="0" and "1"): counters add up, each engine apart, KV usage averaged, not summed."""
    lines = [x for x in (FIXTURES / "vllm_metrics.txt").read_text().splitlines()
             if not x.startswith("vllm:kv_cache_usage_perc{")]
    lines += [x.replace('engine="0"', 'engine="1"') for x in lines if 'engine="0"' in x]
    lines += ['vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.6',
              'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.8']
    samples = parse("\n".join(lines) + "\n")
    snap = vllm_snapshot(samples, time.time())
    zero, one = snap.engines
    assert (zero.index, one.index) == (0, 1) and zero.lifetime == one.lifetime  # the same counts, each its own
    assert snap.lifetime.spec.draft_tokens == 2 * zero.lifetime.spec.draft_tokens  # type: ignore[union-attr]
    assert (zero.kv.block_usage, one.kv.block_usage) == (0.6, 0.8)
    assert snap.kv.block_usage == pytest.approx(0.7)  # over 100% if they were added, as before
    assert snap.kv.capacity_tokens == 2 * zero.kv.capacity_tokens  # type: ignore[operator]


def test_sglang_page_reports_gauges_without_inventing_counts() -> None:
    page = "\n".join([
        "# TYPE sglang:spec_accept_length gauge",
        'sglang:spec_accept_length{model_name="qwen"} 2.5',
        'sglang:spec_accept_rate{model_name="qwen"} 0.42',
        'sglang:token_usage{model_name="qwen"} 0.3',
        'sglang:num_running_reqs{model_name="qwen"} 3',
        'sglang:num_queue_reqs{model_name="qwen"} 1',
        'sglang:generation_tokens_total{model_name="qwen"} 1200',
        "",
    ])
    snap = sglang_snapshot(parse(page), 100.0)
    assert snap.engine.server == "sglang" and snap.engine.model == "qwen"
    assert dict(snap.reported) == {"acceptance_rate": 0.42, "mean_acceptance_length": 2.5}
    assert snap.lifetime.spec is None and "spec_counts" in snap.unavailable
    assert (snap.running, snap.waiting, snap.kv.block_usage) == (3, 1, 0.3)
    with http_server(lambda req: reply(req, 200, page.encode())) as url:
        assert sglang_source(url).fetch().reported == snap.reported


def test_unreachable_slow_and_garbage_targets_show_and_recover() -> None:
    state = {"mode": "garbage"}
    hub = busy_hub(Clock())

    def handle(req):  # type: ignore[no-untyped-def]
        if state["mode"] == "garbage":
            reply(req, 200, b"<html>502 Bad Gateway</html>")
        elif state["mode"] == "slow":
            time.sleep(1.0)
            reply(req, 200, json.dumps(codec.to_dict(hub.snapshot())).encode())
        elif state["mode"] == "error":
            reply(req, 503, b"down")
        else:
            reply(req, 200, json.dumps(codec.to_dict(hub.snapshot())).encode())

    with http_server(handle) as url:
        t = Target(EndpointSource(url, timeout=0.3))
        t.poll()
        assert t.error and "not a specscope snapshot" in t.error and t.snapshot is None
        state["mode"] = "slow"
        t.poll()
        assert t.error and "timed out" in t.error
        state["mode"] = "error"
        t.poll()
        assert t.error and "HTTP 503" in t.error
        state["mode"] = "ok"
        t.poll()
        assert t.error is None and t.snapshot is not None and len(t.snapshot.requests) == 30
    t.poll()  # the server is gone
    assert t.error and "Connection refused" in t.error
    assert t.snapshot is not None  # the last good snapshot stays on screen
    with pytest.raises(SourceError):
        EndpointSource("http://127.0.0.1:9").fetch()


def test_window_comes_from_the_history_of_polls() -> None:
    clock = Clock()
    hub = busy_hub(clock, requests=20, accepted_of_4=4)

    class HubSrc:
        name = "hub"

        def fetch(self) -> Snapshot:
            return hub.snapshot()

    t = Target(HubSrc())
    t.poll()
    assert t.windowed(10) == t.snapshot  # one poll: the source's own window
    feed(hub, clock, 10, accepted_of_4=0, start=20)  # the draft turns useless
    t.poll()
    w = t.windowed(60)
    assert w is not None and w.window.spec is not None
    assert w.window.spec.draft_tokens == 10 * 10 * 4 and w.window.spec.accepted == 0
    assert w.window.spec.acceptance_rate == 0.0 and w.window.seconds == pytest.approx(10.0)
    assert since(w.lifetime, w.lifetime).generation_tokens == 0
    assert t.series("acceptance") == [0.0] and t.series("tokens_per_s") == [pytest.approx(40.0)]
    alerts = t.evaluate()
    assert [a.rule for a in alerts] == ["SpecscopeAcceptanceCollapse"] and alerts[0].state == "pending"
    t.reset()
    assert t.windowed(60).window.generation_tokens == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(("plugin_status", "flagged"), [(404, True), (401, False), (200, False)])
def test_a_vllm_server_without_specscope_is_said_so(plugin_status: int, flagged: bool) -> None:
    """--vllm probes the server's /specscope/snapshot: a 404 there (no plugin, or vLLM 0.33's Rust front end, which
    loads none) is said on the screen and in --once; a 401 (the middleware behind --api-key) or a 200 is not."""
    import subprocess
    import sys

    from specscope.read.scrape import NO_PLUGIN, NO_PLUGIN_SAYS, vllm_source

    page = (FIXTURES / "vllm_metrics.txt").read_bytes()
    asked: list[str] = []

    def handle(req: Any) -> None:
        asked.append(req.path)
        if req.path == "/metrics":
            reply(req, 200, page)
        else:
            reply(req, plugin_status, b"{}" if plugin_status == 200 else b"no")

    with http_server(handle) as url:
        source = vllm_source(url)
        first, second = source.fetch(), source.fetch()
        r = subprocess.run([sys.executable, "-m", "specscope.cli", "top", "--vllm", url, "--once"],
                           capture_output=True, text=True, timeout=60)
    assert (NO_PLUGIN in first.unavailable) is flagged and (NO_PLUGIN in second.unavailable) is flagged
    assert asked.count("/specscope/snapshot") == 2  # once per source (then every minute), not on every poll
    assert r.returncode == 0, r.stderr
    assert (NO_PLUGIN_SAYS in r.stdout) is flagged
    assert "n/a from this source: requests" in r.stdout


def test_an_unanswered_probe_flags_nothing() -> None:
    """A probe the server does not answer (the connection closes) says nothing about the plugin."""
    from specscope.read.scrape import NO_PLUGIN, vllm_source

    page = (FIXTURES / "vllm_metrics.txt").read_bytes()

    def handle(req: Any) -> None:
        if req.path == "/metrics":
            reply(req, 200, page)
        else:
            req.close_connection = True  # no answer at all

    with http_server(handle) as url:
        snap = vllm_source(url).fetch()
    assert NO_PLUGIN not in snap.unavailable and "requests" in snap.unavailable


def _vllm_server(plugin_status: int, asked: list[tuple[str, str | None]]) -> Any:
    """A handler that answers as ``vllm serve`` does (404 on paths it lacks, ``/version``), with specscope's
    middleware answering ``plugin_status`` on /specscope/snapshot; it notes each path and its Authorization."""
    snapshot = json.dumps(codec.to_dict(busy_hub(Clock()).snapshot())).encode()

    def handle(req: Any) -> None:
        asked.append((req.path, req.headers.get("Authorization")))
        path = req.path.partition("?")[0]
        if path == "/version":
            reply(req, 200, b'{"version":"0.11.0"}', "application/json")
        elif path == "/specscope/snapshot" and plugin_status == 200:
            reply(req, 200, snapshot, "application/json")
        elif path == "/specscope/snapshot":
            reply(req, plugin_status, b'{"error": "Unauthorized"}', "application/json")
        else:
            reply(req, 404, b'{"detail":"Not Found"}', "application/json")

    return handle


@pytest.mark.parametrize("plugin_status", [200, 401, 404])
def test_a_url_naming_a_vllm_server_says_what_reads_it(plugin_status: int) -> None:
    """`top --url` at a vLLM server's root (its /snapshot: 404) says, in one line and exit 2, that it is a vLLM server
    and where specscope's snapshot is (the middleware's /specscope, a 401 there included), or that --vllm reads
    vLLM's own /metrics where that is 404 too; the server is asked once (not on every poll), with the same key."""
    import subprocess
    import sys

    from specscope.read.scrape import NotAnEndpoint

    asked: list[tuple[str, str | None]] = []
    key = {"Authorization": "Bearer k"}
    with http_server(_vllm_server(plugin_status, asked)) as url:
        t = Target(EndpointSource(url, headers=key))
        t.poll()
        t.poll()
        probes, asked[:] = list(asked), []
        r = subprocess.run([sys.executable, "-m", "specscope.cli", "top", "--url", url, "--once"],
                           capture_output=True, text=True, timeout=60)
        asked[:] = []
        if plugin_status == 404:  # the right URL, on a server without specscope
            with pytest.raises(NotAnEndpoint) as direct:
                EndpointSource(url + "/specscope").fetch()
    own = f"--vllm {url} reads vLLM's own /metrics"
    if plugin_status == 404:
        said = f"{url} is a vLLM server without specscope (/specscope/snapshot: 404): {own}"
        assert str(direct.value) == said
        assert asked == [("/specscope/snapshot", None), ("/version", None)]  # its own 404 is not asked again
    else:
        said = f"{url} is a vLLM server: specscope's snapshot is at {url}/specscope ({own})"
    assert t.error == said and t.source.not_an_endpoint == said  # type: ignore[attr-defined]
    assert probes == [("/snapshot", "Bearer k"), ("/version", "Bearer k"),
                      (f"/specscope/snapshot?since={2**63 - 1}", "Bearer k"), ("/snapshot", "Bearer k")]
    assert r.returncode == 2 and r.stderr == f"specscope: error: {said}\n", r.stderr


def test_a_url_read_right_asks_nothing_more_and_other_404s_stay_plain(tmp_path: Any) -> None:
    """The remote read asks only for /snapshot where it works; a 404 from a server that is not vLLM stays the plain
    HTTP 404 (a target down, exit 1); `report` says the vLLM line as bad input too."""
    import subprocess
    import sys

    asked: list[tuple[str, str | None]] = []
    with http_server(_vllm_server(200, asked)) as url:
        good = Target(EndpointSource(url + "/specscope"))
        for _ in range(3):
            good.poll()
        served, asked[:] = [p for p, _ in asked], []
        rep = subprocess.run([sys.executable, "-m", "specscope.cli", "report", url, "--duration", "0", "-o",
                              str(tmp_path / "r.html")], capture_output=True, text=True, timeout=60)
    assert good.error is None and good.snapshot is not None
    assert [p.partition("?")[0] for p in served] == ["/specscope/snapshot"] * 3
    assert rep.returncode == 2 and rep.stderr == (f"specscope: error: {url} is a vLLM server: specscope's snapshot is "
                                                  f"at {url}/specscope (--vllm {url} reads vLLM's own /metrics)\n")
    plain: list[str] = []

    def nothing_here(req: Any) -> None:
        plain.append(req.path)
        reply(req, 404, b"not found")

    with http_server(nothing_here) as url:
        t = Target(EndpointSource(url))
        t.poll()
        r = subprocess.run([sys.executable, "-m", "specscope.cli", "top", "--url", url, "--once"],
                           capture_output=True, text=True, timeout=60)
    assert t.error == f"{url}/snapshot: HTTP 404" and t.source.not_an_endpoint is None  # type: ignore[attr-defined]
    assert plain[:2] == ["/snapshot", "/version"]
    assert r.returncode == 1 and r.stderr == f"specscope: {url}: {url}/snapshot: HTTP 404\n"
