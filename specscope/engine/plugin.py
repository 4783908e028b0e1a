"""vLLM's ``vllm.general_plugins`` entry point for specscope, which vLLM calls in every process it runs."""

from __future__ import annotations

from specscope.engine import forward_timer, share


def load() -> None:
    """Name the server's share directory (:func:`specscope.engine.share.name_directory`) and time the target's forward
    wherever the model runner is imported (:func:`specscope.engine.forward_timer.install`)."""
    share.name_directory()
    forward_timer.install()
