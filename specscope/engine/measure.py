"""Driving a vLLM engine to measure it: its decode-step times by batch size (the baseline ``specscope calibrate``
writes) and its output tokens/s with the batch held full (what the verdict's speedups are about)."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specscope.core.model import StepProfile, StepTime
from specscope.engine.vllm_engine import traffic_class
from specscope.verdict import uncertainty
from specscope.verdict.baseline import merge_profiles
from specscope.verdict.speedup import MIN_TABLE_STEPS

#: The longest contrast context :func:`measure_step_times` calibrates at (tokens a request attends over).
MAX_CONTRAST_CONTEXT = 2048
#: How sure a calibration's median step time must be before :func:`measure_step_times` stops adding rounds (up to
#: ``max_rounds``): its standard error, 1.25 · spread / √rounds, under 3% at every batch size. On a quiet machine
#: (rounds 1.4-3.3% apart) three rounds are enough; on a slow day's (6-21% apart) the price of a plain step moved by
#: 17% with three.
SETTLED = 0.03


def measure_step_times(llm: Any, batch_sizes: Sequence[int], tokens: int = 64, rounds: int = 3,
                       prompts: Sequence[Any] | None = None, contexts: int = 2, round_s: float = 0.5,
                       max_rounds: int | None = None) -> StepProfile:
    """Run greedy batches of each size for ``tokens`` tokens and return the engine's decode-step times.

    On an engine without speculation this is the baseline that turns a speculative engine's step times into a
    measured cost ratio (``specscope calibrate`` writes it to a file, with the engine's setup). Every request
    generates exactly ``tokens`` tokens, so each batch keeps its size to the end. One short untimed round first
    warms the engine up (a fresh engine's first steps are slower).

    A decode step's time grows with the context its requests attend over, so each batch size is timed at two
    contexts (``contexts=1``: one): ``prompts`` (default: short generated ones) and long ones (or short ones, where
    ``prompts`` are long already). Each row keeps the first context's time, the context it was measured at, the
    slope in between (``context_slope``) and, with two rounds or more, the rounds' spread: the verdict prices a
    plain step at the context the live engine runs at. A row's time is the median of its rounds' means, so that
    one round caught in a slow spell of the machine (they last seconds here) does not move the baseline; and a
    round at a batch size generates again until it has run ``round_s`` seconds, so that a model whose step takes a
    millisecond is timed over as long a moment as one whose step takes tens (64 steps of 1.5 ms are a tenth of a
    second: one slow spell is the whole round). With ``max_rounds``, rounds go on after ``rounds`` while they
    disagree (:data:`SETTLED`), the reference prompts alone (they are the rows; the slope comes from the first
    ``rounds``, which timed both sets, scaled to the speed of all the rounds), and the profile's source says how many
    were timed.
    """
    from vllm import SamplingParams

    from specscope.core import intervals

    reference = list(prompts) if prompts else [f"calibration prompt {i}: the quick brown fox" for i in range(64)]
    sets = [reference] + ([_contrast(llm, reference, tokens, max(batch_sizes))] if contexts > 1 else [])

    def run(max_tokens: int, chosen: list[Any], seconds: float = 0.0) -> StepProfile:
        before = llm.snapshot().lifetime.step_times
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        for b in batch_sizes:
            batch, t0 = [chosen[i % len(chosen)] for i in range(b)], time.perf_counter()
            while True:  # once, and again until ``seconds`` have passed
                llm.generate(batch, params, use_tqdm=False)
                if time.perf_counter() - t0 >= seconds:
                    break
        return intervals.since(llm.snapshot().lifetime.step_times, before)

    run(8, reference)
    measured: list[list[StepProfile]] = [[] for _ in sets]
    for _ in range(rounds):
        for i, chosen in enumerate(sets):
            measured[i].append(run(tokens, chosen, round_s))
    while len(measured[0]) < (max_rounds or 0) and not settled(measured[0], batch_sizes):
        measured[0].append(run(tokens, reference, round_s))  # only the reference decides when the rounds settle
    times = sloped_rows(measured[0], measured[1] if len(sets) > 1 else [], batch_sizes)
    snap = llm.snapshot()
    more = f", {len(measured[0])} rounds: they disagreed" if len(measured[0]) > rounds else ""
    return StepProfile(tuple(times), f"measured on {snap.engine.model}{more}", snap.engine.setup,
                       median_moments(measured[0], times))


def sloped_rows(reference: Sequence[StepProfile], contrast: Sequence[StepProfile],
                batch_sizes: Collection[int]) -> list[StepTime]:
    """The rows of ``reference``'s rounds (:func:`median_rows`), each with the slope over context to ``contrast``'s
    rounds (timed at a context far from the reference's) where both were timed: the medians of the rounds that
    timed both sets (the first ``len(contrast)``), scaled to the speed of all the reference rounds."""
    paired = {t.batch_size: t for t in median_rows(reference[:len(contrast)], batch_sizes)} if contrast else {}
    far = {t.batch_size: t for t in median_rows(contrast, batch_sizes)} if contrast else {}
    rows = []
    for t in median_rows(reference, batch_sizes):
        other, near = far.get(t.batch_size), paired.get(t.batch_size)
        if other is not None and near is not None and near.context and other.context and near.mean_s and \
                abs(other.context - near.context) >= 0.5 * max(other.context, near.context):  # far enough apart
            slope = (other.mean_s - near.mean_s) / (other.context - near.context) * t.mean_s / near.mean_s
            t = replace(t, context_slope=max(0.0, slope))
        rows.append(t)
    return rows


def settled(rounds: Sequence[StepProfile], batch_sizes: Collection[int]) -> bool:
    """Whether the median of ``rounds`` is sure enough at every batch size (:data:`SETTLED`); never with one."""
    return len(rounds) > 1 and all(uncertainty.standard_error(t.spread, len(rounds), median=True) <= SETTLED
                                   for t in median_rows(rounds, batch_sizes))


def median_rows(rounds: Sequence[StepProfile], batch_sizes: Collection[int]) -> list[StepTime]:
    """One engine's decode steps at each of ``batch_sizes`` over ``rounds`` (a reading each): the median round's
    mean, so that one round caught in a slow spell of the machine does not move it; steps and context pooled; the
    target's forward at the pooled rounds' forward / step ratio (where timed); and, with two rounds or more, the
    rounds' relative spread (standard deviation / mean) and how many they were."""
    rows = []
    for t in merge_profiles(list(rounds)).times:
        if t.batch_size not in batch_sizes or not t.steps:
            continue
        means = [r.mean_s for m in rounds for r in m.times if r.batch_size == t.batch_size and r.steps]
        mean_s = statistics.median(means)
        spread = statistics.stdev(means) / mean_s if len(means) > 1 and mean_s > 0 else 0.0
        # The forward as the pooled rounds relate it to the step (a steady ratio), at the median round's step.
        forward_s = mean_s * t.forward_s / t.mean_s if t.forwards and t.mean_s > 0 else 0.0
        rows.append(StepTime(t.batch_size, t.steps, mean_s, context=t.context, spread=spread,
                             readings=len(means) if len(means) > 1 else 0, forwards=t.forwards,
                             forward_s=forward_s, forward_tokens=t.forward_tokens if forward_s else 0.0))
    return rows


def median_moments(rounds: Sequence[StepProfile], rows: Sequence[StepTime]) -> tuple[float, ...]:
    """The rounds' forward fit sums pooled, their seconds scaled to the speed of ``rows`` (:func:`median_rows`: the
    median round's step over the pooled rounds' mean step, weighted by steps), so that the forward then is the
    machine's at the moment the rows' steps were."""
    merged = merge_profiles(list(rounds))
    pooled = {t.batch_size: t.mean_s for t in merged.times if t.steps}
    at = [(t.steps * t.mean_s, t.steps * pooled[t.batch_size]) for t in rows if pooled.get(t.batch_size)]
    moments, den = merged.forward_moments, sum(p for _, p in at)
    if not moments or not den:
        return moments
    scale = sum(m for m, _ in at) / den
    return (*moments[:6], *(x * scale for x in moments[6:]))


def _contrast(llm: Any, reference: Sequence[Any], tokens: int, batch: int) -> list[Any]:
    """Prompts whose context is far from ``reference``'s: long ones (up to half the model's length, what the KV
    cache holds for ``batch`` requests and :data:`MAX_CONTRAST_CONTEXT`), or short ones where ``reference`` is long
    already."""
    tokenizer = llm.get_tokenizer()
    lengths = [len(p["prompt_token_ids"]) if isinstance(p, dict) and "prompt_token_ids" in p
               else len(tokenizer.encode(p)) if isinstance(p, str) else 0 for p in reference]
    mean = sum(lengths) / len(lengths) if lengths else 0.0
    config = llm.llm_engine.vllm_config
    room = config.model_config.max_model_len // 2
    blocks, block = config.cache_config.num_gpu_blocks, config.cache_config.block_size
    if blocks and block:
        room = min(room, (blocks - 1) * block // batch - tokens - block)
    long = min(room, MAX_CONTRAST_CONTEXT) - tokens
    if mean >= long / 2:
        return [f"calibration prompt {i}" for i in range(64)]
    unit = tokenizer.encode("the quick brown fox jumps over the lazy dog and runs back again. ",
                            add_special_tokens=False)
    body = (unit * (long // max(1, len(unit)) + 1))[:long]
    return [{"prompt_token_ids": tokenizer.encode(f"{i}:", add_special_tokens=False)[:4] + body} for i in range(64)]


_stopping: list[threading.Thread] = []


def stop_engine(llm: Any) -> None:
    """Stop an engine's processes (``vllm.LLM``, ``LLMEngine`` or ``AsyncLLM``); never raises. On a CPU their exit,
    seconds of the processes waiting on each other, goes on in the background while the caller starts the next
    engine: that one allocates its KV cache only once its own worker process is up (~10 s here), when the old one
    is gone. On a GPU it waits: the next engine sizes its memory from what is free. :func:`wait_stopped` waits for
    the exits still going on."""
    target = getattr(llm, "llm_engine", llm)
    stop = target.shutdown if hasattr(target, "shutdown") else target.engine_core.shutdown

    def quietly() -> None:
        with contextlib.suppress(Exception):  # an interrupted engine may be half gone
            stop()

    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        quietly()
        return
    thread = threading.Thread(target=quietly, name="specscope-engine-stop", daemon=True)
    thread.start()
    _stopping[:] = [t for t in _stopping if t.is_alive()] + [thread]


def wait_stopped(timeout: float = 30.0) -> None:
    """Wait (up to ``timeout`` seconds in all) for the engines :func:`stop_engine` is stopping."""
    deadline = time.monotonic() + timeout
    for thread in list(_stopping):
        thread.join(max(0.0, deadline - time.monotonic()))


@dataclass
class PromptOrder:
    """Which prompt a window runs next when windows must cover a whole prompt list: the list in its order (a
    workload's interleaves its classes), walked on from one window to the next (:meth:`next_window`), every engine of
    a window starting at the same place, and the prompts actually run (:attr:`ran`). Without it each window starts
    again at the list's first prompt."""

    size: int
    #: Where the current window starts.
    start: int = 0
    #: How far the window's furthest engine got.
    reach: int = 0
    #: Indexes of every prompt run so far.
    ran: set[int] = field(default_factory=set)

    def take(self, j: int) -> int:
        """The prompt index of the window's ``j``-th request."""
        i = (self.start + j) % self.size
        self.reach = max(self.reach, j + 1)
        self.ran.add(i)
        return i

    def next_window(self) -> None:
        """Walk on past what the window's engines ran: the next window starts with prompts not yet run."""
        self.start, self.reach = (self.start + self.reach) % self.size, 0


def steady_throughput(llm: Any, batch: int, seconds: float, prompts: Sequence[Any], tokens: int | Sequence[int] = 96,
                      traffic_classes: Sequence[str | None] | None = None, order: PromptOrder | None = None,
                      settle: bool = False, min_finished: int = 0, warm: int = 0) -> float:
    """Output tokens per second with ``batch`` greedy requests in flight for ``seconds``, each finished request
    replaced by the next of ``prompts`` (in order, or in ``order``), as a serving engine with a queue keeps its batch
    full; the requests in flight at the end are aborted. This is the throughput "at batch b" that specscope's
    verdict is about: a fixed batch that drains ends on partial batches, and only under speculation (its requests
    finish at different steps, plain greedy ones together), which would weigh on speculation unfairly.

    A prompt is text or a vLLM prompt (``{"prompt_token_ids": [...]}``); ``tokens`` is every request's output
    length (EOS ignored), or each prompt's; ``traffic_classes``, where given, is each prompt's traffic class.
    With ``settle``, the ``seconds`` count from the step that finished the prefill of the batch's first prompts:
    prefilled together from an empty engine, a transient served traffic does not have (16 prompts of ~490 tokens
    take seconds on this CPU). With ``warm``, they count from the step that finished that many requests (after the
    first prompts' prefill, with ``settle``): the batch's first requests start together and, until they finish, its
    steps decode without the prefills of the requests that replace them, which served traffic's steps carry at the
    rate requests finish (``batch``: each place turned over once). With ``min_finished``, the window also runs
    until that many requests finished in it (``batch``: each place in the batch turned over once, on average), so
    that it holds the prefills of the requests that replace them, as served traffic does: a fixed number of seconds
    can end before any request finishes where steps are slow (a large batch of long prompts, a slow machine), and
    measure decoding alone.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = getattr(llm, "llm_engine", llm)
    params: dict[int, Any] = {}
    live: set[str] = set()
    added = 0

    def add() -> None:
        nonlocal added
        i = order.take(added) if order is not None else added % len(prompts)
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
    first = set(live) if settle else set()
    produced, finished, t0 = 0, 0, time.perf_counter()
    now = t0
    while now - t0 < seconds or first or warm or finished < min_finished:
        for out in engine.step():
            first.discard(out.request_id)
            produced += len(out.outputs[0].token_ids)
            if out.finished:
                live.discard(out.request_id)
                finished += 1
                add()
        now = time.perf_counter()
        if settle and not first:  # the first prompts are in: the count starts after this step
            settle, produced, finished, t0 = False, 0, 0, now
        elif warm and not settle and finished >= warm:  # the batch turned over: the count starts again
            warm, produced, finished, t0 = 0, 0, 0, now
    engine.abort_request(list(live))
    while engine.has_unfinished_requests():
        engine.step()
    return produced / (now - t0)


def serve_until_row(llm: Any, batch: int, window: Callable[[], object], tries: int = 4) -> bool:
    """Serve ``window()`` (one window of traffic held at ``batch``) until ``llm``'s steps at ``batch`` are enough
    for that batch size's row of the K table (:data:`MIN_TABLE_STEPS` decode steps), ``tries`` windows at most;
    whether they are. At batch 16 most steps carry a replacement's prefill: one window may hold too few that decode
    alone, and without its row the advice would carry a smaller batch size's K over it."""
    for _ in range(tries):
        window()
        if llm.snapshot().lifetime.step_times.get(batch, MIN_TABLE_STEPS) is not None:
            return True
    return False
