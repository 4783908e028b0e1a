"""The deep family's engines as the timed modules (test_heads.py, test_verdict.py) run them: their settings, the
plain target they share and the throughput of a run."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from specscope import Hub
from tests.conftest import ENGINE_KW, greedy

DEEP = {**ENGINE_KW, "max_model_len": 1024}


def run(llm: Any, batches: list[list[str]], tokens: int = 64) -> float:
    """Output tokens per second over ``batches`` (each one generate)."""
    t0 = time.perf_counter()
    for prompts in batches:
        llm.generate(prompts, greedy(tokens), use_tqdm=False)
    return sum(len(p) for p in batches) * tokens / (time.perf_counter() - t0)


def plain_target(engines: Any, tiny: dict[str, Path], target: str) -> Any:
    """The plain ``target`` from the session's pool (one engine alive at a time), started in the layout of the module
    that asks first: the EAGLE-3 and EAGLE-1 heads share deep01's, which test_verdict.py, run next, takes over."""
    import specscope

    return engines.get(f"{target} plain, {DEEP}",
                       lambda: specscope.LLM(str(tiny[target]), specscope_hub=Hub(), **DEEP))


def together(first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
    """Two engines started at once: in vLLM's default layout their processes' imports and model loads overlap (22 s
    for two deep01 engines on 2 cores, 28 s one after the other). Never while an engine is timed."""
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(second)
        one = first()
        return one, started.result()


