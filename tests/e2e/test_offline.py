"""specscope.LLM on a real vLLM engine: same outputs as vllm.LLM, numbers equal to vLLM's own counters."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from specscope import Hub, tiny_models
from tests.conftest import ENGINE_KW, K, greedy, spec_config, vllm_counters

pytestmark = pytest.mark.engine

PROMPTS = tiny_models.prompts(12, seed=3)
MAX_TOKENS = 48

#: draft -> (lowest, highest) accepted/drafted expected with greedy decoding, K=4.
BANDS = {"copy": (0.9, 1.0), "noise2": (0.5, 0.9), "noise10": (0.1, 0.4), "independent": (0.0, 0.05),
         "ngram": (0.05, 1.0)}
ALERT_WINDOW_S = 2.0


@pytest.fixture(scope="module")
def baseline(tiny: Any, engines: Any) -> list[list[int]]:
    """Token ids from plain vllm.LLM without speculation."""
    from vllm import LLM

    llm = engines.get("plain", lambda: LLM(str(tiny["target"]), **ENGINE_KW))
    outs = llm.generate(PROMPTS, greedy(MAX_TOKENS), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module", params=["none", "copy", "noise2", "noise10", "independent", "ngram"])
def run(request: Any, tiny: Any, engines: Any, baseline: Any) -> tuple[Any, Hub, list[Any]]:
    """A specscope.LLM for one draft configuration, after one generate() call over PROMPTS."""
    import specscope

    draft = request.param

    def make() -> tuple[Any, Hub, list[Any]]:
        hub = Hub()
        spec = {} if draft == "none" else {"speculative_config": spec_config(tiny, draft)}
        llm = specscope.LLM(str(tiny["target"]), specscope_hub=hub, disable_log_stats=False, **spec, **ENGINE_KW)
        t0 = time.perf_counter()
        outs = llm.generate(PROMPTS, greedy(MAX_TOKENS), use_tqdm=False)
        llm.first_run_s = time.perf_counter() - t0  # type: ignore[attr-defined]
        hub.wait_idle()
        # The numbers as the first run left them: later tests on this engine add to vLLM's counters (and some
        # to other hubs), so exact comparisons use this moment, whatever order pytest runs the tests in.
        llm.first_snapshot = hub.snapshot()  # type: ignore[attr-defined]
        llm.first_counters = vllm_counters(llm)  # type: ignore[attr-defined]
        return llm, hub, outs

    return engines.get(draft, make)


def test_outputs_identical_to_plain_vllm(run: Any, baseline: list[list[int]]) -> None:
    _, _, outs = run
    assert [list(o.outputs[0].token_ids) for o in outs] == baseline


def test_every_request_recorded_with_engine_token_counts(run: Any) -> None:
    llm, _, outs = run
    snap = llm.first_snapshot
    by_id = {r.request_id: r for r in snap.requests}
    assert set(by_id) == {o.request_id for o in outs}
    for o in outs:
        rec = by_id[o.request_id]
        assert rec.prompt_tokens == len(o.prompt_token_ids)
        assert rec.generation_tokens == len(o.outputs[0].token_ids) == MAX_TOKENS
        assert rec.finish_reason == "length"
        assert 0 < rec.ttft_s <= rec.e2e_s
        assert rec.tpot_s > 0
    c = llm.first_counters
    assert snap.lifetime.generation_tokens == c["generation_tokens"] == sum(r.generation_tokens for r in by_id.values())
    assert snap.lifetime.prompt_tokens == c["prompt_tokens"]
    assert snap.lifetime.requests == len(PROMPTS)


def test_spec_numbers_equal_vllm_counters(run: Any, request: Any) -> None:
    llm, hub, _ = run
    snap = llm.first_snapshot
    if hub.engine.method is None:
        # Without speculation the spec fields are absent, not zero.
        assert snap.lifetime.spec is None and snap.window.spec is None
        assert snap.request_acceptance_rate is None
        assert all(r.draft_tokens is None and r.acceptance_rate is None for r in snap.requests)
        assert "spec_decode_num_drafts" not in llm.first_counters
        return
    c = llm.first_counters
    life = snap.lifetime.spec
    assert life is not None
    assert life.drafts == c["spec_decode_num_drafts"]
    assert life.draft_tokens == c["spec_decode_num_draft_tokens"]
    assert life.accepted == c["spec_decode_num_accepted_tokens"]
    assert list(life.accepted_per_pos) == c["spec_decode_num_accepted_tokens_per_pos"]
    # Per-request numbers summed over the run equal the engine-wide counters exactly.
    recs = snap.requests
    assert sum(r.draft_tokens for r in recs) == c["spec_decode_num_draft_tokens"]
    assert sum(r.accepted_tokens for r in recs) == c["spec_decode_num_accepted_tokens"]
    assert sum(r.spec_steps for r in recs) == c["spec_decode_num_drafts"]
    for r in recs:
        assert len(r.acceptance_histogram) == K + 1
        assert sum(r.acceptance_histogram) == r.spec_steps
        assert sum(j * n for j, n in enumerate(r.acceptance_histogram)) == r.accepted_tokens
    # The run is shorter than the window, so the window holds everything.
    assert snap.window.spec == life
    assert snap.request_acceptance_rate is not None and snap.request_acceptance_rate.count == len(PROMPTS)


@pytest.mark.parametrize("run", list(BANDS), indirect=True)
def test_acceptance_in_expected_band(run: Any) -> None:
    _, hub, _ = run
    method = hub.engine.method
    draft = "ngram" if method == "ngram" else hub.engine.draft_model.rsplit("/", 1)[-1]
    low, high = BANDS[draft]
    spec = hub.snapshot().window.spec
    assert spec is not None and spec.drafts > 0
    assert low <= spec.acceptance_rate <= high, (draft, spec.acceptance_rate)
    assert spec.alpha is not None and 0.0 <= spec.alpha <= 1.0
    if draft == "copy":
        assert spec.alpha >= 0.9 and spec.mean_acceptance_length >= 4.5
    if draft == "independent":
        assert spec.mean_acceptance_length <= 1.2


def test_engine_info_and_kv(run: Any, tiny: Any) -> None:
    _, hub, _ = run
    snap = hub.snapshot()
    assert snap.engine.model == str(tiny["target"])
    assert snap.engine.block_size == 128 and snap.engine.num_blocks and snap.engine.num_blocks > 0
    # Everything finished: no blocks held, nothing live.
    assert snap.kv.block_usage == 0.0 and snap.kv.tokens_held == 0
    assert snap.running == 0 and snap.waiting == 0
    assert snap.gpu.status == "no NVIDIA driver"
    assert snap.health.error_count == 0


@pytest.mark.parametrize("run", ["copy"], indirect=True)
def test_faults_in_specscope_never_reach_the_engine(
    run: Any, baseline: list[list[int]], monkeypatch: Any, caplog: Any
) -> None:
    """A raising reader, listener and GPU source, and a listener that blocks: generation is untouched."""
    import specscope

    llm, home, _ = run
    hub = specscope.instrument(llm, Hub())  # a hub of its own: the faults stay out of the one later tests read
    try:
        _faults_never_reach_the_engine(llm, hub, baseline, monkeypatch, caplog)
    finally:
        specscope.instrument(llm, home)


def _faults_never_reach_the_engine(llm: Any, hub: Hub, baseline: list[list[int]], monkeypatch: Any,
                                   caplog: Any) -> None:
    from specscope.engine import vllm_stats


    real_read_steps = vllm_stats.read_steps
    bad: dict[float, bool] = {}  # every other step, in the order they come, cannot be read

    def flaky_read_steps(times: Any, *args: Any, **kwargs: Any) -> Any:
        for t in times:
            bad.setdefault(t, len(bad) % 2 == 0)
        if any(bad[t] for t in times):
            raise KeyError("field renamed upstream")
        return real_read_steps(times, *args, **kwargs)

    def bad_listener(rec: Any) -> None:
        raise RuntimeError("exporter down")

    release = threading.Event()
    hub.requests.add_listener(bad_listener)
    hub.requests.add_listener(lambda rec: release.wait(30))
    hub.add_gpu_source("gpu", lambda: 1 / 0)  # replaces the real NVML source
    monkeypatch.setattr(vllm_stats, "read_steps", flaky_read_steps)

    start = hub.snapshot()
    before = {r.request_id for r in start.requests}
    with caplog.at_level(logging.WARNING, logger="specscope"):
        t0 = time.perf_counter()
        outs = llm.generate(PROMPTS, greedy(MAX_TOKENS), use_tqdm=False)
        elapsed = time.perf_counter() - t0
        hub.snapshot()
        hub.snapshot()
    release.set()
    hub.wait_idle()
    assert [list(o.outputs[0].token_ids) for o in outs] == baseline
    assert elapsed < 2 * llm.first_run_s + 2  # the blocked listener did not hold the engine
    snap = hub.snapshot()
    new = [r for r in snap.requests if r.request_id not in before]
    assert len(new) == len(PROMPTS)  # every request of the faulty run recorded
    assert all(r.accepted_tokens is not None for r in new)
    errors = dict(snap.health.errors)
    assert errors["stat logger step"] == sum(bad.values()) >= 2  # each unreadable step counted, once
    assert snap.lifetime.steps - start.lifetime.steps == len(bad) - sum(bad.values())  # and only it was lost
    assert errors["gpu source gpu"] >= 1
    assert sum(n for where, n in errors.items() if "bad_listener" in where) == len(PROMPTS)
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("stat logger step failed" in w for w in warnings) == 1  # logged once, counted always
    assert sum("bad_listener" in w for w in warnings) == 1


@pytest.mark.parametrize("run", ["copy"], indirect=True)
def test_chat_is_recorded_like_generate(run: Any) -> None:
    llm, hub, _ = run
    before = hub.snapshot().lifetime.requests
    outs = llm.chat([{"role": "user", "content": PROMPTS[0]}], greedy(16), use_tqdm=False)
    snap = hub.snapshot()
    assert snap.lifetime.requests == before + 1
    rec = next(r for r in snap.requests if r.request_id == outs[0].request_id)
    assert rec.generation_tokens == 16 and rec.draft_tokens and rec.acceptance_rate >= 0.9
    assert rec.operation_name == "chat"  # GenAI's operation, for spans
    llm.generate(PROMPTS[:1], greedy(4), use_tqdm=False)
    assert hub.snapshot().requests[-1].operation_name == "text_completion"


@pytest.mark.parametrize("run", ["copy", "noise2", "noise10", "independent"], indirect=True)
def test_alerts_fire_for_their_fault_only_over_five_windows(run: Any) -> None:
    """Every rule but the speedup verdict, evaluated through five windows of load: 10% noise and independent
    drafts fire within the first full window (the independent one as a collapse when it accepts almost nothing)
    and nothing else; copy and 2% noise fire nothing. (These same-size drafts cannot pay: the verdict's own
    alert is right to fire on them, and is tested against measured speedups in test_verdict.py.)"""
    import specscope
    from specscope.export.alerts.evaluate import Evaluator
    from specscope.export.alerts.rules import RULES, Thresholds

    llm, hub, _ = run
    weak = hub.engine.draft_model.rsplit("/", 1)[-1] in ("noise10", "independent")
    alert_hub = specscope.Hub(window_s=ALERT_WINDOW_S)
    specscope.instrument(llm, alert_hub)  # re-instrument onto a short-window hub
    try:
        rules = [r for r in RULES if r.name != "SpecscopeSpeculationNotPaying"]
        w = ALERT_WINDOW_S
        ev = Evaluator(alert_hub, rules=rules, thresholds=Thresholds(
            window_s=w, weak_draft_for_s=0, collapse_for_s=0, divergence_for_s=0, fragmentation_for_s=0,
            kv_pressure_for_s=0, allocator_for_s=0))
        start = time.monotonic()
        fired_at = None
        fired: set[str] = set()
        while time.monotonic() - start < 5 * w:
            llm.generate(PROMPTS[:4], greedy(32), use_tqdm=False)
            now = {a.rule for a in ev.evaluate() if a.state == "firing"}
            fired |= now
            if now and fired_at is None:
                fired_at = time.monotonic() - start
        if weak:
            assert fired_at is not None and fired_at <= w + 2.0, fired_at
            (alert,) = ev.active()  # one fault, one alert: weak, or collapsed when ~1 token per step
            assert alert.state == "firing" and "per position" in alert.description
            length = alert_hub.snapshot().window.spec.mean_acceptance_length  # type: ignore[union-attr]
            collapsed = length is not None and length <= Thresholds().collapse_length
            assert alert.rule == ("SpecscopeAcceptanceCollapse" if collapsed else "SpecscopeWeakDraft"), length
            assert fired == {alert.rule}, fired  # and nothing else, at any point
        else:
            assert fired == set() and ev.active() == []
            assert alert_hub.snapshot().window.spec.draft_tokens >= 200  # it was judged, not idle
    finally:
        specscope.instrument(llm, hub)
