"""``specscope calibrate`` on the real engine: the target's decode-step times without speculation, with the setup
they were measured on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specscope import tiny_models
from specscope.cli import main
from specscope.verdict import load_profile
from specscope.verdict.forward import fit_forward
from tests.conftest import ENGINE_KW

pytestmark = pytest.mark.engine


def test_calibrate_command_writes_a_baseline_with_its_setup(tiny: Any, engines: Any, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    engines.close()  # the command starts its own engine
    out = tmp_path / "baseline.json"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in tiny_models.prompts(6, seed=3)))
    args = ["--batch-sizes", "1,4", "--tokens", "24", "--out", str(out), "--prompts", str(prompts)]
    for key, value in ENGINE_KW.items():
        args += ["--engine-arg", f"{key}={json.dumps(value)}"]
    # The command's entry point in this process (its engine in the suite's in-process layout: it asserts no speed;
    # baselines are timed in vLLM's default layout by test_verdict.py and test_heads.py).
    code = main(["calibrate", str(tiny["target"]), *args])
    r = capsys.readouterr()
    assert code == 0, r.err[-2000:]
    profile = load_profile(out)
    assert [t.batch_size for t in profile.times] == [1, 4]
    assert all(t.steps >= 2 * 22 and 0 < t.mean_s < 1 for t in profile.times)  # 2 rounds of 23 decode steps
    # Each at the context it was measured at (the prompts and half the output), with the rounds' spread.
    assert all(10 < t.context < 24 + 60 and t.context_slope >= 0 and t.spread > 0 for t in profile.times), \
        profile.times
    assert "tokens of context" in r.out
    # The target's forward, timed in the engine's process: a share of each step, at as many tokens as requests.
    assert all(t.forwards >= 2 * 22 and 0 < t.forward_s < t.mean_s and t.forward_tokens == t.batch_size
               for t in profile.times), profile.times
    # Its forwards of every shape (the prompts' too) fit over requests and tokens: a token costs something, and
    # the fit prices each batch size's decode forward near the one timed there.
    fit = fit_forward(profile.forward_moments)
    assert fit is not None and fit[2] > 0, (fit, profile.forward_moments)
    for t in profile.times:
        assert fit[0] + (fit[1] + fit[2]) * t.batch_size == pytest.approx(t.forward_s, rel=0.25), (fit, t)
    setup = profile.setup
    assert setup is not None and setup.model == str(tiny["target"])
    assert setup.dtype == "float32" and setup.device is not None and setup.device.startswith("cpu")
    assert setup.engine_version == "0.32.0" and setup.max_num_seqs and setup.enforce_eager is True
    assert setup.architecture is not None and "layers=4 hidden=128" in setup.architecture
    assert "batch    1:" in r.out and "wrote" in r.out and f"on 6 prompts of {prompts}" in r.out
