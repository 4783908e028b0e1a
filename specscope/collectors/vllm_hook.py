"""A hook in vLLM's output processor: each finished request's speculative metrics reach the stat logger.

vLLM's stat loggers get a ``FinishedRequestStats`` per finished request (tokens, timing) but not its speculative
metrics, which the output processor holds (``RequestState.spec_decode_metrics``) and the OpenAI server puts in
responses only for single-prompt, ``n = 1`` requests. The hook wraps ``OutputProcessor._update_stats_from_finished``
(the method that appends those stats) to attach to the appended entry what the stat logger needs: the request's
speculative metrics, its child index when it is one of ``n > 1`` samples (the children share one request id), and
the front end's time to first token. It also carries each request's trace context: the W3C ``traceparent`` the
server received (vLLM passes it to ``add_request`` and drops it there unless its own tracing is on) or, for
offline engines, the caller's current OpenTelemetry span; and, when vLLM traces (``--otlp-traces-endpoint``), the
context of vLLM's own ``llm_request`` span, for specscope's span to link to. Installed once per process, in the
same process as the stat loggers; it never raises into vLLM. Where vLLM has no such method, it is not installed
and records are joined from the engine's outputs (``specscope.LLM``) or the server's responses (the middleware).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from specscope import capture, classes
from specscope.capture import Payload

log = logging.getLogger("specscope")

#: The attribute set on vLLM's ``FinishedRequestStats``: an :class:`Extras`.
ATTRIBUTE = "specscope"
#: What was noted of requests added and not yet finished, by vLLM's external request id (bounded: oldest out):
#: ``(trace context carrier or None, traffic class or None, chat messages or None)``.
_ADDED: OrderedDict[str, tuple[dict[str, str] | None, str | None, tuple[tuple[str, str], ...] | bytes | None]] = \
    OrderedDict()
_MAX_ADDED = 4096
#: The context of the span vLLM's ``do_tracing`` made on this thread (noted by :func:`_span_processor`'s).
_local = threading.local()
#: The GenAI operation (``chat``) of the requests an offline ``LLM`` call in this context runs; records made in
#: the same thread (the stat logger's, or the outputs') carry it. Unset: told by the request id, or a completion.
OPERATION: contextvars.ContextVar[str | None] = contextvars.ContextVar("specscope_operation", default=None)
#: The traffic class of the requests added in this context: the middleware's, from the request's headers, or an
#: offline ``specscope.LLM.generate(..., specscope_class=...)``'s. Unset: the served LoRA adapter's name, if any.
TRAFFIC_CLASS: contextvars.ContextVar[str | None] = contextvars.ContextVar("specscope_traffic_class", default=None)
#: The chat messages of the requests added in this context, in the order they are added (``specscope.LLM.chat``'s
#: conversations, a served chat request's), noted only while a capture runs (:mod:`specscope.capture`).
MESSAGES: contextvars.ContextVar[Iterator[tuple[tuple[str, str], ...] | bytes | None] | None] = contextvars.ContextVar(
    "specscope_messages", default=None)


class Extras(NamedTuple):
    """What the hook attaches to a finished request's stats."""

    #: The child's index when the request is one of ``n > 1`` samples (they share one request id).
    child: int | None
    spec_metrics: Any
    #: The front end's time to first token.
    ttft_s: float | None
    #: The W3C trace context to continue (``traceparent``, ``tracestate``).
    carrier: dict[str, str] | None
    #: vLLM's own ``llm_request`` span, as a ``traceparent``.
    vllm_span: str | None
    traffic_class: str | None
    #: The request's prompt and completion, kept only while a capture runs (:class:`specscope.capture.Payload`).
    payload: Payload | None = None

_lock = threading.Lock()
_installed: bool | None = None
#: Those who asked for the hook and have not let it go (the stat-logger plugin never does; an instrumentor's
#: ``uninstrument`` does), and what the hook replaced: ``(owner, attribute, original)``.
_holders = 0
_replaced: list[tuple[Any, str, Any]] = []
failures = 0


def install() -> bool:
    """Wrap vLLM's output processor (once per process, however many ask); True when the hook is in place."""
    global _installed, _holders
    with _lock:
        _holders += 1
        if _installed is not None:
            return _installed
        if os.environ.get("SPECSCOPE_HOOK", "on").strip().lower() in ("off", "0", "false", "no"):
            log.warning("specscope: SPECSCOPE_HOOK=off: per-request speculative numbers come from the engine's "
                        "outputs or the server's responses (n > 1 samples and multi-prompt requests go without)")
            _installed = False
            return False
        _installed = _install()
        if not _installed:
            log.info("specscope: vLLM's output processor has no _update_stats_from_finished; per-request "
                     "speculative numbers come from the engine's outputs or the server's responses instead")
        return _installed


def uninstall() -> None:
    """Let go of the hook asked for by :func:`install`; the last to let go puts vLLM's methods back."""
    global _installed, _holders
    with _lock:
        _holders = max(0, _holders - 1)
        if _holders or not _installed:
            return
        for owner, name, original in reversed(_replaced):
            setattr(owner, name, original)
        _replaced.clear()
        _installed = None


def installed() -> bool:
    """Whether the hook is in place (False before :func:`install`)."""
    return bool(_installed)


def _replace(owner: Any, name: str, wrapped: Any) -> None:
    _replaced.append((owner, name, getattr(owner, name)))
    setattr(owner, name, wrapped)


