"""specscope: observability and diagnostics for speculative decoding in vLLM.

``specscope.LLM`` and ``specscope.AsyncLLM`` (instrumented vLLM engines) and :func:`instrument` load vLLM on
first use; the rest of the package (the telemetry model, the hub, the math) is light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specscope._version import __version__
from specscope.core.model import Snapshot
from specscope.export.alerts import start as start_alerts
from specscope.export.exports import start as start_exports
from specscope.state.hub import Hub, default_hub

__all__ = [
    "LLM",
    "AsyncLLM",
    "Hub",
    "Snapshot",
    "__version__",
    "default_hub",
    "instrument",
    "start_alerts",
    "start_exports",
    "uninstrument",
]

_LAZY = {"LLM", "AsyncLLM", "instrument", "uninstrument"}

if TYPE_CHECKING:
    from specscope.engine.vllm_engine import instrument, uninstrument
    from specscope.engine.wrapper import LLM, AsyncLLM


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from specscope.engine import wrapper  # LLM and AsyncLLM; instrument and uninstrument from engine.vllm_engine

        return getattr(wrapper, name)
    raise AttributeError(f"module 'specscope' has no attribute {name!r}")
