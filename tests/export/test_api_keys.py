"""API keys: the standalone endpoint wants one when given; `top` and `report` send theirs only where asked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from specscope.core.auth import key_headers
from specscope.core.bad_input import UsageError
from specscope.core.codec import encode
from specscope.export import exports
from specscope.export.endpoint import Endpoint
from specscope.state.hub import Hub
from tests.conftest import free_port
from tests.read.tui.helpers import http_server, reply

KEY = "s3cret-key"
HINT = "the API key goes only to loopback hosts and to those named with --api-key-host"


@pytest.fixture
def keyed() -> Iterator[Endpoint]:
    hub = Hub()
    hub.requests.record("req-secret-id", e2e_s=1.0)
    endpoint = Endpoint(hub.snapshot, "127.0.0.1", 0, api_key=KEY)
    yield endpoint
    endpoint.close()


def test_the_standalone_endpoint_serves_metrics_and_snapshot_only_with_the_key(keyed: Endpoint) -> None:
    for path in ("/metrics", "/snapshot", "/snapshot?since=0"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {KEY[:-1]}"},
                        {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY}):
            r = httpx.get(keyed.url + path, headers=headers, timeout=10)
            assert r.status_code == 401, (path, headers)
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            assert b"req-secret-id" not in r.content and b"specscope_" not in r.content
        ok = httpx.get(keyed.url + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert ok.status_code == 200, path
    assert b"req-secret-id" in httpx.get(f"{keyed.url}/snapshot", headers={"Authorization": f"bearer {KEY}"},
                                         timeout=10).content
    assert httpx.get(keyed.url + "/", timeout=10).status_code == 200  # the index names the paths, nothing more


def test_the_plugins_endpoint_takes_its_key_from_specscope_api_key() -> None:
    hub = Hub()
    env = {"SPECSCOPE_PROMETHEUS_PORT": str(free_port()), "SPECSCOPE_API_KEY": KEY}
    started = exports.from_env(hub, env=env)
    try:
        assert started.endpoint is not None and not started.problems
        url = started.endpoint.url
        assert httpx.get(f"{url}/snapshot", timeout=10).status_code == 401
        assert httpx.get(f"{url}/snapshot", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).status_code == 200
    finally:
        started.close()
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "check-export", "--prometheus-port", "0"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "SPECSCOPE_API_KEY": KEY})
    assert r.returncode == 0 and "behind SPECSCOPE_API_KEY" in r.stdout and KEY not in r.stdout + r.stderr


@pytest.mark.server
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus not installed")
def test_prometheus_scrapes_a_keyed_endpoint_with_its_authorization_setting(keyed: Endpoint, tmp_path: Path) -> None:
    target = keyed.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n"
        f"  - job_name: keyed\n    authorization: {{credentials: {KEY}}}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
        f"  - job_name: bare\n    static_configs: [{{targets: ['{target}']}}]\n")
    port = free_port()
    proc = subprocess.Popen(["timeout", "300", "prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up: dict[str, str] = {}
        deadline = time.monotonic() + 90
        while len(up) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}, timeout=5).json()
                up = {s["metric"]["job"]: s["value"][1] for s in r["data"]["result"]}
            except (httpx.HTTPError, ValueError, KeyError):
                pass
        assert up == {"keyed": "1", "bare": "0"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def proxy() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """A forward proxy on 127.0.0.1 standing in for every host: records (host, Authorization) per request and
    answers as a server started with an API key would (401 without one)."""
    seen: list[tuple[str, str | None]] = []
    body = b"".join(encode(Hub().snapshot(), None))

    def handle(req: BaseHTTPRequestHandler) -> None:
        auth = req.headers.get("Authorization")
        seen.append((req.headers["Host"], auth))
        if auth:
            reply(req, 200, body, "application/json")
        else:
            reply(req, 401, b'{"error": "Unauthorized"}')

    with http_server(handle) as url:
        yield url, seen


def through(proxy_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "no_proxy")}
    env.update(http_proxy=proxy_url, no_proxy="", VLLM_API_KEY="", SPECSCOPE_API_KEY="")
    return subprocess.run([sys.executable, "-m", "specscope.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env)


def test_top_sends_the_key_to_loopback_and_named_hosts_only(proxy: tuple[str, list[tuple[str, str | None]]]) -> None:
    url, seen = proxy
    r = through(url, "top", "--once", "--json", "--api-key", KEY, "--api-key-host", "gpu-a.test",
                "--url", "http://gpu-a.test:8000/specscope", "--url", "http://gpu-b.test:8000/specscope",
                "--url", "http://127.0.0.1:9464", "--url", "http://localhost:9465")
    sent = dict(seen)
    assert sent == {"gpu-a.test:8000": f"Bearer {KEY}", "gpu-b.test:8000": None,
                    "127.0.0.1:9464": f"Bearer {KEY}", "localhost:9465": f"Bearer {KEY}"}, seen
    # gpu-b, asked without the key, says 401; top says why the key was not sent.
    assert r.returncode == 1 and f"gpu-b.test:8000/specscope/snapshot: HTTP 401 ({HINT})" in r.stderr
    assert set(json.loads(r.stdout)) == {"http://gpu-a.test:8000", "http://127.0.0.1:9464", "http://localhost:9465"}
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert warnings == ["specscope: warning: the API key goes to gpu-a.test over plain http, readable by anyone on "
                        "the way; prefer https:// or an SSH tunnel to 127.0.0.1"]
    assert KEY not in r.stderr + r.stdout


def test_report_sends_the_key_only_where_asked(proxy: tuple[str, list[tuple[str, str | None]]],
                                               tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    url, seen = proxy
    out = str(tmp_path / "r.html")
    r = through(url, "report", "http://gpu-b.test:8000/specscope", "--duration", "0", "-o", out, "--api-key", KEY)
    assert r.returncode == 1 and HINT in r.stderr and seen == [("gpu-b.test:8000", None)]
    seen.clear()
    r = through(url, "report", "http://gpu-b.test:8000/specscope", "--duration", "0", "-o", out, "--api-key", KEY,
                "--api-key-host", "gpu-b.test:8000")
    assert r.returncode == 0, r.stderr
    assert seen == [("gpu-b.test:8000", f"Bearer {KEY}")] and r.stderr.count("warning") == 1


def test_which_urls_get_the_key(capsys: Any) -> None:
    urls = ["http://127.0.0.1:9464", "http://[::1]:9464", "gpu-1:8000", "http://gpu-1:9000", "https://gpu-2/specscope",
            "http://gpu-3:8000"]
    auth = {"Authorization": f"Bearer {KEY}"}
    assert key_headers(urls, KEY, ["gpu-1:8000", "GPU-2"]) == [auth, auth, auth, {}, auth, {}]
    assert capsys.readouterr().err.count("\n") == 1  # gpu-1 over http: one warning line
    assert key_headers(urls, KEY, ["gpu-2"]) == [auth, auth, {}, {}, auth, {}]
    assert capsys.readouterr().err == ""  # https only: no warning
    assert key_headers(urls, None, []) == [{}] * len(urls)
    assert key_headers(["http://gpu-1", "http://gpu-1:8000", "http://gpu-3"], KEY, ["gpu-1,gpu-3"]) == [auth] * 3
    assert capsys.readouterr().err.count("\n") == 1  # once, naming both hosts
    for hosts, message in ((["gpu-9"], "--api-key-host gpu-9 matches no --url host"),
                           (["gpu-1:7"], "--api-key-host gpu-1:7 matches no --url host"),
                           (["gpu-1:x"], "--api-key-host takes HOST or HOST:PORT")):
        with pytest.raises(UsageError, match=message):
            key_headers(urls, KEY, hosts)
    with pytest.raises(UsageError, match="--api-key-host goes with --api-key"):
        key_headers(urls, None, ["gpu-1"])


def test_a_malformed_url_is_one_sentence_and_exit_2() -> None:
    for args in (["top", "--url", "http://[::1", "--once"], ["top", "--vllm", "http://[::1", "--once"],
                 ["top", "--url", "http://gpu-1:port", "--once"], ["report", "http://[::1", "--duration", "0"]):
        r = subprocess.run([sys.executable, "-m", "specscope.cli", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("specscope: error: ") and "is not a URL" in r.stderr
        assert "Traceback" not in r.stderr and "ValueError" not in r.stderr
