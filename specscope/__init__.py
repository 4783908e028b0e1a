"""specscope: observability and diagnostics for speculative decoding in vLLM.

``specscope.LLM`` and ``specscope.AsyncLLM`` (instrumented vLLM engines) and :func:`instrument` load vLLM on
first use; the rest of the package (the telemetry model, the hub, the math) is light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specscope.hub import Hub, default_hub
from specscope.model import Snapshot

__version__ = "0.1.0"

__all__ = ["LLM", "AsyncLLM", "Hub", "Snapshot", "__version__", "default_hub", "instrument", "uninstrument"]

_LAZY = {"LLM", "AsyncLLM", "instrument", "uninstrument"}

if TYPE_CHECKING:
    from specscope.wrapper import LLM, AsyncLLM, instrument, uninstrument


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from specscope import wrapper

        return getattr(wrapper, name)
    raise AttributeError(f"module 'specscope' has no attribute {name!r}")
