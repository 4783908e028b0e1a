"""Driving a vLLM engine to measure it: its decode-step times by batch size (the baseline ``specscope calibrate``
writes) and its output tokens/s with the batch held full (what the verdict's speedups are about)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from specscope.collectors.vllm_engine import traffic_class
from specscope.model import StepProfile, StepTime


def measure_step_times(llm: Any, batch_sizes: Sequence[int], tokens: int = 64, rounds: int = 2,
                       prompts: Sequence[Any] | None = None) -> StepProfile:
    """Run greedy batches of each size for ``tokens`` tokens and return the engine's decode-step times.

    On an engine without speculation this is the baseline that turns a speculative engine's step times into a
    measured cost ratio (``specscope calibrate`` writes it to a file, with the engine's setup). Every request
    generates exactly ``tokens`` tokens, so each batch keeps its size to the end. One short untimed round first
    warms the engine up (a fresh engine's first steps are slower). A decode step's time grows with the context it
    attends over, so ``prompts`` (text or vLLM prompts, taken in turn) should be like the workload's: a baseline
    of short prompts is too fast for long-context traffic, and c then comes out too high.
    """
    from vllm import SamplingParams

    def batch(b: int) -> list[Any]:
        if prompts:
            return [prompts[i % len(prompts)] for i in range(b)]
        return [f"calibration prompt {i}: the quick brown fox" for i in range(b)]

    def run(max_tokens: int) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        for b in batch_sizes:
            llm.generate(batch(b), params, use_tqdm=False)

    run(8)
    before = {t.batch_size: t for t in llm.snapshot().lifetime.step_times.times}
    for _ in range(rounds):
        run(tokens)
    snap = llm.snapshot()
    times = []
    for t in snap.lifetime.step_times.times:
        if t.batch_size not in batch_sizes:
            continue
        old = before.get(t.batch_size)
        steps = t.steps - (old.steps if old else 0)
        if steps > 0:
            seconds = t.steps * t.mean_s - (old.steps * old.mean_s if old else 0.0)
            times.append(StepTime(t.batch_size, steps, seconds / steps))
    return StepProfile(tuple(times), f"measured on {snap.engine.model}", snap.engine.setup)


def steady_throughput(llm: Any, batch: int, seconds: float, prompts: Sequence[Any], tokens: int | Sequence[int] = 96,
                      traffic_classes: Sequence[str | None] | None = None) -> float:
    """Output tokens per second with ``batch`` greedy requests in flight for ``seconds``, each finished request
    replaced by the next of ``prompts`` (in order), as a serving engine with a queue keeps its batch full; the
    requests in flight at the end are aborted. This is the throughput "at batch b" that specscope's verdict is
    about: a fixed batch that drains ends on partial batches, and only under speculation (its requests finish at
    different steps, plain greedy ones together), which would weigh on speculation unfairly.

    A prompt is text or a vLLM prompt (``{"prompt_token_ids": [...]}``); ``tokens`` is every request's output
    length (EOS ignored), or each prompt's; ``traffic_classes``, where given, is each prompt's traffic class.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = getattr(llm, "llm_engine", llm)
    params: dict[int, Any] = {}
    live: set[str] = set()
    added = 0

    def add() -> None:
        nonlocal added
        i = added % len(prompts)
        n = tokens if isinstance(tokens, int) else tokens[i]
        if n not in params:
            params[n] = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                                       output_kind=RequestOutputKind.DELTA)
        rid = f"steady-{id(engine)}-{time.monotonic_ns()}-{added}"
        with traffic_class(traffic_classes[i] if traffic_classes else None):
            engine.add_request(rid, prompts[i], params[n])
        live.add(rid)
        added += 1

    for _ in range(batch):
        add()
    produced, t0 = 0, time.perf_counter()
    now = t0
    while now - t0 < seconds:
        for out in engine.step():
            produced += len(out.outputs[0].token_ids)
            if out.finished:
                live.discard(out.request_id)
                add()
        now = time.perf_counter()
    engine.abort_request(list(live))
    while engine.has_unfinished_requests():
        engine.step()
    return produced / (now - t0)
