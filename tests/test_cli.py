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
