"""The one door into an engine: what specscope turns on for an engine vLLM has made, whichever way in.

Every way in ends here. ``specscope.LLM`` / ``AsyncLLM`` and :func:`specscope.instrument` (through
:mod:`specscope.engine.vllm_engine`) say what the caller gave (:func:`given`); the ``vllm serve`` plugin's stat
logger says what the environment gives (:func:`served`: ``SPECSCOPE_BASELINE``, ``SPECSCOPE_CAPTURE_*``, the
exports, the API-server processes' share, GPU memory). The stat logger itself only records steps. Whatever is
turned on here never raises into vLLM: a setting that cannot be used is one line in the log and a count in the
hub's health, and the engine serves on.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specscope.core.model import StepProfile
from specscope.engine import capture, vllm_hook
from specscope.engine.capture import Capture, CaptureConfig, CaptureError
from specscope.engine.vllm_config import api_server, draft_tokenizers, engine_info, speculative_config
from specscope.state.hub import Hub

log = logging.getLogger("specscope")
_exports_started = False
_shared = False
#: Whether this process is to serve an export role, with several API-server processes
#: (:func:`specscope.engine.share.join`).
_lead: Callable[[str], bool] | None = None


def given(hub: Hub, vllm_config: Any, baseline: str | Path | StepProfile | None = None,
          capture_config: CaptureConfig | None = None) -> None:
    """What a caller in Python gave: ``baseline`` (a ``specscope calibrate`` file or a profile; errors raise, the
    engine is the caller's) and ``capture_config`` (checked before the engine started)."""
    if baseline is not None:
        from specscope.verdict import load_profile

        hub.set_baseline(baseline if isinstance(baseline, StepProfile) else load_profile(baseline))
    if capture_config is not None:
        start_capture(hub, capture_config, vllm_config)


def served(hub: Hub, vllm_config: Any) -> None:
    """What the environment of a ``vllm serve`` process gives, once per process: GPU memory, the share between
    API-server processes, ``SPECSCOPE_BASELINE``, the capture and the exports."""
    from specscope.engine import gpu_source

    gpu_source.attach(hub)
    _share_once(hub, vllm_config)
    baseline = os.environ.get("SPECSCOPE_BASELINE")
    if baseline:
        try:
            given(hub, vllm_config, baseline)
        except Exception as exc:  # a file that cannot be read: said, and the verdict runs without it
            hub.health.count_error("baseline", exc)
    _capture_once(hub, vllm_config)
    _start_exports_once(hub)


def check_tokenizers_in_background(hub: Hub, vllm_config: Any) -> None:
    """Compare the target's and the draft's tokenizers as the engine loaded them (names or directories), off the
    engine's path; the verdict goes to the hub (and the alert rules). Skipped when the hub has one already."""
    tokenizers = draft_tokenizers(vllm_config)
    if tokenizers is None or hub.tokenizer is not None:
        return

    from specscope.core.tokenizer_check import record_verdict

    threading.Thread(target=record_verdict, args=(*tokenizers, hub), name="specscope-tokenizer-check",
                     daemon=True).start()


def start_capture(hub: Hub, config: CaptureConfig, vllm_config: Any) -> Capture:
    """Capture ``hub``'s engine's chosen requests as training rows (:mod:`specscope.engine.capture`), or say with one
    line why not: lossy verification, or vLLM's output processor not hooked (``SPECSCOPE_HOOK=off``). CaptureError
    for a directory that is not private."""
    stopped = capture.refusal(speculative_config(vllm_config))
    if stopped is None and not vllm_hook.installed():
        stopped = "vLLM's output processor is not hooked (SPECSCOPE_HOOK=off?): no completion reaches specscope"
    return capture.Capture(config, hub, engine_info(vllm_config).model, stopped)


def _share_once(hub: Hub, vllm_config: Any) -> None:
    """With several API-server processes (``--api-server-count``), share the hub's numbers between them."""
    global _lead, _shared
    if _shared:
        return
    _shared = True
    from specscope.engine import share

    rank, count = api_server(vllm_config)
    _lead = share.join(hub, max(0, rank), count)


def _capture_once(hub: Hub, vllm_config: Any) -> None:
    """Capture the traffic ``SPECSCOPE_CAPTURE_*`` chooses as training rows (:mod:`specscope.engine.capture`), once per
    process; a setting that cannot be used is said in one line, and the server runs without capture."""
    if capture.attached(hub) is not None:
        return
    try:
        config = CaptureConfig.from_env()
        if config is not None:
            start_capture(hub, config, vllm_config)  # the Capture checks its directory
    except CaptureError as exc:  # one line (the health log's), and the server runs without capture
        # Health reaches the snapshot, the share files and top: it says what is wrong, not where capture writes.
        text, directory = str(exc), os.environ.get("SPECSCOPE_CAPTURE_DIR", "").strip()
        for form in {directory, str(Path(directory))} - {"", "."}:
            text = text.replace(form, "$SPECSCOPE_CAPTURE_DIR")
        hub.health.count_error("capture", CaptureError(text))


def _start_exports_once(hub: Hub) -> None:
    """As a ``vllm serve`` plugin: start the exports the environment asks for, once per process (and, with several
    API-server processes, each export in one of them)."""
    global _exports_started
    if _exports_started:
        return
    _exports_started = True
    from specscope.export import exports

    exports.from_env(hub, lead=_lead)
