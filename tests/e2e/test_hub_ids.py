"""Models named by hub id, from a local Hugging Face cache made in the test (offline), on every instrumented path:
``specscope.LLM``, :func:`specscope.instrument` on a plain ``vllm.LLM``, and ``specscope.AsyncLLM``. Each gets its
model sizes and c from the configs the engine loaded, a tokenizer verdict, and a speedup estimate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import hf_cache

pytestmark = pytest.mark.engine

SCRIPT = r'''
import asyncio, json, sys
import specscope, vllm
from specscope.core import codec
from specscope.verdict import estimate, explain
from vllm import SamplingParams

KW = dict(enforce_eager=True, dtype="float32", max_model_len=512, seed=0)
SPEC = {"method": "draft_model", "model": "specscope/deep01-draft", "num_speculative_tokens": 4}
PROMPTS = ["river stone garden", "engine token draft model", "window signal metric alert"]
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def result(hub):
    snap = hub.snapshot()
    est = estimate(snap)
    return {"snapshot": codec.to_dict(snap), "estimate": None if est is None else explain(est),
            "best_k": None if est is None else est.best_k}


async def run_async(hub):
    from vllm.engine.arg_utils import AsyncEngineArgs
    engine = specscope.AsyncLLM.from_engine_args(
        AsyncEngineArgs(model="specscope/deep01-target", speculative_config=SPEC, **KW), specscope_hub=hub)
    for i, prompt in enumerate(PROMPTS):
        async for _ in engine.generate(prompt, PARAMS, request_id=f"a{i}"):
            pass
    out = result(hub)
    engine.shutdown()
    return out


if __name__ == "__main__":
    out = {}
    llm = specscope.LLM("specscope/deep01-target", specscope_hub=specscope.Hub(), speculative_config=SPEC, **KW)
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    out["LLM"] = result(llm.specscope)
    llm.llm_engine.engine_core.shutdown()
    plain = vllm.LLM("specscope/deep01-target", speculative_config=SPEC, disable_log_stats=False, **KW)
    hub = specscope.instrument(plain, specscope.Hub())
    plain.generate(PROMPTS, PARAMS, use_tqdm=False)
    out["instrument"] = result(hub)
    plain.llm_engine.engine_core.shutdown()
    out["AsyncLLM"] = asyncio.run(run_async(specscope.Hub()))
    print("RESULT " + json.dumps(out))
'''


def test_hub_ids_get_sizes_c_and_an_estimate_on_every_path(tiny: dict[str, Path], engines: Any,
                                                              tmp_path: Path) -> None:
    engines.close()
    env = {**os.environ, **hf_cache(tmp_path / "hf", {"specscope/deep01-target": tiny["deep01-target"],
                                                     "specscope/deep01-draft": tiny["deep01-draft"]})}
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env,
                       cwd=tmp_path)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert r.returncode == 0 and line, r.stderr[-3000:]
    from specscope.core.sizing import model_size

    target = model_size(json.loads((tiny["deep01-target"] / "config.json").read_text()))
    draft = model_size(json.loads((tiny["deep01-draft"] / "config.json").read_text()))
    assert target is not None and draft is not None
    for path, res in json.loads(line[len("RESULT "):]).items():
        snap = res["snapshot"]
        cost = snap["cost_ratio"]
        assert cost is not None, path
        assert cost["value"] == pytest.approx(draft.per_token / target.per_token), path
        assert (cost["target_params"], cost["draft_params"]) == (target.weights, draft.weights), path
        assert snap["engine"]["draft_model"] == "specscope/deep01-draft", path
        assert "layers=12 hidden=512" in snap["engine"]["setup"]["architecture"], path
        assert res["estimate"] is not None and "speculation" in res["estimate"], path
        assert snap["lifetime"]["spec"]["drafts"] > 0, path
    # The start-up tokenizer check read both tokenizers from the cache (specscope.LLM's path).
    assert json.loads(line[len("RESULT "):])["LLM"]["snapshot"]["tokenizer"]["verdict"] == "identical"
