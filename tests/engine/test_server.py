"""`vllm serve` with no code change: the stat-logger plugin and the middleware in a real OpenAI server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, spec_config

pytestmark = pytest.mark.engine


def server_command(model: str, spec: dict[str, Any], port: int) -> list[str]:
    """The documented command line (README, "vllm serve"), with an upper bound on its life."""
    return [
        "timeout", "900",
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model,
        "--speculative-config", json.dumps(spec),
        "--per-request-spec-decode-metrics", "summary",
        "--middleware", "specscope.collectors.middleware.SpecscopeMiddleware",
        "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--dtype", "float32", "--max-model-len", "512",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny: Any, engines: Any, tmp_path_factory: Any) -> Iterator[tuple[str, int]]:
    engines.close()  # two cores: no other engine alongside the server
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    baseline = log_path.parent / "baseline.json"
    baseline.write_text(json.dumps({"model": "tiny", "step_times": [{"batch_size": 1, "steps": 50, "mean_s": 0.004}]}))
    env = {**os.environ, "VLLM_PLUGINS": "specscope", "SPECSCOPE_PROMETHEUS_PORT": str(free_port()),
           "SPECSCOPE_BASELINE": str(baseline)}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            server_command(str(tiny["target"]), spec_config(tiny, "noise10"), port),
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not up: {log_path.read_text()[-3000:]}")
            time.sleep(1)
        yield url, int(env["SPECSCOPE_PROMETHEUS_PORT"])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def snapshot(url: str) -> dict[str, Any]:
    # Records whose second part did not come are released after a timeout; ours must be complete at once.
    return dict(httpx.get(f"{url}/specscope/snapshot", timeout=10).json())


def vllm_metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name.startswith("vllm:spec_decode") and "position" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_completions_streaming_and_not_are_recorded_with_engine_counts(server: tuple[str, int]) -> None:
    server, specscope_port = server
    body = {"model": None, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    models = httpx.get(f"{server}/v1/models", timeout=10).json()
    body["model"] = models["data"][0]["id"]
    ids = []
    for prompt in ["river stone garden light", "engine token draft model cache block memory"]:
        r = httpx.post(f"{server}/v1/completions", json={**body, "prompt": prompt}, timeout=120).json()
        ids.append(r["id"])
        assert r["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0
    chunks = []
    with httpx.stream(
        "POST", f"{server}/v1/completions", timeout=120,
        json={**body, "prompt": "window signal metric", "stream": True, "stream_options": {"include_usage": True}},
    ) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    ids.append(chunks[-1]["id"])
    chat = httpx.post(
        f"{server}/v1/chat/completions", timeout=120,
        json={**body, "messages": [{"role": "user", "content": "stone river"}]},
    ).json()
    ids.append(chat["id"])

    snap = snapshot(server)
    recs = {r["request_id"]: r for r in snap["requests"]}
    assert len(recs) == 4  # one record each: the plugin's and the middleware's parts were joined
    for rid in ids:
        rec = recs.get(rid) or recs[f"{rid}-0"]
        assert rec["generation_tokens"] == 32 and rec["e2e_s"] > 0  # from the plugin
        assert rec["draft_tokens"] > 0 and rec["acceptance_rate"] is not None  # from the middleware
    assert recs[f"{ids[2]}-0"]["accepted_tokens"] == chunks[-1]["metrics"]["speculative_decoding"][
        "num_accepted_draft_tokens"]
    c = vllm_metrics(server)
    life = snap["lifetime"]["spec"]
    assert life["draft_tokens"] == c["vllm:spec_decode_num_draft_tokens_total"]
    assert life["accepted"] == c["vllm:spec_decode_num_accepted_tokens_total"]
    assert life["drafts"] == c["vllm:spec_decode_num_drafts_total"]
    assert sum(r["draft_tokens"] for r in recs.values()) == life["draft_tokens"]
    assert sum(r["accepted_tokens"] for r in recs.values()) == life["accepted"]
    assert snap["engine"]["method"] == "draft_model" and snap["engine"]["num_speculative_tokens"] == 4
    assert snap["health"]["error_count"] == 0
    # The plugin loaded the baseline from SPECSCOPE_BASELINE and timed the decode steps (one request at a time).
    assert snap["baseline"]["source"] == "baseline baseline.json of tiny"
    (one,) = [t for t in snap["step_times"]["times"] if t["batch_size"] == 1]
    assert one["steps"] >= 4 * 5 and 0 < one["mean_s"] < 1
    # The plugin started specscope's own endpoint from SPECSCOPE_PROMETHEUS_PORT, on 127.0.0.1.
    families = text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{specscope_port}/metrics", timeout=10).text)
    ours = {s.name: s.value for fam in families for s in fam.samples}
    assert ours["specscope_spec_decode_draft_tokens_total"] == c["vllm:spec_decode_num_draft_tokens_total"]
    assert ours["specscope_spec_decode_accepted_tokens_total"] == c["vllm:spec_decode_num_accepted_tokens_total"]
    assert ours["specscope_requests_total"] == 4


def test_dashboard_sources_read_the_real_server(server: tuple[str, int]) -> None:
    """--vllm parses the real /metrics page; --url reads the plugin's endpoint and the middleware's snapshot;
    `specscope top --once --json` returns the engine's own acceptance counters."""
    from specscope.collectors.promtext import parse
    from specscope.collectors.scrape import EndpointSource, vllm_source

    server_url, specscope_port = server
    body = {"model": httpx.get(f"{server_url}/v1/models", timeout=10).json()["data"][0]["id"],
            "prompt": "stone window metric", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    httpx.post(f"{server_url}/v1/completions", json=body, timeout=120).raise_for_status()
    page = httpx.get(f"{server_url}/metrics", timeout=10).text
    # The fast parser gives exactly prometheus-client's samples on the live page.
    ours = sorted((n, tuple(sorted(lb.items())), v) for n, rows in parse(page).items() for lb, v in rows)
    ref = sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                 for fam in text_string_to_metric_families(page) for s in fam.samples)
    assert ours == ref
    c = vllm_metrics(server_url)
    vsnap = vllm_source(server_url).fetch()
    assert vsnap.lifetime.spec is not None
    assert vsnap.lifetime.spec.draft_tokens == c["vllm:spec_decode_num_draft_tokens_total"]
    assert vsnap.lifetime.spec.accepted == c["vllm:spec_decode_num_accepted_tokens_total"]
    assert vsnap.lifetime.spec.num_spec_tokens == 4 and "requests" in vsnap.unavailable
    for url in (f"http://127.0.0.1:{specscope_port}", f"{server_url}/specscope"):
        snap = EndpointSource(url).fetch()
        assert snap.lifetime.spec is not None and snap.lifetime.spec.accepted == vsnap.lifetime.spec.accepted
        assert snap.requests and snap.unavailable == ()
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "top", "--url", f"http://127.0.0.1:{specscope_port}",
                        "--once", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    life = json.loads(r.stdout)["lifetime"]["spec"]
    assert life["draft_tokens"] == c["vllm:spec_decode_num_draft_tokens_total"]
    assert life["accepted"] == c["vllm:spec_decode_num_accepted_tokens_total"]
    assert life["acceptance_rate"] == c["vllm:spec_decode_num_accepted_tokens_total"] / c[
        "vllm:spec_decode_num_draft_tokens_total"]
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "top", "--vllm", server_url, "--once"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "n/a from this source: requests" in r.stdout and "drafted" in r.stdout
