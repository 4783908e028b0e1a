"""Shared helpers for the benchmarks: timing by repeated medians, and writing results."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def per_call_ns(fn: Callable[[], Any], calls: int, repeats: int = 7) -> float:
    """Median over ``repeats`` of the mean nanoseconds per call of ``fn``."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls)
    return statistics.median(samples)


def paired_ns(baseline: Callable[[], Any], ours: Callable[[], Any], calls: int,
              repeats: int = 15) -> tuple[float, float, float]:
    """Mean nanoseconds per call of ``baseline`` and of ``ours``, timed in alternating rounds (this machine's speed
    drifts by tens of percent over seconds); returns both medians and the median of the rounds' ratios."""
    a, b, ratios = [], [], []
    for _ in range(repeats):
        ns = []
        for fn in (baseline, ours):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            ns.append((time.perf_counter_ns() - t0) / calls)
        a.append(ns[0])
        b.append(ns[1])
        ratios.append(ns[1] / ns[0])
    return statistics.median(a), statistics.median(b), statistics.median(ratios)


ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    """The output of ``git ARGS`` in the repository, or None where git is missing or this is not a repository."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout


def provenance() -> dict[str, Any]:
    """The code a result comes from: ``commit`` (HEAD, or "unknown") and ``dirty`` (whether the tree has changes
    outside benchmarks/results/; None where it cannot be told)."""
    commit, status = _git("rev-parse", "HEAD"), _git("status", "--porcelain")
    if commit is None or status is None:
        return {"commit": "unknown", "dirty": None}
    paths = [p for line in status.splitlines() for p in line[3:].split(" -> ")]
    return {"commit": commit.strip(),
            "dirty": any(not p.strip('"').startswith("benchmarks/results/") for p in paths)}


def write(name: str, result: dict[str, Any], *, seed: int | None = None, judged: str = "as-run") -> None:
    """Print ``result`` and save it as benchmarks/results/NAME.json with the machine it ran on, the code that judged
    it (``commit``, ``dirty``), the UTC ``date``, the ``seed`` (when given) and ``judged``: "as-run" for a
    measurement, else what judged it again (a replay: "replay of X.json by <commit>"). A replay never replaces an
    as-run file (one that says so, or from before ``judged`` was recorded): it raises FileExistsError."""
    path = RESULTS / f"{name}.json"
    if judged != "as-run" and path.is_file() and json.loads(path.read_text()).get("judged", "as-run") == "as-run":
        raise FileExistsError(f"{path} holds as-run results; write the replay ({judged}) under another name")
    result = {"benchmark": name, "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
              "python": platform.python_version(), **result, **provenance(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              **({"seed": seed} if seed is not None else {}), "judged": judged}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def as_run_results(*patterns: str) -> list[tuple[str, dict[str, Any]]]:
    """The results files matching ``patterns`` whose pairs were measured as run: neither a replay nor the snapshots
    saved beside them. Each one's stem and document, by pattern, then name."""
    out = []
    for pattern in patterns:
        for path in sorted(RESULTS.glob(pattern)):
            if path.name.endswith(".snapshot.json"):
                continue
            doc = json.loads(path.read_text())
            if doc.get("judged", "as-run") == "as-run" and "pairs" in doc:
                out.append((path.stem, doc))
    return out


def serve(target: Path, spec: dict[str, Any] | None, engine: list[str], log: Path,
          env: dict[str, str] | None = None) -> tuple[Any, str]:
    """A ``vllm serve`` of ``target`` with specscope's plugin and middleware (the suite's launcher), once /health
    answers: the process and its URL. With ``spec``, per-request acceptance too (vLLM refuses it without)."""
    from tests.conftest import free_port
    from tests.e2e.test_server import start_server

    port = free_port()
    cmd = ["timeout", "1800", sys.executable, "-m", "tests.e2e.vllm_serve", "--model", str(target),
           "--middleware", "specscope.engine.middleware.SpecscopeMiddleware", "--host", "127.0.0.1",
           "--port", str(port), *engine,
           *(["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "summary"]
             if spec else [])]
    root = str(Path(__file__).resolve().parent.parent)
    full_env = {**os.environ, "VLLM_PLUGINS": "specscope", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONPATH": root,
                **(env or {})}
    return start_server(cmd, full_env, log), f"http://127.0.0.1:{port}"


def reap(seen: dict[int, Any], name: Callable[[int, Any], str], wait_s: float = 30.0) -> list[str]:
    """After a server was told to stop: wait up to ``wait_s`` in all for each process it started (``seen``: pid ->
    ``psutil.Process``), kill those still running, and return their ``name(pid, process)``."""
    import psutil

    left = []
    deadline = time.monotonic() + wait_s
    for pid, p in seen.items():
        with contextlib.suppress(psutil.Error):
            p.wait(max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(name(pid, p))
                p.kill()
    return left
