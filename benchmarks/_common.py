"""Shared helpers for the benchmarks: timing by repeated medians, and writing results."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
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


def write(name: str, result: dict[str, Any]) -> None:
    """Print ``result`` and save it as benchmarks/results/NAME.json with the machine it ran on."""
    result = {"benchmark": name, "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
              "python": platform.python_version(), **result}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
