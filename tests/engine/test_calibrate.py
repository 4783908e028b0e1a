"""``specscope calibrate`` on the real engine: the target's decode-step times without speculation, with the setup
they were measured on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specscope import tiny_models
from specscope.verdict import load_profile
from tests.conftest import ENGINE_KW, shutdown

pytestmark = pytest.mark.engine


def test_calibrate_command_writes_a_baseline_with_its_setup(tiny: Any, engines: Any, tmp_path: Path) -> None:
    engines.close()  # the command starts its own engine
    out = tmp_path / "baseline.json"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in tiny_models.prompts(6, seed=3)))
    args = ["--batch-sizes", "1,4", "--tokens", "24", "--out", str(out), "--prompts", str(prompts)]
    for key, value in ENGINE_KW.items():
        args += ["--engine-arg", f"{key}={json.dumps(value)}"]
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "calibrate", str(tiny["target"]), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    profile = load_profile(out)
    assert [t.batch_size for t in profile.times] == [1, 4]
    assert all(t.steps >= 2 * 22 and 0 < t.mean_s < 1 for t in profile.times)  # 2 rounds of 23 decode steps
    setup = profile.setup
    assert setup is not None and setup.model == str(tiny["target"])
    assert setup.dtype == "float32" and setup.device is not None and setup.device.startswith("cpu")
    assert setup.engine_version == "0.32.0" and setup.max_num_seqs and setup.enforce_eager is True
    assert setup.architecture is not None and "layers=4 hidden=128" in setup.architecture
    assert "batch    1:" in r.stdout and "wrote" in r.stdout and f"on 6 prompts of {prompts}" in r.stdout


def test_a_baseline_of_long_prompts_times_slower_steps_than_one_of_short_prompts(tiny: Any, engines: Any) -> None:
    """A decode step attends over the whole context: calibrated on short prompts, the baseline is too fast for a
    workload of long ones (and c comes out too high), which is why calibrate takes the workload's prompts."""
    import specscope
    from specscope.measure import measure_step_times

    engines.close()
    llm = specscope.LLM(str(tiny["deep01-target"]), specscope_hub=specscope.Hub(),
                        **{**ENGINE_KW, "max_model_len": 1024})
    try:
        long = [" ".join([p] * 12) for p in tiny_models.prompts(16, seed=5)]  # ~300-600 tokens each
        short = measure_step_times(llm, (16,), tokens=32, rounds=1).at(16)
        longer = measure_step_times(llm, (16,), tokens=32, rounds=1, prompts=long).at(16)
    finally:
        shutdown(llm)
    assert short is not None and longer is not None
    print(f"batch 16: {1e3 * short:.1f} ms a step on short prompts, {1e3 * longer:.1f} ms on long ones")
    assert longer > 1.15 * short
