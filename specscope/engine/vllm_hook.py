"""A hook in vLLM's output processor: each finished request's speculative metrics reach the stat logger.

vLLM's stat loggers get a ``FinishedRequestStats`` per finished request (tokens, timing) but not its speculative
metrics, which the output processor holds (``RequestState.spec_decode_metrics``) and the OpenAI server puts in
responses only for single-prompt, ``n = 1`` requests. The hook wraps ``OutputProcessor._update_stats_from_finished``
(the method that appends those stats) to attach to the appended entry what the stat logger needs: the request's
speculative metrics, its child index when it is one of ``n > 1`` samples (the children share one request id), and
the front end's time to first token. It also carries each request's trace context: the W3C ``traceparent`` the
server received (vLLM passes it to ``add_request`` and drops it there unless its own tracing is on) or, for
offline engines, the caller's current OpenTelemetry span; and, when vLLM traces (``--otlp-traces-endpoint``), the
context of vLLM's own ``llm_request`` span, for specscope's span to link to. What it notes of a request as vLLM
adds it is let go when the request ends, however it ends: finished (the last of its ``n`` samples), aborted
(``OutputProcessor.abort_requests``) or refused as it was added; chat bodies noted for a capture are bounded in
bytes too (:data:`specscope.engine.capture.MAX_HELD_BYTES`, oldest out). Installed once per process, in the same process
as the stat loggers; it never raises into vLLM. Where vLLM has no such method, it is not installed
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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from specscope.core import classes
from specscope.engine import capture
from specscope.engine.capture import LOST, Messages, Payload

log = logging.getLogger("specscope")

#: The attribute set on vLLM's ``FinishedRequestStats``: an :class:`Extras`.
ATTRIBUTE = "specscope"


class _Noted(NamedTuple):
    """What was noted of a request as vLLM added it."""

    carrier: dict[str, str] | None
    traffic_class: str | None
    #: Whether the class is the client's own claim (:data:`CLIENT_CLASS`).
    client_class: bool
    #: Whether its chat body was noted (in :data:`_BODIES` until let go).
    body: bool


#: What was noted of requests added and not yet ended, by vLLM's external request id (bounded: oldest out).
_ADDED: OrderedDict[str, _Noted] = OrderedDict()
_MAX_ADDED = capture.MAX_HELD
#: The chat bodies noted for a capture, and their size, by the same ids (bounded in bytes too: oldest out).
_BODIES: OrderedDict[str, tuple[Messages, int]] = OrderedDict()
_body_bytes = 0
#: The context of the span vLLM's ``do_tracing`` made on this thread (noted by :func:`_span_processor`'s).
_local = threading.local()
#: The GenAI operation (``chat``) of the requests an offline ``LLM`` call in this context runs; records made in
#: the same thread (the stat logger's, or the outputs') carry it. Unset: told by the request id, or a completion.
OPERATION: contextvars.ContextVar[str | None] = contextvars.ContextVar("specscope_operation", default=None)
#: The traffic class of the requests added in this context: the middleware's, from the request's headers, or an
#: offline ``specscope.LLM.generate(..., specscope_class=...)``'s. Unset: the served LoRA adapter's name, if any.
TRAFFIC_CLASS: contextvars.ContextVar[str | None] = contextvars.ContextVar("specscope_traffic_class", default=None)
#: Whether :data:`TRAFFIC_CLASS` is the client's own claim (the W3C ``baggage`` member, set by the middleware), not a
#: label of the operator's: a capture writes such requests only where the operator names the class so.
CLIENT_CLASS: contextvars.ContextVar[bool] = contextvars.ContextVar("specscope_client_class", default=False)
#: The chat messages of the requests added in this context, in the order they are added (``specscope.LLM.chat``'s
#: conversations, a served chat request's), noted only while a capture runs (:mod:`specscope.engine.capture`).
MESSAGES: contextvars.ContextVar[Iterator[Messages | None] | None] = contextvars.ContextVar("specscope_messages",
                                                                                         default=None)


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
    #: The request's prompt and completion, kept only while a capture runs (:class:`specscope.engine.capture.Payload`).
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
    global _body_bytes
    try:
        carrier = trace_carrier(kwargs.get("trace_headers"))
        cls = traffic_class(kwargs.get("lora_request"))
        client = cls is not None and TRAFFIC_CLASS.get() is not None and CLIENT_CLASS.get()
        conversations = MESSAGES.get() if capture.active else None
        messages = next(conversations, None) if conversations is not None else None
        if carrier is None and cls is None and messages is None:
            return
        rid = str(request_id)
        with _lock:
            _let_go(rid)
            _ADDED[rid] = _Noted(carrier, cls, client, messages is not None)
            if messages is not None:
                size = capture.body_size(messages)
                _BODIES[rid] = (messages, size)
                _body_bytes += size
            while len(_ADDED) > _MAX_ADDED:
                oldest = next(iter(_ADDED))
                if _let_go(oldest):
                    capture.pushed_out += 1
            while _body_bytes > capture.MAX_HELD_BYTES:  # the oldest body goes: its row, if chosen, is dropped
                _, (_, size) = _BODIES.popitem(last=False)
                _body_bytes -= size
    except Exception:
        global failures
        failures += 1


def _let_go(request_id: str) -> bool:
    """Forget what was noted of a request (under :data:`_lock`); whether its chat body was still held."""
    global _body_bytes
    _ADDED.pop(request_id, None)
    body = _BODIES.pop(request_id, None)
    if body is not None:
        _body_bytes -= body[1]
    return body is not None


def _ended(request_ids: Iterable[str], processor: Any) -> None:
    """Let go of what was noted of those of ``request_ids`` (external ids) that vLLM's output ``processor`` no
    longer holds a request of."""
    live = processor.external_req_ids
    with _lock:
        for rid in request_ids:
            if rid not in live:
                _let_go(rid)


def _noted(request_id: str, processor: Any) -> tuple[_Noted | None, Messages | capture.Lost | None]:
    """What was noted of a request that finished, and its chat body (:data:`~specscope.engine.capture.LOST` where it was
    let go); let go of both once the processor holds none of the request's samples."""
    with _lock:
        noted = _ADDED.get(request_id)
        body = _BODIES.get(request_id)
        if request_id not in processor.external_req_ids:
            _let_go(request_id)
    return noted, (body[0] if body is not None else LOST if noted is not None and noted.body else None)


