"""The command line: one clear line and exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES


def specscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specscope.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_bad_input_is_one_line_and_exit_2() -> None:
    for args in ([], ["no-such-command"], ["models", "--bogus"]):
        r = specscope(*args)
        assert r.returncode == 2, args
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("specscope: error: ")
        assert "Traceback" not in r.stderr


def test_version_and_models(tiny: Any) -> None:
    r = specscope("--version")
    assert r.returncode == 0 and r.stdout.startswith("specscope ")
    r = specscope("models", "--json")
    assert r.returncode == 0, r.stderr
    paths = json.loads(r.stdout)
    assert paths == {k: str(v) for k, v in tiny.items()}
    assert all((Path(p) / "config.json").is_file() for p in paths.values())


def test_check_export_good_and_bad_configuration() -> None:
    import os
    import socket

    r = subprocess.run([sys.executable, "-m", "specscope.cli", "check-export", "--prometheus-port", "0", "--otlp"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret"})
    assert r.returncode == 0, r.stderr
    assert "otlp: http/protobuf to http://localhost:4318 (1 headers)" in r.stdout
    assert "s3cret" not in r.stdout + r.stderr  # secrets never printed
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cases = [
            (["--otlp-protocol", "http/json"], {}, "unsupported OTLP protocol 'http/json'"),
            (["--otlp-endpoint", "otel:4317"], {}, "malformed OTLP endpoint"),
            (["--prometheus-port", str(port)], {}, f"cannot listen on 127.0.0.1:{port}: address in use"),
            ([], {"SPECSCOPE_PROMETHEUS_PORT": "nine"}, "SPECSCOPE_PROMETHEUS_PORT must be a port number"),
            ([], {"SPECSCOPE_OTLP": "maybe"}, "SPECSCOPE_OTLP must be 1"),
        ]
        for args, env, message in cases:
            r = subprocess.run([sys.executable, "-m", "specscope.cli", "check-export", *args], capture_output=True,
                               text=True, timeout=60, env={**os.environ, **env})
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert r.stderr.strip() == f"specscope: error: {message}" or (
                r.stderr.startswith("specscope: error: ") and message in r.stderr and r.stderr.count("\n") == 1)


GLOBAL_PROVIDERS = """
import json
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from specscope.export import exports
from specscope.state.hub import Hub

reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))  # what a distro or the application sets up
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(tracer_provider)
hub = Hub()
started = exports.from_env(hub, env={"SPECSCOPE_OTLP": "global"})
hub.requests.record("r1", prompt_tokens=5, generation_tokens=7, e2e_s=0.5)
hub.wait_idle()
names = [m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
started.close()
print(json.dumps({"problems": started.problems, "metrics": names,
                  "spans": [dict(s.attributes) for s in spans.get_finished_spans()]}))
"""


def test_specscope_otlp_global_exports_through_the_processs_providers() -> None:
    r = subprocess.run([sys.executable, "-c", GLOBAL_PROVIDERS], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["problems"] == []
    assert "gen_ai.server.request.duration" in got["metrics"]  # the request reached the global meter provider
    (span,) = got["spans"]
    assert span["gen_ai.response.id"] == "r1" and span["gen_ai.usage.output_tokens"] == 7


def test_exports_from_env_start_what_is_asked_and_skip_bad_settings(tmp_path: Path) -> None:
    from specscope.core.model import TokenizerStatus
    from specscope.export import exports
    from specscope.state.hub import Hub

    hub = Hub()
    hub.set_tokenizer(TokenizerStatus("mismatch"))
    jsonl = tmp_path / "alerts.jsonl"
    started = exports.from_env(hub, {"SPECSCOPE_PROMETHEUS_PORT": "0", "SPECSCOPE_ALERTS": "1",
                                     "SPECSCOPE_ALERTS_JSONL": str(jsonl)})
    try:
        assert started.endpoint is not None and started.alerts is not None and started.otel is None
        started.alerts.evaluator.evaluate()
        assert json.loads(jsonl.read_text().splitlines()[0])["rule"] == "SpecscopeTokenizerMismatch"
    finally:
        started.close()
    (tmp_path / "bad.json").write_text('{"fragmentation": 7}')
    skipped = exports.from_env(hub, {"SPECSCOPE_PROMETHEUS_PORT": "0", "SPECSCOPE_ALERTS": "1",
                                     "SPECSCOPE_ALERT_THRESHOLDS": str(tmp_path / "bad.json")})
    assert skipped.endpoint is None and skipped.alerts is None  # nothing half-started
    assert "fraction between 0 and 1" in skipped.problems[0]
    assert dict(hub.snapshot().health.errors)["export config"] == 1


def test_rules_command_bad_thresholds_are_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text('{"kv_usage": "high"}')
    for args in (["--thresholds", str(tmp_path / "t.json")], ["--set", "weak_draft_acceptance=x"],
                 ["--set", "nonsense=0.1"], ["--thresholds", str(tmp_path / "missing.yml")]):
        r = subprocess.run([sys.executable, "-m", "specscope.cli", "rules", *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and r.stderr.startswith("specscope: error: ") and r.stderr.count("\n") == 1, args
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "rules", "--set", "weak_draft_acceptance=0.4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "engine:specscope_spec_decode_acceptance_rate:rate1m < 0.4" in r.stdout


def test_calibrate_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    for args in (["--batch-sizes", "0,8"], ["--batch-sizes", "a"], ["--tokens", "1"], ["--max-rounds", "0"],
                 ["--engine-arg", "novalue"], ["--engine-arg", 'speculative_config={"method": "ngram"}']):
        r = specscope("calibrate", str(tmp_path), *args)
        assert r.returncode == 2, args
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("specscope: error: "), r.stderr


def test_top_bad_input_and_unreachable_targets(tmp_path: Path) -> None:
    for args in (["top"], ["top", "--url", "x", "--replay", "f"], ["top", "--url", "x", "--interval", "0"],
                 ["top", "--url", "x", "--json"], ["top", "--replay", str(tmp_path / "missing.jsonl")]):
        r = specscope(*args)
        assert r.returncode == 2, args
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("specscope: error: "), r.stderr
    r = specscope("top", "--url", "http://127.0.0.1:9", "--once", "--timeout", "0.5")
    assert r.returncode == 1 and "Connection refused" in r.stderr and "Traceback" not in r.stderr


def test_top_once_replays_a_recording(tmp_path: Path) -> None:
    rec = str(FIXTURES / "demo-recording.jsonl.gz")
    r = specscope("top", "--replay", rec, "--once", "--json")
    assert r.returncode == 0, r.stderr
    docs = json.loads(r.stdout)
    weak = docs["weak draft (f=0.1)"]["lifetime"]["spec"]
    assert weak["acceptance_rate"] < 0.3 and weak["drafts"] > 0
    demo = tmp_path / "demo-thresholds.json"  # the demo's short waits, as when it was recorded
    demo.write_text(json.dumps({"weak_draft_min_draft_tokens": 100, "weak_draft_for_s": 3,
                                "keep_firing_for_s": 600}))
    r = specscope("top", "--replay", rec, "--once", "--window", "10", "--thresholds", str(demo))
    assert r.returncode == 0, r.stderr
    weak_part = r.stdout.split("== weak draft")[1]
    assert "alert firing SpecscopeWeakDraft" in weak_part
    assert "alert firing SpecscopeWeakDraft" not in r.stdout.split("== good draft")[1].split("== weak")[0]
