"""A hook in vLLM's output processor: each finished request's speculative metrics reach the stat logger.

vLLM's stat loggers get a ``FinishedRequestStats`` per finished request (tokens, timing) but not its speculative
metrics, which the output processor holds (``RequestState.spec_decode_metrics``) and the OpenAI server puts in
responses only for single-prompt, ``n = 1`` requests. The hook wraps ``OutputProcessor._update_stats_from_finished``
(the method that appends those stats) to attach to the appended entry what the stat logger needs: the request's
speculative metrics, its child index when it is one of ``n > 1`` samples (the children share one request id), and
the front end's time to first token. Installed once per process, in the same process as the stat loggers; it
never raises into vLLM. Where vLLM has no such method, it is not installed and records are joined from the
engine's outputs (``specscope.LLM``) or the server's responses (the middleware) as before.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("specscope")

#: The attribute set on vLLM's ``FinishedRequestStats``: ``(child index or None, spec metrics, front-end TTFT)``.
ATTRIBUTE = "specscope"
#: The GenAI operation (``chat``) of the requests an offline ``LLM`` call in this context runs; records made in
#: the same thread (the stat logger's, or the outputs') carry it. Unset: told by the request id, or a completion.
OPERATION: contextvars.ContextVar[str | None] = contextvars.ContextVar("specscope_operation", default=None)

_lock = threading.Lock()
_installed: bool | None = None
failures = 0


def install() -> bool:
    """Wrap vLLM's output processor once per process; True when the hook is in place."""
    global _installed
    with _lock:
        if _installed is not None:
            return _installed
        _installed = _install()
        if not _installed:
            log.info("specscope: vLLM's output processor has no _update_stats_from_finished; per-request "
                     "speculative numbers come from the engine's outputs or the server's responses instead")
        return _installed


def installed() -> bool:
    """Whether the hook is in place (False before :func:`install`)."""
    return bool(_installed)


def _install() -> bool:
    try:
        from vllm.v1.engine.output_processor import OutputProcessor
    except ImportError:
        return False
    original: Callable[..., Any] | None = getattr(OutputProcessor, "_update_stats_from_finished", None)
    if original is None:
        return False

    def _update_stats_from_finished(self: Any, req_state: Any, finish_reason: Any, iteration_stats: Any) -> None:
        original(self, req_state, finish_reason, iteration_stats)
        if iteration_stats is None:
            return
        try:
            finished = iteration_stats.finished_requests[-1]
            index = req_state.request_index if req_state.parent_req is not None else None
            stats = req_state.stats
            setattr(finished, ATTRIBUTE, (index, req_state.spec_decode_metrics,
                                          getattr(stats, "first_token_latency", None) if stats else None))
        except Exception:  # vLLM moved something: that request's extras are lost, nothing else
            global failures
            failures += 1

    _update_stats_from_finished.__wrapped__ = original  # type: ignore[attr-defined]
    OutputProcessor._update_stats_from_finished = _update_stats_from_finished  # type: ignore[method-assign]
    return True
