"""From "this class is weak" to the draft that fixes it, end to end on real engines (issue 29 item 4).

1. The tiny target with its 10%-noise draft (K = 4): one offline pass over 800 prompts tells the 40% the draft
   predicts worst ("hard") from the quarter it predicts best ("easy"); a quarter of the hard ones are held out,
   the rest served.
2. ``vllm serve`` with the draft, capture on for the weak classes (``SPECSCOPE_CAPTURE_DIR``; classes ``weak``):
   six rounds of traffic (classes in the operator's header, ``SPECSCOPE_CLASS_HEADER``), each half the easy prompts
   and a sixth of the served hard ones, so that the engine-wide acceptance stays above the line while the hard class
   is under it:
   ``SpecscopeWeakDraftForClass`` fires for ``hard``, and the hard requests are captured as training rows.
3. ``examples/finetune_draft.py``: the draft distilled from the target on the captured rows of class ``hard``
   (plain PyTorch; its defaults).
4. ``specscope evaluate`` of the old and the new draft on the held-out hard prompts and the easy ones: the ranking,
   and each class's acceptance under each draft.
5. ``vllm serve`` with the new draft, the held-out hard and the easy traffic: the class alert no longer fires.

Run: python benchmarks/bench_weak_class_loop.py
Results: benchmarks/results/weak_class_loop.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import httpx

from benchmarks._common import serve, write
from specscope import tiny_models
from specscope.core import codec
from tests.e2e.test_server import stop

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 48
PROMPTS = tiny_models.prompts(800, seed=71)
#: Rounds of served traffic: each the half of the easy prompts and a sixth of the served hard ones.
ROUNDS = 6
#: The operator's class header (``SPECSCOPE_CLASS_HEADER``), which the traffic carries as a gateway would set it.
CLASS_HEADER = "X-Tenant"
ENGINE = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "512"]


def split(models: dict[str, Path]) -> tuple[list[str], list[str]]:
    """(easy, hard) prompts of the 10%-noise draft, from one greedy pass (vLLM's own per-request acceptance): the
    quarter it predicts best, and the 40% it predicts worst."""
    from vllm import SamplingParams

    import specscope
    from specscope.engine import vllm_stats
    from specscope.engine.measure import stop_engine

    llm = specscope.LLM(str(models["target"]), specscope_hub=specscope.Hub(), enforce_eager=True,
                        dtype="float32", max_model_len=512, seed=0,
                        speculative_config={"method": "draft_model", "model": str(models["noise10"]),
                                            "num_speculative_tokens": 4})
    try:
        outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True),
                               use_tqdm=False)
    finally:
        stop_engine(llm)
    rate = {}
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        steps = vllm_stats.per_step_counts(out.outputs[0].spec_decode_metrics)
        rate[prompt] = sum(steps[0]) / max(1, sum(steps[1])) if steps else 0.0
    order = sorted(PROMPTS, key=rate.__getitem__)
    return order[-len(order) // 4:], order[:len(order) * 2 // 5]


def spec(draft: Path) -> dict[str, Any]:
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}


def send(url: str, traffic: list[tuple[str, str]]) -> None:
    """Each (prompt, class) as a greedy completion, eight at a time, the class in the operator's header (a gateway
    sets it; capture never writes a class a client claims in its baggage unless told so)."""
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]

    def one(item: tuple[str, str]) -> None:
        prompt, cls = item
        httpx.post(f"{url}/v1/completions", headers={CLASS_HEADER: cls}, timeout=600,
                   json={"model": model, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0,
                         "ignore_eos": True}).raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, traffic))


def alerts(url: str) -> dict[str, Any]:
    """The server's snapshot read as ``specscope top`` reads it, and the rules over it: which fire, and each class's
    window acceptance."""
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import Thresholds

    snap = codec.from_dict(httpx.get(f"{url}/specscope/snapshot", timeout=30).json())
    evaluator = Evaluator(on_error=lambda *_: None, thresholds=Thresholds(weak_draft_for_s=0))
    firing = sorted({a.rule + (f"[{dict(a.labels)['traffic_class']}]" if "traffic_class" in dict(a.labels) else "")
                     for a in evaluator.evaluate(snap) if a.state == "firing"})
    engine = snap.window.spec
    return {"firing": firing, "engine_acceptance": round(engine.acceptance_rate, 3) if engine and
            engine.acceptance_rate is not None else None,
            "classes": {c.name: {"acceptance": round(c.window.acceptance_rate, 3)
                                 if c.window.acceptance_rate is not None else None, "requests": c.window.requests}
                        for c in snap.classes},
            "capture": None if snap.capture is None else {"rows": snap.capture.rows, "bytes": snap.capture.bytes,
                                                          "weak_now": list(snap.capture.weak_now)}}


def main() -> None:
    models = tiny_models.build()
    t0 = time.monotonic()
    easy, hard = split(models)
    held_out = hard[::4]
    served = [p for i, p in enumerate(hard) if i % 4]
    result: dict[str, Any] = {"prompts": {"easy": len(easy), "hard_served": len(served), "hard_held_out":
                                          len(held_out)}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        captured = root / "capture"
        proc, url = serve(models["target"], spec(models["noise10"]), ENGINE, root / "before.log",
                          {"SPECSCOPE_CAPTURE_DIR": str(captured), "SPECSCOPE_CAPTURE_CLASSES": "weak",
                           "SPECSCOPE_CLASS_HEADER": CLASS_HEADER})
        try:
            for part in range(ROUNDS):
                send(url, [(p, "easy") for p in easy[part % 2::2]] + [(p, "hard") for p in served[part::ROUNDS]])
                time.sleep(1.5)  # capture reads the weak classes from the window once a second
            result["served_before"] = alerts(url)
        finally:
            stop(proc)
        rows = [json.loads(line) for f in captured.glob("*.jsonl") for line in f.read_text().splitlines()]
        result["captured_rows"] = {"rows": len(rows), "classes": sorted({r["class"] for r in rows})}

        new = root / "noise10-hard"
        tune = subprocess.run([sys.executable, str(ROOT / "examples" / "finetune_draft.py"), str(models["noise10"]),
                               str(captured), "--target", str(models["target"]), "--class", "hard", "-o", str(new)],
                              capture_output=True, text=True,
                              check=True)
        result["finetune"] = json.loads(tune.stdout.strip().splitlines()[-1])
        result["finetune"].pop("output")

        workload = root / "held-out.jsonl"
        workload.write_text("".join(json.dumps({"prompt": p, "class": c}) + "\n"
                                    for p, c in [(p, "hard") for p in held_out] + [(p, "easy") for p in easy]))
        engine_args = [a for key, value in {"enforce_eager": True, "dtype": "float32", "max_model_len": 512,
                                            "seed": 0}.items() for a in ("--engine-arg", f"{key}={json.dumps(value)}")]
        report = root / "evaluate.json"
        subprocess.run([sys.executable, "-m", "specscope.cli", "evaluate", str(models["target"]),
                        "--draft", str(models["noise10"]), "--draft", str(new), "--k", "4", "--batch-sizes", "1,8",
                        "--rounds", "1", "--window-s", "4", "--max-tokens", str(TOKENS), "--prompts", str(workload),
                        "--json", str(report), *engine_args], capture_output=True, text=True, check=True)
        doc = json.loads(report.read_text())
        names = {str(models["noise10"]): "noise10", str(new): "noise10-hard"}
        result["evaluate"] = {
            "ranking": [names[n] for n in doc["ranking"]],
            "candidates": {names[c["name"]]: {
                "acceptance_by_class": {cls: round(a["acceptance"], 3)
                                        for cls, a in c["by_k"]["4"]["by_class"].items()},
                "speedup": {b: cell["speedup"] for b, cell in c["by_k"]["4"]["batch"].items()}}
                for c in doc["candidates"]}}

        proc, url = serve(models["target"], spec(new), ENGINE, root / "after.log",
                          {"SPECSCOPE_CLASS_HEADER": CLASS_HEADER})
        try:
            send(url, [(p, "easy") for p in easy] + [(p, "hard") for p in held_out])
            time.sleep(1.0)
            result["served_after"] = alerts(url)
        finally:
            stop(proc)
    result["minutes"] = round((time.monotonic() - t0) / 60, 1)
    write("weak_class_loop", {
        "workload": f"tiny target, 10%-noise draft, K=4, greedy, {TOKENS} tokens a request; hard prompts split in "
                    "two: one half served (and captured), the other held out for evaluate and the second server",
        **result})


if __name__ == "__main__":
    main()
