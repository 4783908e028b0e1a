"""The Prometheus endpoint: names promtool accepts, stable across formats, scraped by a real Prometheus."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specscope.core.model import Histogram
from specscope.export import catalogue
from specscope.export.endpoint import Endpoint, EndpointError
from specscope.export.prometheus_export import label_name
from specscope.state.hub import Hub
from tests.conftest import start_prometheus
from tests.export.test_otel_export import REQUESTS, filled_hub

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture
def served() -> Iterator[tuple[Hub, Endpoint]]:
    hub = filled_hub()
    for i, fields in enumerate(REQUESTS):
        hub.requests.record(f"req-{i}", **fields)
    endpoint = Endpoint(hub.snapshot, port=0)
    yield hub, endpoint
    endpoint.close()


def scrape(url: str, accept: str = "") -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    r = httpx.get(f"{url}/metrics", headers={"Accept": accept} if accept else {}, timeout=10)
    assert r.status_code == 200
    if "openmetrics" in accept:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families

        families = om_families(r.text)
    else:
        families = text_string_to_metric_families(r.text)
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in families:
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def expected(hub: Hub) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The snapshot's values under their Prometheus names (histograms: _count and _sum)."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    snap = hub.snapshot()
    for m in catalogue.METRICS:
        for attrs, value in m.read(snap):
            labels = tuple(sorted((label_name(k), v) for k, v in attrs.items()))
            if isinstance(value, Histogram):
                out.setdefault(f"{m.prometheus_name}_count", {})[labels] = value.count
                out.setdefault(f"{m.prometheus_name}_sum", {})[labels] = value.total
            else:
                out.setdefault(m.prometheus_name, {})[labels] = value
    return out


def test_scrape_returns_the_snapshot_in_both_formats(served: tuple[Hub, Endpoint]) -> None:
    hub, endpoint = served
    want = expected(hub)
    for accept in ("", OPENMETRICS):
        got = scrape(endpoint.url, accept)
        for name, series in want.items():
            assert got[name] == pytest.approx(series), (accept, name)
    assert not any(":" in name for name in scrape(endpoint.url))


def test_snapshot_json_and_unknown_paths(served: tuple[Hub, Endpoint]) -> None:
    hub, endpoint = served
    data = httpx.get(f"{endpoint.url}/snapshot", timeout=10).json()
    assert data["lifetime"]["spec"]["accepted"] == hub.snapshot().lifetime.spec.accepted
    assert [r["request_id"] for r in data["requests"]] == ["req-0", "req-1"]
    assert httpx.get(f"{endpoint.url}/nope", timeout=10).status_code == 404


def test_binds_loopback_by_default_and_port_in_use_is_one_line() -> None:
    endpoint = Endpoint(Hub().snapshot, port=0)
    try:
        assert endpoint.url.startswith("http://127.0.0.1:")
        port = int(endpoint.url.rsplit(":", 1)[1])
        with pytest.raises(EndpointError) as info:
            Endpoint(Hub().snapshot, port=port)
        assert str(info.value) == f"cannot listen on 127.0.0.1:{port}: address in use"
    finally:
        endpoint.close()


def test_scrape_of_1000_requests_is_fast() -> None:
    hub = filled_hub()
    for i in range(1000):
        hub.requests.record(f"r{i}", **REQUESTS[i % 2])
    endpoint = Endpoint(hub.snapshot, port=0)
    try:
        with httpx.Client() as client:
            client.get(f"{endpoint.url}/metrics")
            samples = []
            for _ in range(20):
                t0 = time.perf_counter()
                assert client.get(f"{endpoint.url}/metrics").status_code == 200
                samples.append(time.perf_counter() - t0)
        # Measured and reported by benchmarks/bench_scrape.py; here only a guard against gross regressions.
        assert sorted(samples)[10] < 0.05
    finally:
        endpoint.close()


needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus not installed")


@needs_promtool
def test_promtool_check_metrics_accepts_the_exposition(served: tuple[Hub, Endpoint]) -> None:
    _, endpoint = served
    text = httpx.get(f"{endpoint.url}/metrics", timeout=10).text
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    # promtool lints names and help; it must find nothing to complain about.
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stdout + r.stderr


@pytest.mark.server
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus not installed")
def test_real_prometheus_scrapes_the_snapshot_values(served: tuple[Hub, Endpoint], tmp_path: Path) -> None:
    hub, endpoint = served
    prom, proc = start_prometheus({"specscope": endpoint.url.removeprefix("http://")}, tmp_path)
    try:
        want = expected(hub)
        queries = ["specscope_spec_decode_accepted_tokens_total", "specscope_spec_decode_acceptance_rate_ratio",
                   "specscope_kv_cache_block_usage_ratio", "gen_ai_server_request_duration_seconds_count",
                   "specscope_spec_decode_accepted_tokens_per_position_total"]
        deadline = time.monotonic() + 60
        results: dict[str, Any] = {}
        while time.monotonic() < deadline and len(results) < len(queries):
            for q in queries:
                try:
                    r = httpx.get(f"{prom}/api/v1/query", params={"query": q}, timeout=5).json()
                except (httpx.HTTPError, ValueError):  # not up yet: refused, or 503 while starting
                    continue
                if r.get("status") == "success" and r["data"]["result"]:
                    results[q] = r["data"]["result"]
            time.sleep(0.5)
        assert set(results) == set(queries)
        for q, series in results.items():
            got = {tuple(sorted((k, v) for k, v in s["metric"].items() if k not in ("__name__", "job", "instance"))):
                   float(s["value"][1]) for s in series}
            assert got == pytest.approx(want[q]), q
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_failing_snapshot_is_a_500_with_one_line() -> None:
    def broken() -> Any:
        raise RuntimeError("hub gone")

    endpoint = Endpoint(broken, port=0)
    try:
        r = httpx.get(f"{endpoint.url}/snapshot", timeout=10)
        assert r.status_code == 500 and r.text == "specscope: RuntimeError: hub gone\n"
        assert httpx.get(f"{endpoint.url}/metrics", timeout=10).status_code == 500
    finally:
        endpoint.close()
