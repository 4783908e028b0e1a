"""Recording a vLLM engine made elsewhere: :func:`instrument` puts specscope's stat logger in its logger manager
(and, where vLLM cannot be hooked, joins its outputs as a second part of each request record); :func:`uninstrument`
takes it out. The helpers ``specscope.LLM`` and ``specscope.AsyncLLM`` use to turn on what recording needs are here
too, so that every piece of specscope that touches vLLM's objects is in :mod:`specscope.engine`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from vllm.v1.engine.async_llm import AsyncLLM as _VllmAsyncLLM

from specscope.core import classes
from specscope.engine import gpu_source, vllm_hook, vllm_stats
from specscope.engine.vllm_logger import SpecscopeStatLogger
from specscope.state.hub import Hub, default_hub

_STATE = "_specscope_state"
log = logging.getLogger("specscope")


class SpecscopeError(RuntimeError):
    """specscope cannot instrument this engine as asked."""


def engine_hub(hub: Hub | None, config: Any = None) -> Hub:
    """The hub an engine (``config``: its vLLM config, where made; None: a new engine) records into: ``hub``,
    refused with :class:`SpecscopeError` where it holds another engine's numbers; by default the process-wide hub,
    or a hub of its own where that one holds another engine's (logged)."""
    if hub is not None:
        if hub.holds_other(config):
            raise SpecscopeError(f"{_holder(hub, 'this hub')}: an engine's numbers would mix with another's; give "
                                 "each engine a hub of its own (specscope.Hub())")
        return hub
    hub = default_hub()
    if not hub.holds_other(config):
        return hub
    log.info("specscope: %s; this engine records into a hub of its own (the engine's .specscope)",
             _holder(hub, "the process-wide hub"))
    return Hub()


def _holder(hub: Hub, name: str) -> str:
    info = hub.engine
    draft = f" with draft {info.draft_model}" if info.draft_model else ""
    return f"{name} holds the numbers of another engine ({info.model or 'unnamed'}{draft})"


def _record_output(hub: Hub, output: Any) -> None:
    """Record a finished output; never raises into the engine's loop."""
    try:
        if output.finished:
            fields = vllm_stats.output_fields(output)
            operation, cls = vllm_hook.OPERATION.get(), vllm_hook.TRAFFIC_CLASS.get()
            if operation:
                fields["operation"] = operation
            if cls:
                fields["traffic_class"] = cls
            hub.requests.record(str(output.request_id), **fields)
            for completion in getattr(output, "outputs", None) or ():
                steps = vllm_stats.per_step_counts(getattr(completion, "spec_decode_metrics", None))
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
    ``specscope.LLM``'s ``specscope`` attribute and ``snapshot()`` follow). A hub holds one engine's numbers
    (:func:`engine_hub`): one that holds another engine's is refused, and without ``hub`` an engine gets a hub of
    its own where the process-wide one holds another engine's.
    """
    target = getattr(engine, "llm_engine", engine)
    hub = engine_hub(hub, target.vllm_config)
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
    hub.claim(target.vllm_config)
    others = [lg for lg in manager.stat_loggers if not isinstance(lg, SpecscopeStatLogger)]
    ours = [lg for lg in manager.stat_loggers if isinstance(lg, SpecscopeStatLogger) and lg.hub is hub]
    stat_logger = ours[0] if ours else SpecscopeStatLogger.bound_to(hub)(target.vllm_config, manager.engine_indexes)
    if earlier is not None and earlier[1] is not stat_logger:
        stat_logger.forwards = earlier[1].forwards  # where the engine's first logger found its forward times
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
    from specscope.core.tokenizer_check import record_verdict

    if not isinstance(spec, dict) or spec.get("method", "draft_model") != "draft_model" or not spec.get("model"):
        return
    record_verdict(target, str(spec["model"]), hub)



@contextlib.contextmanager
def traffic_class(value: str | None) -> Iterator[None]:
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
