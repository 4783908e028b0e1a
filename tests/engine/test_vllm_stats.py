"""The stats reader on vLLM's own stats classes, built the way vLLM's scheduler and output processor fill them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from specscope.core.counts import STEP_FIELDS, StepBatch, StepStats
from specscope.engine import vllm_stats
from specscope.engine.vllm_logger import SpecscopeStatLogger
from specscope.state.hub import Hub
from tests.conftest import REPO

stats = pytest.importorskip("vllm.v1.metrics.stats")
spec_metrics = pytest.importorskip("vllm.v1.spec_decode.metrics")


def step_of(batch: StepBatch, i: int) -> StepStats:
    """Step ``i`` of a batch."""
    return StepStats(*(getattr(batch, name)[i] for name in STEP_FIELDS))


def read_step(sched: Any, it: Any, missing: list[str] | None = None) -> StepStats:
    """One step, read as the stat logger reads a batch of them."""
    return step_of(vllm_stats.read_steps([0.0], [sched], [it], missing), 0)


def make_stats() -> tuple[object, object]:
    sds = spec_metrics.SpecDecodingStats.new(4)
    sds.observe_draft(num_draft_tokens=4, num_accepted_tokens=4)
    sds.observe_draft(num_draft_tokens=4, num_accepted_tokens=1)
    sds.observe_draft(num_draft_tokens=2, num_accepted_tokens=0)
    sched = stats.SchedulerStats(num_running_reqs=3, num_waiting_reqs=1, num_skipped_waiting_reqs=1,
                                 kv_cache_usage=0.25, spec_decoding_stats=sds)
    sched.prefix_cache_stats.record(num_tokens=100, num_hits=64, preempted=False)
    it = stats.IterationStats()
    it.num_generation_tokens = 8
    it.prompt_token_stats.total = 100
    it.num_preempted_reqs = 1
    it.finished_requests.append(
        stats.FinishedRequestStats(
            finish_reason="length", request_id="req-1", e2e_latency=2.0, num_prompt_tokens=30,
            num_generation_tokens=12, queued_time=0.1, prefill_time=0.2, decode_time=1.5,
            mean_time_per_output_token=0.125, num_cached_tokens=16, num_preemptions=1,
        )
    )
    return sched, it


def test_read_step_counts_like_vllms_prometheus_logger() -> None:
    sched, it = make_stats()
    s = read_step(sched, it)
    assert (s.running, s.waiting, s.kv_usage) == (3, 2, 0.25)
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (100, 64)
    assert (s.num_spec_tokens, s.drafts, s.draft_tokens, s.accepted) == (4, 3, 10, 5)
    assert list(s.accepted_per_pos) == [2, 1, 1, 1]
    assert list(s.draft_tokens_per_pos) == [3, 3, 2, 2]
    assert (s.prompt_tokens, s.generation_tokens, s.preemptions) == (100, 8, 1)
    assert (s.finished, s.finished_tokens) == (1, 42)


def test_finished_requests_and_spec_fields() -> None:
    _, it = make_stats()
    (fin,) = vllm_stats.finished_requests(it)
    f = fin.fields
    assert fin.request_id == "req-1" and not fin.complete and fin.per_step is None
    assert f["finish_reason"] == "length" and f["cached_tokens"] == 16
    assert f["ttft_s"] == pytest.approx(0.3) and f["tpot_s"] == 0.125  # engine-side without the hook
    m = stats.RequestSpecDecodeMetrics.new(4)
    m.observe(num_draft_tokens=4, num_accepted=3)
    m.observe(num_draft_tokens=4, num_accepted=0)
    assert vllm_stats.spec_fields(m) == vllm_stats.spec_fields(m.to_dict()) == {
        "num_spec_tokens": 4, "spec_steps": 2, "draft_tokens": 8, "accepted_tokens": 3,
        "acceptance_histogram": (1, 0, 0, 1, 0),
    }


def test_the_output_processor_hook_completes_each_record_and_separates_n_samples() -> None:
    """What the hook attaches to vLLM's FinishedRequestStats: speculative metrics, the front end's TTFT, and for
    one of n samples (which share their request id) its index."""
    from specscope.engine.vllm_hook import ATTRIBUTE, Extras

    _, it = make_stats()
    child = stats.FinishedRequestStats(finish_reason="length", request_id="req-1", num_generation_tokens=5)
    it.finished_requests.append(child)
    m = stats.RequestSpecDecodeMetrics.new(4)
    m.observe(num_draft_tokens=4, num_accepted=3, detailed=True)
    setattr(it.finished_requests[0], ATTRIBUTE, Extras(0, m, 0.042, None, None, "code"))
    setattr(child, ATTRIBUTE, Extras(1, None, None, None, None, None))
    first, second = vllm_stats.finished_requests(it)
    assert (first.request_id, second.request_id) == ("req-1#0", "req-1#1") and first.complete
    assert first.fields["ttft_s"] == 0.042 and first.fields["accepted_tokens"] == 3
    assert first.per_step == ([3], [4]) and second.per_step is None
    assert first.fields["traffic_class"] == "code" and "traffic_class" not in second.fields


def test_a_request_is_added_with_its_context_s_class_else_its_lora_adapter_s() -> None:
    from specscope.engine import vllm_hook

    class Lora:
        lora_name = "sql-adapter"

    assert vllm_hook.traffic_class(None) is None
    assert vllm_hook.traffic_class(Lora()) == "model:sql-adapter"
    token = vllm_hook.TRAFFIC_CLASS.set("chat")
    try:
        assert vllm_hook.traffic_class(Lora()) == "chat"  # a header or the caller's class comes first
    finally:
        vllm_hook.TRAFFIC_CLASS.reset(token)
    Lora.lora_name = "not a label!"
    assert vllm_hook.traffic_class(Lora()) is None


def test_stat_logger_feeds_the_hub_and_survives_garbage() -> None:
    hub = Hub()
    sched, it = make_stats()

    class Config:
        model_config = None

    logger = SpecscopeStatLogger.bound_to(hub)(Config(), [0])
    logger.record(scheduler_stats=sched, iteration_stats=it, mm_cache_stats=None, engine_idx=0)
    logger.record(scheduler_stats=object(), iteration_stats=None)  # a future vLLM with nothing we know
    wrong, _ = make_stats()
    wrong.spec_decoding_stats.num_accepted_tokens_per_pos = 5  # a field of another type: that step is lost
    logger.record(scheduler_stats=wrong, iteration_stats=None)
    snap = hub.snapshot()
    assert snap.lifetime.spec.accepted == 5 and snap.lifetime.requests == 1
    assert snap.requests[0].request_id == "req-1"
    errors = dict(snap.health.errors)
    assert errors.pop("stat logger step") == 1  # counted, and logged once
    assert errors and all(k.startswith("vllm field object.") for k in errors)  # the unknown object: its fields


def test_steps_are_added_in_batches_that_readers_flush_and_a_bad_step_costs_only_itself() -> None:
    """Steps with no finished request wait in the stat logger (vLLM makes new stats objects every step); a read
    of the hub sees them all, in order, and a step this reader cannot read is counted and skipped alone."""
    now = [1000.0]
    hub = Hub(clock=lambda: now[0])

    class Config:
        model_config = None

    logger = SpecscopeStatLogger.bound_to(hub)(Config(), [0])
    wrong, _ = make_stats()
    wrong.spec_decoding_stats.num_accepted_tokens_per_pos = 5
    for sched in (make_stats()[0], wrong, make_stats()[0]):
        logger.record(scheduler_stats=sched, iteration_stats=None, engine_idx=1)
    assert len(logger._pending) == 3  # kept, not yet added
    snap = hub.snapshot()
    assert not logger._pending
    assert snap.for_engine(1).lifetime.spec.accepted == 10 and snap.lifetime.steps == 2  # type: ignore[union-attr]
    assert dict(snap.health.errors) == {"stat logger step": 1}
    assert snap.engines[0].running == 3  # the gauges of the last step read
    # A step after which the engine is idle is added at once, with the steps kept before it.
    sched, it = make_stats()
    logger.record(scheduler_stats=make_stats()[0], iteration_stats=it)
    assert len(logger._pending) == 1  # a request finished, others run: kept
    now[0] += 0.3
    sched.num_running_reqs = sched.num_waiting_reqs = 0
    logger.record(scheduler_stats=sched, iteration_stats=None)
    assert not logger._pending and hub.requests.has("req-1")
    assert hub.snapshot().requests[-1].finished_at == 1000.0  # when its step was reported, not when it was added
    assert hub.snapshot().for_engine(0).running == 0


def test_rejections_are_read_per_step() -> None:
    sched, it = make_stats()
    s = read_step(sched, it)
    # Drafts of 4, 4 and 2 tokens accepting 4, 1 and 0: two stopped at a rejection, one ended on its own.
    assert s.rejections == 2


def decode_step(running: int, finished: int, itl: list[float], ttft: list[float]) -> tuple[object, object]:
    sched = stats.SchedulerStats(num_running_reqs=running, num_waiting_reqs=0)
    it = stats.IterationStats()
    it.inter_token_latencies_iter.extend(itl)  # one per request that produced tokens after an earlier step
    it.time_to_first_tokens_iter.extend(ttft)  # one per request whose prefill ended in this step
    for i in range(finished):
        it.finished_requests.append(stats.FinishedRequestStats(
            finish_reason="length", request_id=f"f{i}", e2e_latency=1.0, num_prompt_tokens=1,
            num_generation_tokens=1))
    return sched, it


@pytest.mark.parametrize(("running", "finished", "itl", "ttft", "batch", "decode_s", "prefill"), [
    (3, 1, [0.02] * 4, [], 4, 0.02, False),  # every request decoded after the previous step: pure decode
    (3, 0, [0.02] * 2, [], 3, None, True),  # one running request produced nothing: a prompt chunk
    (3, 0, [0.02] * 2, [0.5], 3, None, True),  # one request's prefill ended here
    (2, 0, [0.02, 0.09], [], 2, None, False),  # one came back from preemption: not a clean step
    (0, 0, [], [], 0, None, False),
])
def test_step_timing_from_the_engine_cores_intervals(running: int, finished: int, itl: list[float],
                                                      ttft: list[float], batch: int, decode_s: float | None,
                                                      prefill: bool) -> None:
    s = read_step(*decode_step(running, finished, itl, ttft))
    assert (s.batch, s.decode_s, s.prefill) == (batch, decode_s, prefill)
    assert s.first_tokens == len(ttft) and s.first_token_s == (min(ttft) if ttft else None)


def spec_step(running: int, finished: int, itl: list[float], drafts: int, admitted: bool = False,
              ttft: tuple[float, ...] = ()) -> tuple[Any, Any]:
    """A speculative step as one of several API-server processes gets it: the engine-wide scheduler stats
    (``drafts`` requests verified 3 tokens, 2 accepted each), and its own requests' part of the iteration (``itl``,
    ``finished``)."""
    sched, it = decode_step(running, finished, itl, list(ttft))
    sched.spec_decoding_stats = spec_metrics.SpecDecodingStats.new(3)
    for _ in range(drafts):
        sched.spec_decoding_stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=2)
    if admitted:
        sched.prefix_cache_stats.record(num_tokens=40, num_hits=0, preempted=False)
    it.num_generation_tokens = 3 * (len(itl) + finished)
    return sched, it


@pytest.mark.parametrize(("step", "batch", "decode_s", "seen"), [
    # Running 3 after the step, none of them finished here; 4 verified drafts: another process's request finished,
    # and every request decoded.
    (spec_step(3, 0, [0.02] * 2, 4), 4, 0.02, 2),
    (spec_step(2, 1, [0.02] * 2, 3), 3, 0.02, 2),  # this process's own finish counts in its batch
    (spec_step(1, 1, [0.02] * 2, 3), 3, 0.02, 2),  # it saw all it could account for; another's finished too
    (spec_step(3, 0, [0.02] * 2, 2), 3, None, None),  # a running request verified nothing: it ran a prompt chunk
    (spec_step(3, 0, [0.02] * 2, 3, admitted=True), 3, None, None),  # a request was admitted (looked up its prefix)
    (spec_step(3, 0, [0.02], 3, ttft=(0.4,)), 3, None, None),  # a prefill ended here
    (spec_step(3, 0, [0.02, 0.05], 3), 3, None, 2),  # intervals differ: a request decoded after a skipped step
])
def test_a_step_split_among_api_server_processes_is_read_from_the_engine_wide_counts(
        step: tuple[Any, Any], batch: int, decode_s: float | None, seen: int | None) -> None:
    sched, it = step
    whole = read_step(sched, it)  # one process holds every request: its batch is the requests it accounts for
    assert whole.seen is None and whole.batch == sched.num_running_reqs + len(it.finished_requests)
    s = step_of(vllm_stats.read_steps([0.0], [sched], [it], split=vllm_stats.SplitSteps(128)), 0)
    assert (s.batch, s.decode_s, s.prefill, s.seen) == (batch, decode_s, seen is None, seen)


def test_a_long_prompts_later_chunks_are_never_taken_for_decode_steps() -> None:
    """A prompt admitted with 300 tokens uncached, in a budget of 128 a step: the step's admission and the next two
    (the steps that may still run its chunks, less what 3 requests' decode tokens take of the budget) are not read
    as pure decode, even where another process's finished request hides the prefilling one; then they are again.
    Steps whose stats another process got say nothing here, and prefill nothing of the estimate."""
    admitted = spec_step(3, 0, [0.02] * 2, 3, admitted=True)
    admitted[0].prefix_cache_stats.record(num_tokens=260, num_hits=0, preempted=False)  # 40 + 260 tokens
    hidden = spec_step(3, 0, [0.02] * 2, 3)  # one more than this process accounts for verified: hides a chunk
    elsewhere = (None, spec_step(3, 0, [0.02] * 2, 3)[1])
    steps = [admitted, hidden, elsewhere, hidden, hidden, hidden]
    split = vllm_stats.SplitSteps(128)
    batch = vllm_stats.read_steps([float(i) for i in range(len(steps))], [s for s, _ in steps],
                                   [it for _, it in steps], split=split)
    # Each step prefills up to 128 - 3 * 4 = 116 tokens: 300 -> 184 -> 68 -> 0.
    assert [s is not None and not p for s, p in zip(batch.seen, batch.prefill, strict=True)] == [
        False, False, False, False, True, True]
    assert split.prefill_left == 0
    # Carried across reads, as the stat logger reads its kept steps a batch at a time.
    split = vllm_stats.SplitSteps(128)
    for i, (sched, it) in enumerate(steps):
        s = step_of(vllm_stats.read_steps([float(i)], [sched], [it], split=split), 0)
        assert (s.seen is not None) == (i >= 4), i
    # A long-prefill threshold under the budget: each step prefills less, so it is carried longer.
    split = vllm_stats.SplitSteps(128, chunk_limit=64)
    batch = vllm_stats.read_steps([float(i) for i in range(len(steps))], [s for s, _ in steps],
                                   [it for _, it in steps], split=split)
    assert not any(batch.seen) and split.prefill_left == 300 - 5 * (64 - 12)  # 5 steps it got the stats of


def test_a_split_steps_tokens_and_context_count_the_whole_step() -> None:
    """A step seen in part adds the engine's tokens (accepted + drafts) to its batch size's row, and the context of
    the requests this process holds (its own live tokens over its own requests)."""
    hub = Hub()
    prefill = decode_step(2, 0, [], [0.3, 0.3])  # this process's two requests: prompts of 100 tokens each
    prefill[1].prompt_token_stats.total = 200
    prefill[1].num_generation_tokens = 2
    sched, it = spec_step(3, 0, [0.02] * 2, 4)  # 4 requests verified 3 drafts and accepted 2 each: 12 tokens
    hub.record_steps(0, vllm_stats.read_steps([0.0, 0.1], [prefill[0], sched], [prefill[1], it],
                                               split=vllm_stats.SplitSteps(128)))
    (row,) = [t for t in hub.snapshot().lifetime.step_times.times if t.steps]
    assert (row.batch_size, row.steps, row.mean_s, row.tokens) == (4, 1, 0.02, 12)
    assert row.context == pytest.approx(101.0)  # 202 tokens held over the 2 requests seen, not over 4


def test_a_batch_reads_as_its_steps_read_one_by_one() -> None:
    """The stat logger reads its kept steps together, column by column: each step reads as it reads alone, whatever
    its neighbours carry (no stats, no speculation, finished requests, prefill, decode)."""
    steps = [make_stats(), decode_step(3, 1, [0.02] * 4, []), (None, None), decode_step(3, 0, [0.02] * 2, [0.5]),
             (stats.SchedulerStats(num_running_reqs=1, num_waiting_reqs=0), None), make_stats()]
    batch = vllm_stats.read_steps([float(i) for i in range(len(steps))], [s for s, _ in steps],
                                   [it for _, it in steps])
    assert StepBatch._fields == ("times", *STEP_FIELDS)
    for i, (sched, it) in enumerate(steps):
        alone = read_step(sched, it)
        assert step_of(batch, i) == alone, i
    assert batch.drafts == (3, 0, 0, 0, 0, 3) and batch.decode_s[1] == 0.02 and batch.first_tokens[3] == 1


def test_detailed_per_request_metrics_give_acceptance_by_output_position() -> None:
    m = stats.RequestSpecDecodeMetrics.new(4)
    for accepted in (4, 4, 4, 0, 1):
        m.observe(num_draft_tokens=4, num_accepted=accepted, detailed=True)
    steps = vllm_stats.per_step_counts(m)
    assert steps == ([4, 4, 4, 0, 1], [4, 4, 4, 4, 4]) == vllm_stats.per_step_counts(m.to_dict())
    summary = stats.RequestSpecDecodeMetrics.new(4)
    summary.observe(num_draft_tokens=4, num_accepted=2)
    assert vllm_stats.per_step_counts(summary) is None
    hub = Hub()
    hub.requests.record_positions(*steps)
    pos = hub.snapshot().acceptance_by_output_position
    assert pos is not None
    # Drafts made at output positions 1, 6, 11 (bin 0-15: 12 of 12 accepted), then 16 and 17 (bin 16-31: 1 of 8).
    assert pos.draft_tokens[:2] == (12, 8) and pos.accepted[:2] == (12, 1)
    assert pos.rates[0] == 1.0 and pos.rates[1] == pytest.approx(1 / 8) and pos.rates[2] is None


def drifted(obj: object, drop: str, rename_to: str | None = None) -> object:
    """A copy of a vLLM stats object, of a class with the same name, without ``drop`` (optionally renamed)."""
    fields: dict[str, object] = {k: v for k, v in vars(obj).items() if k != drop}
    computed = [k for k, v in vars(type(obj)).items() if isinstance(v, property) and k != drop]
    fields |= {k: getattr(obj, k) for k in computed}  # computed fields, such as num_prompt_tokens
    if rename_to:
        fields[rename_to] = getattr(obj, drop)
    return type(type(obj).__name__, (), fields)()


#: A step's speculative counts go together: one of them renamed leaves the step without drafts, not with drafts of
#: which nothing was accepted.
SPEC_COUNTS = ("num_spec_tokens", "drafts", "draft_tokens", "accepted", "accepted_per_pos", "draft_tokens_per_pos")


@pytest.mark.parametrize(("which", "field", "lost"), [
    ("scheduler", "kv_cache_usage", ("kv_usage",)),
    ("scheduler", "num_running_reqs", ("running",)),
    ("spec", "num_draft_tokens_per_pos", ("draft_tokens_per_pos",)),
    ("spec", "num_accepted_tokens", SPEC_COUNTS),
    ("spec", "num_drafts", SPEC_COUNTS),
    ("spec", "num_accepted_tokens_per_pos", SPEC_COUNTS),
    ("iteration", "num_generation_tokens", ("generation_tokens",)),
])
def test_a_renamed_field_costs_that_number_not_the_step(which: str, field: str, lost: tuple[str, ...],
                                                        caplog: Any) -> None:
    """vLLM documents its stats as unstable: a field it renames is named once in the log and counted in the
    snapshot's health, its number is unavailable, and everything else of the step is recorded. A speculative count
    renamed leaves acceptance unavailable (None): never 0.0, which would page on a healthy engine."""
    import logging

    from specscope.export.alerts.evaluate import Evaluator

    sched, it = make_stats()
    whole = read_step(*make_stats())
    if which == "scheduler":
        sched = drifted(sched, field, field + "_v2")
    elif which == "spec":
        sched.spec_decoding_stats = drifted(sched.spec_decoding_stats, field, field + "_v2")
    else:
        it = drifted(it, field, field + "_v2")
    missing: list[str] = []
    s = read_step(sched, it, missing)
    owner = {"scheduler": "SchedulerStats", "spec": "SpecDecodingStats", "iteration": "IterationStats"}[which]
    assert missing == [f"{owner}.{field}"]
    for name in ("running", "kv_usage", "drafts", "draft_tokens", "accepted", "generation_tokens", "finished",
                 "prefix_cache_hits"):
        if name not in lost:
            assert getattr(s, name) == getattr(whole, name), name
    # Unavailable, not invented: a gauge reads None; a count adds nothing and the snapshot names it unavailable;
    # the speculative counts go together (no drafts rather than drafts with nothing accepted).
    named = vllm_stats.unavailable(missing)
    for name in lost:
        assert getattr(s, name) in (None, ()) or (getattr(s, name) == 0 and named), name
    assert named == ({"spec_counts"} if lost == SPEC_COUNTS else {"generation_tokens"} if which == "iteration"
                     else set())

    hub = Hub()

    class Config:
        model_config = None

    logger = SpecscopeStatLogger.bound_to(hub)(Config(), [0])
    with caplog.at_level(logging.WARNING, logger="specscope"):
        for _ in range(3):
            sched, it = make_stats()
            if which == "scheduler":
                sched = drifted(sched, field)
            elif which == "spec":
                sched.spec_decoding_stats = drifted(sched.spec_decoding_stats, field)
            else:
                it = drifted(it, field)
            logger.record(scheduler_stats=sched, iteration_stats=it)
    snap = hub.snapshot()
    assert dict(snap.health.errors) == {f"vllm field {owner}.{field}": 3}
    assert len([r for r in caplog.records if field in r.getMessage()]) == 1
    assert snap.lifetime.steps == 3 and snap.lifetime.requests == 3  # no step was dropped
    assert set(snap.unavailable) == named
    if lost == SPEC_COUNTS:
        hub.set_engine(replace(hub.engine, num_speculative_tokens=4, method="draft_model"))
        snap = hub.snapshot()
        assert snap.window.spec is not None and snap.window.spec.acceptance_rate is None
        assert Evaluator(hub).evaluate(snap) == [] and Evaluator(hub).active() == []


def test_versions_outside_the_checked_range_get_one_warning() -> None:
    assert vllm_stats.version_warning("0.32.0") is None
    assert vllm_stats.version_warning("0.33.1rc1") is None
    assert vllm_stats.version_warning(None) is None
    warning = vllm_stats.version_warning("0.35.0")
    assert warning is not None and vllm_stats.SUPPORTED_VLLM in warning and "0.35.0" in warning
    assert vllm_stats.version_warning("0.29.9") is not None


def test_the_supported_range_is_declared_once_in_the_package_metadata() -> None:

    meta = (REPO / "pyproject.toml").read_text()
    (line,) = [x for x in meta.splitlines() if x.startswith("vllm = [")]
    assert line.startswith(f'vllm = ["vllm{vllm_stats.SUPPORTED_VLLM}"]')


def test_the_output_processor_hook_is_put_back_by_the_last_who_asked_for_it(monkeypatch: Any) -> None:
    """``uninstrument()`` undoes ``instrument()``: the hook counts who asked for it, and the last to let go puts
    vLLM's own methods back (while the stat-logger plugin, which never lets go, keeps it)."""
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.engine.output_processor import OutputProcessor

    from specscope.engine import vllm_hook

    for name, fresh in (("_installed", None), ("_holders", 0), ("_replaced", [])):
        monkeypatch.setattr(vllm_hook, name, fresh)  # as in a process where nothing installed it yet
    methods = [(OutputProcessor, "_update_stats_from_finished"), (OutputProcessor, "do_tracing"),
               (AsyncLLM, "add_request"), (LLMEngine, "add_request")]
    before = [getattr(owner, name) for owner, name in methods]
    for owner, name in methods:
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test, whatever happens
    assert vllm_hook.install() and vllm_hook.install()  # an instrumentor, then the plugin
    assert all(getattr(owner, name) is not b for (owner, name), b in zip(methods, before, strict=True))
    vllm_hook.uninstall()
    assert vllm_hook.installed()  # one still holds it
    vllm_hook.uninstall()
    assert not vllm_hook.installed()
    assert [getattr(owner, name) for owner, name in methods] == before


def test_an_unknown_queue_or_prefill_time_gives_no_time_to_first_token() -> None:
    """Without the hook the engine-side TTFT is queued + prefill: one of them missing leaves it None, not a 0 s
    first token in the TTFT histogram."""
    _, it = make_stats()
    it.finished_requests[0] = drifted(it.finished_requests[0], "queued_time")
    (fin,) = vllm_stats.finished_requests(it)
    assert fin.fields["ttft_s"] is None and fin.fields["prefill_s"] == 0.2
    _, it = make_stats()
    (fin,) = vllm_stats.finished_requests(it)
    assert fin.fields["ttft_s"] == pytest.approx(0.3)
