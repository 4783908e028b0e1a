"""Instrumented vLLM engines: ``specscope.LLM``, ``specscope.AsyncLLM`` and :func:`instrument`.

``specscope.LLM`` is ``vllm.LLM`` with the same arguments and return values, plus a ``specscope`` attribute
(the :class:`~specscope.state.hub.Hub` it feeds) and :meth:`LLM.snapshot`. It turns on what the numbers need: vLLM's
stat collection and, when speculation is configured, per-request speculative metrics (``detailed``: per step,
for acceptance by output position). When the caller did not
ask for vLLM's own stat logging, vLLM's log-line and Prometheus loggers are left out so nothing is paid for
them. :func:`instrument` attaches the same recording to an engine created elsewhere (``vllm.LLM``,
``LLMEngine`` or ``AsyncLLM``); :func:`uninstrument` removes it (both in :mod:`specscope.engine.vllm_engine`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import vllm
from vllm.v1.engine.async_llm import AsyncLLM as _VllmAsyncLLM

from specscope.core.model import Snapshot, StepProfile
from specscope.engine import door, forward_timer, vllm_hook
from specscope.engine.capture import CaptureConfig, attached, chat_messages
from specscope.engine.vllm_engine import (
    check_tokenizers,
    engine_hub,
    instrument,
    prepare_async_llm,
    prepare_llm_kwargs,
    traffic_class,
    uninstrument,
)
from specscope.state.hub import Hub

__all__ = ["LLM", "AsyncLLM", "instrument", "uninstrument"]

class LLM(vllm.LLM):
    """``vllm.LLM`` that records per-request acceptance, KV-cache and GPU memory into a hub.

    Takes every ``vllm.LLM`` argument, plus ``specscope_hub`` (default: the process-wide hub, or a hub of its own
    where that holds another engine's numbers; a given hub that does is refused, see
    :func:`~specscope.engine.vllm_engine.engine_hub`) and
    ``specscope_baseline``: the target's step times without speculation (a file written by ``specscope
    calibrate``, or a :class:`~specscope.core.model.StepProfile`), which makes the speedup estimate measured. For
    draft-model speculation the two tokenizers are compared first (:mod:`specscope.core.tokenizer_check`).
    ``specscope_capture`` turns on the capture of chosen traffic as draft training data
    (:mod:`specscope.engine.capture`:
    a private directory, or a mapping of ``directory``, ``classes``, ``rate``, ``max_bytes``, or a
    :class:`~specscope.engine.capture.CaptureConfig`; ValueError, before the engine starts, where it cannot be used).
    ``generate`` and ``chat`` take ``specscope_class``: the traffic class of the call's requests (acceptance is
    shown per class; a label of :mod:`specscope.core.classes`' safe characters, ValueError otherwise).
    """

    def __init__(self, model: str, *, specscope_hub: Hub | None = None,
                 specscope_baseline: str | Path | StepProfile | None = None,
                 specscope_capture: CaptureConfig | str | Path | Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        capture = None if specscope_capture is None else CaptureConfig.of(specscope_capture).checked()
        hub = engine_hub(specscope_hub)
        if specscope_baseline is not None:  # before the engine starts: a file that cannot be read is the caller's
            door.given(hub, None, specscope_baseline)
        check_tokenizers(kwargs.get("tokenizer") or model, kwargs.get("speculative_config"), hub)
        keep_vllm_loggers = prepare_llm_kwargs(kwargs)
        with forward_timer.engine_directory():
            super().__init__(model, **kwargs)
            self.specscope: Hub = instrument(self, hub, keep_vllm_loggers=keep_vllm_loggers)
        door.given(self.specscope, self.llm_engine.vllm_config, capture_config=capture)

    def generate(self, *args: Any, specscope_class: str | None = None, **kwargs: Any) -> Any:
        """``vllm.LLM.generate``; its requests are of traffic class ``specscope_class`` where given."""
        with traffic_class(specscope_class):
            return super().generate(*args, **kwargs)

    def chat(self, *args: Any, specscope_class: str | None = None, **kwargs: Any) -> Any:
        """``vllm.LLM.chat``; its requests are recorded as GenAI ``chat`` operations (of ``specscope_class``)."""
        token = vllm_hook.OPERATION.set("chat")
        noted = vllm_hook.MESSAGES.set(_conversations(args[0] if args else kwargs.get("messages"))
                                       if attached(self.specscope) is not None else None)
        try:
            with traffic_class(specscope_class):
                return super().chat(*args, **kwargs)
        finally:
            vllm_hook.MESSAGES.reset(noted)
            vllm_hook.OPERATION.reset(token)

    def snapshot(self) -> Snapshot:
        """The hub's current snapshot."""
        return self.specscope.snapshot()


def _conversations(messages: Any) -> Iterator[tuple[tuple[str, str], ...] | bytes | None]:
    """Each conversation of ``LLM.chat``'s ``messages`` (one, or a list of them) as ``(role, text)`` pairs, in the
    order vLLM adds their requests (None for one it cannot be read from)."""
    if not messages:
        return iter(())
    many = isinstance(messages[0], (list, tuple))
    return iter([chat_messages(m) for m in (messages if many else [messages])])


class AsyncLLM(_VllmAsyncLLM):
    """vLLM's ``AsyncLLM`` with specscope recording; build it with ``from_engine_args`` as usual.

    Per-request speculative metrics are turned on when speculation is configured. ``from_engine_args`` and
    ``from_vllm_config`` also take ``specscope_hub`` (default: as for :class:`LLM`).
    """

    specscope_default_hub: Hub | None = None

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        hub = engine_hub(type(self).specscope_default_hub, vllm_config)
        prepare_async_llm(vllm_config, kwargs, hub)
        with forward_timer.engine_directory():
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