def _wrap_add_request(cls: Any) -> None:
    """Remember each request's trace context (before vLLM drops it when its tracing is off), traffic class and chat
    body as it is added; forget them where vLLM refuses it."""
    original = cls.add_request
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def add_request(self: Any, request_id: Any, *args: Any, **kwargs: Any) -> Any:
            _remember(request_id, kwargs)
            try:
                return await original(self, request_id, *args, **kwargs)
            except BaseException:
                _not_added(self, request_id)
                raise
    else:
        @functools.wraps(original)
        def add_request(self: Any, request_id: Any, *args: Any, **kwargs: Any) -> Any:
            _remember(request_id, kwargs)
            try:
                return original(self, request_id, *args, **kwargs)
            except BaseException:
                _not_added(self, request_id)
                raise
    _replace(cls, "add_request", add_request)


def _not_added(engine: Any, request_id: Any) -> None:
    """Let go of what was noted of a request vLLM did not take (unless it holds one by that id)."""
    try:
        _ended((str(request_id),), engine.output_processor)
    except Exception:
        global failures
        failures += 1


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
        try:
            noted, messages = _noted(req_state.external_req_id, self)
            if iteration_stats is None:
                return
            finished = iteration_stats.finished_requests[-1]
            index = req_state.request_index if req_state.parent_req is not None else None
            stats = req_state.stats
            payload = None
            if capture.active and req_state.detokenizer is not None:
                detok = req_state.detokenizer
                payload = Payload(req_state.prompt, req_state.prompt_token_ids, detok.output_token_ids,
                                  getattr(detok, "output_text", None), messages, getattr(self, "tokenizer", None),
                                  noted is not None and noted.client_class)
            setattr(finished, ATTRIBUTE, Extras(index, req_state.spec_decode_metrics,
                                                getattr(stats, "first_token_latency", None) if stats else None,
                                                noted.carrier if noted else None, None,
                                                noted.traffic_class if noted else None, payload))
        except Exception:  # vLLM moved something: that request's extras are lost, nothing else
            global failures
            failures += 1

    _update_stats_from_finished.__wrapped__ = original  # type: ignore[attr-defined]
    _replace(OutputProcessor, "_update_stats_from_finished", _update_stats_from_finished)
    aborting: Callable[..., Any] | None = getattr(OutputProcessor, "abort_requests", None)
    if aborting is not None:
        @functools.wraps(aborting)
        def abort_requests(self: Any, request_ids: Any, internal: Any) -> Any:
            request_ids = list(request_ids)
            try:  # the external ids of those aborted (a parent's n > 1 samples come back here as its children)
                ended = set(request_ids)
                for rid in request_ids:
                    req_state = self.request_states.get(rid)
                    if req_state is not None:
                        ended.add(req_state.external_req_id)
            except Exception:
                global failures
                failures += 1
                ended = set()
            result = aborting(self, request_ids, internal)
            try:
                _ended(ended, self)
            except Exception:
                failures += 1
            return result

        _replace(OutputProcessor, "abort_requests", abort_requests)
    return True
