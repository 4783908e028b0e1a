"""Instrumented vLLM engines: ``specscope.LLM``, ``specscope.AsyncLLM`` and :func:`instrument`.

``specscope.LLM`` is ``vllm.LLM`` with the same arguments and return values, plus a ``specscope`` attribute
(the :class:`~specscope.hub.Hub` it feeds) and :meth:`LLM.snapshot`. It turns on what the numbers need: vLLM's
stat collection and, when speculation is configured, per-request speculative metrics (``detailed``: per step,
for acceptance by output position). When the caller did not
ask for vLLM's own stat logging, vLLM's log-line and Prometheus loggers are left out so nothing is paid for
them. :func:`instrument` attaches the same recording to an engine created elsewhere (``vllm.LLM``,
``LLMEngine`` or ``AsyncLLM``); :func:`uninstrument` removes it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import vllm
from vllm.v1.engine.async_llm import AsyncLLM as _VllmAsyncLLM

from specscope import classes
from specscope.collectors import gpu_source, vllm_hook, vllm_reader
from specscope.collectors.vllm_logger import SpecscopeStatLogger
from specscope.hub import Hub, default_hub
from specscope.model import Snapshot, StepProfile, StepTime

_STATE = "_specscope_state"


class SpecscopeError(RuntimeError):
    """specscope cannot instrument this engine as asked."""


def _record_output(hub: Hub, output: Any) -> None:
    """Record a finished output; never raises into the engine's loop."""
    try:
        if output.finished:
            fields = vllm_reader.output_fields(output)
            operation, cls = vllm_hook.OPERATION.get(), vllm_hook.TRAFFIC_CLASS.get()
            if operation:
                fields["operation"] = operation
            if cls:
                fields["traffic_class"] = cls
            hub.requests.record(str(output.request_id), **fields)
            for completion in getattr(output, "outputs", None) or ():
                steps = vllm_reader.per_step_counts(getattr(completion, "spec_decode_metrics", None))
                if steps is not None:
                    hub.requests.record_positions(*steps)
    except Exception as exc:
        hub.health.count_error("request output", exc)


def instrument(engine: Any, hub: Hub | None = None, *, keep_vllm_loggers: bool | None = None) -> Hub:
    """Record ``engine``'s steps and finished requests into ``hub`` (default: the process-wide hub).

    ``engine`` is a ``vllm.LLM``, an ``LLMEngine`` or an ``AsyncLLM`` created with stat logging on (the
    default, except for ``vllm.LLM``, which needs ``disable_log_stats=False``). With
    ``keep_vllm_loggers=False`` vLLM's own log-line and Prometheus loggers are removed (default: kept, or as the
    engine's earlier instrumentation left them). Instrumenting an engine again moves it to ``hub`` (a
    ``specscope.LLM``'s ``specscope`` attribute and ``snapshot()`` follow).
    """
    hub = hub or default_hub()
    target = getattr(engine, "llm_engine", engine)
    earlier = getattr(target, _STATE, None)
    if keep_vllm_loggers is None:
        keep_vllm_loggers = earlier is None or not earlier[2]
    if earlier is not None:
        uninstrument(target)
    manager = getattr(target, "logger_manager", None)
    if manager is None:
        raise SpecscopeError(
            "this engine collects no statistics: create it with disable_log_stats=False "
            "(specscope.LLM and specscope.AsyncLLM do this for you)"
        )
    others = [lg for lg in manager.stat_loggers if not isinstance(lg, SpecscopeStatLogger)]
    ours = [lg for lg in manager.stat_loggers if isinstance(lg, SpecscopeStatLogger) and lg.hub is hub]
    stat_logger = ours[0] if ours else SpecscopeStatLogger.bound_to(hub)(target.vllm_config, manager.engine_indexes)
    removed = [] if keep_vllm_loggers else others
    manager.stat_loggers[:] = [*(others if keep_vllm_loggers else []), stat_logger]
    stat_logger.log_engine_initialized()
    gpu_source.attach(hub)
    if vllm_hook.installed():  # the stat logger's records are complete: nothing to join
        setattr(target, _STATE, (hub, stat_logger, removed, None))
    else:
        _record_outputs(target, hub, stat_logger, removed)
    if isinstance(getattr(engine, "specscope", None), Hub):
        engine.specscope = hub
    return hub