def trace_carrier(trace_headers: Any) -> dict[str, str] | None:
    """The W3C trace context to continue: the request's own headers, else the caller's current span's."""
    if trace_headers:
        carrier = {k: str(v) for k, v in dict(trace_headers).items() if k.lower() in ("traceparent", "tracestate")}
        if carrier:
            return carrier
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    out: dict[str, str] = {}
    propagate.inject(out)
    return out or None


def traffic_class(lora_request: Any) -> str | None:
    """The class of a request being added: this context's :data:`TRAFFIC_CLASS`, else its LoRA adapter's name
    (``model:<name>``, a class of its own kind: the served model when vLLM serves several)."""
    found = TRAFFIC_CLASS.get()
    if found is None and lora_request is not None:
        name = classes.clean(getattr(lora_request, "lora_name", None))
        found = None if name is None else f"model:{name}"
    return found


def _remember(request_id: Any, kwargs: dict[str, Any]) -> None:
    try:
        carrier = trace_carrier(kwargs.get("trace_headers"))
        cls = traffic_class(kwargs.get("lora_request"))
        conversations = MESSAGES.get() if capture.active else None
        messages = next(conversations, None) if conversations is not None else None
        if carrier is None and cls is None and messages is None:
            return
        with _lock:
            _ADDED[str(request_id)] = (carrier, cls, messages)
            while len(_ADDED) > _MAX_ADDED:
                _ADDED.popitem(last=False)
    except Exception:
        global failures
        failures += 1


def _wrap_add_request(cls: Any) -> None:
    """Remember each request's trace context (before vLLM drops it when its tracing is off) and traffic class as
    it is added."""
    original = cls.add_request
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def add_request(self: Any, request_id: Any, *args: Any, **kwargs: Any) -> Any:
            _remember(request_id, kwargs)
            return await original(self, request_id, *args, **kwargs)
    else:
        @functools.wraps(original)
        def add_request(self: Any, request_id: Any, *args: Any, **kwargs: Any) -> Any:
            _remember(request_id, kwargs)
            return original(self, request_id, *args, **kwargs)
    _replace(cls, "add_request", add_request)


def _span_processor() -> Any:
    """A span processor for vLLM's tracer provider that notes the context of each ``llm_request`` span it starts
    (the SDK's base class: every hook the provider calls exists, and ours never raise into vLLM)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class VllmSpans(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            try:
                if span.name == "llm_request":
                    _local.span = span.get_span_context()
            except Exception:
                global failures
                failures += 1

    return VllmSpans()


_watched_providers: set[int] = set()


def _watch_vllm_spans() -> None:
    """Add :func:`_span_processor` to the global tracer provider vLLM set (once per provider)."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if id(provider) in _watched_providers or not hasattr(provider, "add_span_processor"):
        return
    _watched_providers.add(id(provider))
    provider.add_span_processor(_span_processor())


def _traceparent(ctx: Any) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _install() -> bool:
    try:
        from vllm.v1.engine.output_processor import OutputProcessor
    except ImportError:
        return False
    original: Callable[..., Any] | None = getattr(OutputProcessor, "_update_stats_from_finished", None)
    if original is None:
        return False
    for module, name in (("vllm.v1.engine.async_llm", "AsyncLLM"), ("vllm.v1.engine.llm_engine", "LLMEngine")):
        try:
            _wrap_add_request(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            log.info("specscope: no %s.add_request: request spans start their own traces", name)
    tracing: Callable[..., Any] | None = getattr(OutputProcessor, "do_tracing", None)
    if tracing is not None:
        @functools.wraps(tracing)
        def do_tracing(self: Any, engine_core_output: Any, req_state: Any, iteration_stats: Any) -> Any:
            _local.span = None
            try:
                _watch_vllm_spans()
            except Exception:
                global failures
                failures += 1
            result = tracing(self, engine_core_output, req_state, iteration_stats)
            span = _local.span
            try:
                finished = iteration_stats.finished_requests[-1] if iteration_stats is not None else None
                extra = getattr(finished, ATTRIBUTE, None)
                if span is not None and extra is not None:
                    setattr(finished, ATTRIBUTE, extra._replace(vllm_span=_traceparent(span)))
            except Exception:
                failures += 1
            return result

        _replace(OutputProcessor, "do_tracing", do_tracing)

    def _update_stats_from_finished(self: Any, req_state: Any, finish_reason: Any, iteration_stats: Any) -> None:
        original(self, req_state, finish_reason, iteration_stats)
        if iteration_stats is None:
            return
        try:
            finished = iteration_stats.finished_requests[-1]
            index = req_state.request_index if req_state.parent_req is not None else None
            stats = req_state.stats
            with _lock:
                carrier, cls, messages = _ADDED.get(req_state.external_req_id) or (None, None, None)
                if req_state.parent_req is None:
                    _ADDED.pop(req_state.external_req_id, None)
            payload = None
            if capture.active and req_state.detokenizer is not None:
                detok = req_state.detokenizer
                payload = Payload(req_state.prompt, req_state.prompt_token_ids, detok.output_token_ids,
                                  getattr(detok, "output_text", None), messages, getattr(self, "tokenizer", None))
            setattr(finished, ATTRIBUTE, Extras(index, req_state.spec_decode_metrics,
                                                getattr(stats, "first_token_latency", None) if stats else None,
                                                carrier, None, cls, payload))
        except Exception:  # vLLM moved something: that request's extras are lost, nothing else
            global failures
            failures += 1

    _update_stats_from_finished.__wrapped__ = original  # type: ignore[attr-defined]
    _replace(OutputProcessor, "_update_stats_from_finished", _update_stats_from_finished)
    return True
