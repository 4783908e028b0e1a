"""The command line: one clear line and exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


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
        ]
        for args, env, message in cases:
            r = subprocess.run([sys.executable, "-m", "specscope.cli", "check-export", *args], capture_output=True,
                               text=True, timeout=60, env={**os.environ, **env})
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert r.stderr.strip() == f"specscope: error: {message}" or (
                r.stderr.startswith("specscope: error: ") and message in r.stderr and r.stderr.count("\n") == 1)
