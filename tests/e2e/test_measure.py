"""Driving a real engine to measure it (``specscope.engine.measure``): the throughput window's length."""

from __future__ import annotations

import time
from typing import Any

import pytest

from specscope import tiny_models
from specscope.engine.measure import steady_throughput
from specscope.engine.wrapper import LLM
from tests.conftest import ENGINE_KW

pytestmark = pytest.mark.engine


def _done(llm: Any, since: float) -> int:
    """Requests the engine finished at their length (not aborted at a window's end) since ``since``."""
    llm.specscope.wait_idle()
    return sum(r.finish_reason == "length" and r.finished_at >= since for r in llm.snapshot().requests)


def test_a_window_lasts_until_as_many_requests_finished_as_asked(tiny: Any, engines: Any) -> None:
    llm = engines.get("plain", lambda: LLM(str(tiny["target"]), **ENGINE_KW))
    prompts = tiny_models.prompts(16, seed=3)
    # A window of a millisecond, counted from the first prompts' prefill, ends long before a 40-token request does.
    start = time.time()
    assert steady_throughput(llm, 2, 0.001, prompts, 40, settle=True) > 0
    assert _done(llm, start) == 0
    start = time.time()
    assert steady_throughput(llm, 2, 0.001, prompts, 40, settle=True, min_finished=5) > 0
    assert _done(llm, start) >= 5
    # With a warm-up, the count (and the requests it must see finish) starts once the batch has turned over.
    start = time.time()
    assert steady_throughput(llm, 2, 0.001, prompts, 40, settle=True, min_finished=3, warm=3) > 0
    assert _done(llm, start) >= 6
