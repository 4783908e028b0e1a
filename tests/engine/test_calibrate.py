"""The speedup estimate on a real engine: measured against a baseline, it moves with batch size as throughput does.

On this CPU, speculation with a copy draft pays at batch 1 and stops paying at batch 8 (notes §1). Parameter
counts give c = 1 for a copy draft at every batch size; the baseline's step times give the measured c(b).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specscope import Hub
from specscope.diagnostics import by_batch_size, estimate, load_profile
from tests.conftest import ENGINE_KW, greedy, spec_config

pytestmark = pytest.mark.engine

BATCHES = (1, 8)


def throughput(llm: Any, batch: int, tokens: int = 128, rounds: int = 3) -> float:
    """Median generated tokens per second over ``rounds`` greedy runs of ``batch`` requests."""
    prompts = [f"The story number {i} begins with" for i in range(batch)]
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        llm.generate(prompts, greedy(tokens), use_tqdm=False)
        rates.append(batch * tokens / (time.perf_counter() - t0))
    return sorted(rates)[rounds // 2]


def test_estimate_moves_with_batch_size_as_measured_throughput(tiny: Any, engines: Any) -> None:
    import specscope
    from specscope.model import StepProfile

    target = str(tiny["target"])
    plain = engines.get("speedup-plain", lambda: specscope.LLM(target, specscope_hub=Hub(), **ENGINE_KW))
    plain_rate = {b: throughput(plain, b) for b in BATCHES}
    # The baseline is the plain engine's step times during those same runs: whatever else the machine was doing
    # then weighs on the baseline and on the throughput it is compared with alike.
    baseline = StepProfile(plain.snapshot().step_times.times, "the plain engine in this test")
    assert {1, 8} <= {t.batch_size for t in baseline.times}

    spec = engines.get("speedup-copy", lambda: specscope.LLM(
        target, specscope_hub=Hub(), specscope_baseline=baseline, speculative_config=spec_config(tiny, "copy"),
        **ENGINE_KW))
    spec_rate = {b: throughput(spec, b) for b in BATCHES}
    measured = {b: spec_rate[b] / plain_rate[b] for b in BATCHES}
    snap = spec.snapshot()
    est = {e.batch_size: e for e in by_batch_size(snap)}
    print({b: (round(measured[b], 3), round(est[b].expected_speedup, 3)) for b in BATCHES})

    # The premise, on this machine: speculation pays less at batch 8 than at batch 1.
    assert measured[1] > measured[8]
    # The estimate moves the same way, by about as much, and is near the measured speedup at both sizes.
    assert est[1].expected_speedup > est[8].expected_speedup
    assert est[1].expected_speedup / est[8].expected_speedup == pytest.approx(measured[1] / measured[8], rel=0.2)
    for b in BATCHES:
        assert est[b].expected_speedup == pytest.approx(measured[b], rel=0.25), b
        assert f"measured at batch {b}" in est[b].explain()
    # Parameter counts cannot see batch size: a copy draft has c = 1 at every size.
    assert snap.cost_ratio is not None and snap.cost_ratio.value == pytest.approx(1.0)
    by_params = {b: estimate(snap, cost=snap.cost_ratio, batch_size=b) for b in BATCHES}
    assert by_params[1] is not None and by_params[8] is not None
    assert by_params[1].expected_speedup == by_params[8].expected_speedup <= 1.0


def test_calibrate_command_writes_a_baseline(tiny: Any, engines: Any, tmp_path: Path) -> None:
    engines.close()  # the command starts its own engine
    out = tmp_path / "baseline.json"
    args = ["--batch-sizes", "1,4", "--tokens", "24", "--out", str(out)]
    for key, value in ENGINE_KW.items():
        args += ["--engine-arg", f"{key}={json.dumps(value)}"]
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "calibrate", str(tiny["target"]), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    profile = load_profile(out)
    assert [t.batch_size for t in profile.times] == [1, 4]
    assert all(t.steps >= 2 * 22 and 0 < t.mean_s < 1 for t in profile.times)  # 2 rounds of 23 decode steps
    assert str(tiny["target"]) in profile.source
    assert "batch    1:" in r.stdout and "wrote" in r.stdout