def _record_outputs(target: Any, hub: Hub, stat_logger: Any, removed: list[Any]) -> None:
    """Where vLLM cannot be hooked: join the engine's outputs (speculative numbers, front-end TTFT) as a
    second part of each request record."""
    hub.requests.expect_parts(2)
    if isinstance(target, _VllmAsyncLLM):
        original: Callable[..., Any] = target.generate

        async def generate(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            async for out in original(*args, **kwargs):
                _record_output(hub, out)
                yield out

        target.generate = generate  # type: ignore[method-assign]
        patched = "generate"
    else:
        step = target.step

        def instrumented_step() -> list[Any]:
            outputs = step()
            for out in outputs:
                _record_output(hub, out)
            return outputs

        target.step = instrumented_step
        patched = "step"
    setattr(target, _STATE, (hub, stat_logger, removed, patched))


def uninstrument(engine: Any) -> None:
    """Undo :func:`instrument`: restore the engine's method and loggers."""
    target = getattr(engine, "llm_engine", engine)
    state = getattr(target, _STATE, None)
    if state is None:
        return
    _hub, stat_logger, removed, patched = state
    stat_logger.flush()  # the steps it holds go to its hub
    if patched is not None:
        target.__dict__.pop(patched, None)
    manager = target.logger_manager
    manager.stat_loggers[:] = [lg for lg in manager.stat_loggers if lg is not stat_logger] + removed
    setattr(target, _STATE, None)


def _wants_speculation(kwargs: dict[str, Any]) -> bool:
    return bool(kwargs.get("speculative_config") or kwargs.get("spec_method") or kwargs.get("spec_model"))


def prepare_llm_kwargs(kwargs: dict[str, Any]) -> bool:
    """Turn on what recording needs in ``vllm.LLM``'s arguments (statistics; per-request speculative metrics
    when speculating); returns whether vLLM's own loggers stay (asked for with ``disable_log_stats=False``)."""
    keep_vllm_loggers = kwargs.get("disable_log_stats") is False
    kwargs["disable_log_stats"] = False
    if _wants_speculation(kwargs) and kwargs.get("per_request_spec_decode_metrics") is None:
        kwargs["per_request_spec_decode_metrics"] = "detailed"
    return keep_vllm_loggers


def prepare_async_llm(vllm_config: Any, kwargs: dict[str, Any], hub: Hub) -> None:
    """Turn on per-request speculative metrics in ``AsyncLLM``'s config and add the hub's stat logger."""
    obs = vllm_config.observability_config
    if vllm_config.speculative_config is not None and obs.per_request_spec_decode_metrics == "none":
        obs.per_request_spec_decode_metrics = "detailed"
    kwargs["stat_loggers"] = [*(kwargs.get("stat_loggers") or []), SpecscopeStatLogger.bound_to(hub)]


def check_tokenizers(target: str, spec: Any, hub: Hub) -> None:
    """Before a draft-model engine starts: compare the tokenizers, log a mismatch, record the verdict."""
    from specscope.tokenizer_check import record_verdict

    if not isinstance(spec, dict) or spec.get("method", "draft_model") != "draft_model" or not spec.get("model"):
        return
    record_verdict(target, str(spec["model"]), hub)


class LLM(vllm.LLM):
    """``vllm.LLM`` that records per-request acceptance, KV-cache and GPU memory into a hub.

    Takes every ``vllm.LLM`` argument, plus ``specscope_hub`` (default: the process-wide hub) and
    ``specscope_baseline``: the target's step times without speculation (a file written by ``specscope
    calibrate``, or a :class:`~specscope.model.StepProfile`), which makes the speedup estimate measured. For
    draft-model speculation the two tokenizers are compared first (:mod:`specscope.tokenizer_check`).
    ``generate`` and ``chat`` take ``specscope_class``: the traffic class of the call's requests (acceptance is
    shown per class; a label of :mod:`specscope.classes`' safe characters, ValueError otherwise).
    """

    def __init__(self, model: str, *, specscope_hub: Hub | None = None,
                 specscope_baseline: str | Path | StepProfile | None = None, **kwargs: Any) -> None:
        hub = specscope_hub or default_hub()
        if specscope_baseline is not None:
            from specscope.verdict import load_profile

            hub.set_baseline(specscope_baseline if isinstance(specscope_baseline, StepProfile)
                             else load_profile(specscope_baseline))
        check_tokenizers(kwargs.get("tokenizer") or model, kwargs.get("speculative_config"), hub)
        keep_vllm_loggers = prepare_llm_kwargs(kwargs)
        super().__init__(model, **kwargs)
        self.specscope: Hub = instrument(self, hub, keep_vllm_loggers=keep_vllm_loggers)

    def generate(self, *args: Any, specscope_class: str | None = None, **kwargs: Any) -> Any:
        """``vllm.LLM.generate``; its requests are of traffic class ``specscope_class`` where given."""
        with _traffic_class(specscope_class):
            return super().generate(*args, **kwargs)

    def chat(self, *args: Any, specscope_class: str | None = None, **kwargs: Any) -> Any:
        """``vllm.LLM.chat``; its requests are recorded as GenAI ``chat`` operations (of ``specscope_class``)."""
        token = vllm_hook.OPERATION.set("chat")
        try:
            with _traffic_class(specscope_class):
                return super().chat(*args, **kwargs)
        finally:
            vllm_hook.OPERATION.reset(token)

    def snapshot(self) -> Snapshot:
        """The hub's current snapshot."""
        return self.specscope.snapshot()


@contextlib.contextmanager
def _traffic_class(value: str | None) -> Iterator[None]:
    """The requests added inside are of class ``value`` (where given)."""
    if value is None:
        yield
        return
    cls = classes.clean(value)
    if cls is None:
        raise ValueError(f"specscope_class {str(value)[:60]!r} is not a class name: up to {classes.MAX_LENGTH} "
                         "letters, digits and _.:/+- (starting with a letter or digit)")
    token = vllm_hook.TRAFFIC_CLASS.set(cls)
    try:
        yield
    finally:
        vllm_hook.TRAFFIC_CLASS.reset(token)


def measure_step_times(llm: LLM, batch_sizes: Sequence[int], tokens: int = 64, rounds: int = 2,
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
        with _traffic_class(traffic_classes[i] if traffic_classes else None):
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


class AsyncLLM(_VllmAsyncLLM):
    """vLLM's ``AsyncLLM`` with specscope recording; build it with ``from_engine_args`` as usual.

    Per-request speculative metrics are turned on when speculation is configured. ``from_engine_args`` and
    ``from_vllm_config`` also take ``specscope_hub`` (default: the process-wide hub).
    """

    specscope_default_hub: Hub | None = None

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        hub = type(self).specscope_default_hub or default_hub()
        prepare_async_llm(vllm_config, kwargs, hub)
        super().__init__(vllm_config, *args, **kwargs)
        self.specscope: Hub = instrument(self, hub)

    @classmethod
    def from_engine_args(cls, *args: Any, specscope_hub: Hub | None = None, **kwargs: Any) -> AsyncLLM:
        """As vLLM's, plus ``specscope_hub``."""
        return _VllmAsyncLLM.from_engine_args.__func__(cls._bound(specscope_hub), *args, **kwargs)  # type: ignore[attr-defined]

    @classmethod
    def from_vllm_config(cls, *args: Any, specscope_hub: Hub | None = None, **kwargs: Any) -> AsyncLLM:
        """As vLLM's, plus ``specscope_hub``."""
        return _VllmAsyncLLM.from_vllm_config.__func__(cls._bound(specscope_hub), *args, **kwargs)  # type: ignore[attr-defined]

    @classmethod
    def _bound(cls, hub: Hub | None) -> type[AsyncLLM]:
        return cls if hub is None else type(cls.__name__, (cls,), {"specscope_default_hub": hub})

    def snapshot(self) -> Snapshot:
        """The hub's current snapshot."""
        return self.specscope.snapshot()
