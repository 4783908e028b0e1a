"""The hub: window arithmetic, request joining, bounds, thread safety, failure isolation."""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
import tracemalloc
from typing import Any

import pytest

from specscope.core import codec
from specscope.core.counts import StepBatch
from specscope.core.model import EngineInfo, GpuMemory
from specscope.state.hub import Hub, StepStats


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def spec_step(drafts: int, accepted_per_draft: list[int], k: int = 4, **kw: Any) -> StepStats:
    per_pos = [sum(1 for a in accepted_per_draft if a > i) for i in range(k)]
    return StepStats(
        num_spec_tokens=k,
        drafts=drafts,
        draft_tokens=drafts * k,
        accepted=sum(accepted_per_draft),
        accepted_per_pos=per_pos,
        draft_tokens_per_pos=[drafts] * k,
        **kw,
    )


def test_window_slides_and_lifetime_accumulates() -> None:
    clock = Clock()
    hub = Hub(window_s=10, clock=clock)
    hub.record_step(spec_step(2, [4, 4], generation_tokens=10))
    clock.t += 5
    hub.record_step(spec_step(2, [0, 0], generation_tokens=2))
    snap = hub.snapshot()
    assert snap.window.spec.drafts == 4 and snap.window.spec.accepted == 8
    assert snap.window.spec.acceptance_rate == pytest.approx(0.5)
    clock.t += 6  # the first step is now 11 s old
    snap = hub.snapshot()
    assert snap.window.spec.drafts == 2 and snap.window.spec.acceptance_rate == 0.0
    assert snap.window.generation_tokens == 2
    assert snap.window.seconds == 10
    assert snap.window.generation_tokens_per_s == pytest.approx(0.2)
    assert snap.lifetime.spec.drafts == 4 and snap.lifetime.spec.accepted == 8
    assert snap.lifetime.spec.accepted_per_pos == (2, 2, 2, 2)
    assert snap.lifetime.generation_tokens == 12
    clock.t += 30
    snap = hub.snapshot()
    assert snap.window.spec.drafts == 0 and snap.window.spec.acceptance_rate is None
    assert snap.lifetime.spec.drafts == 4


def test_lifetime_counts_every_step_once_past_the_kept_history() -> None:
    """Each step is added once, to its second; the seconds join the lifetime as they end. Past the kept history,
    across window resets and a longer window, and with a clock that steps back, every step counts exactly once."""
    clock = Clock()
    hub = Hub(window_s=2, history_s=3, clock=clock)
    for i in range(40):
        hub.record_step(spec_step(1, [i % 5], generation_tokens=1))
        hub.record_step(spec_step(1, [1], generation_tokens=1), engine_index=1)
        steps = i + 1
        clock.t += (0.4, 0.7, -0.5, 1.3)[i % 4]  # several steps a second, a clock step back, a skipped second
        if i == 17:
            hub.reset_window()
        if i == 25:
            hub.set_window(8)  # longer than the history: the window starts empty, the lifetime goes on
        life = hub.snapshot().lifetime
        assert life.steps == 2 * steps and life.generation_tokens == 2 * steps
        assert life.spec.accepted == sum(j % 5 for j in range(steps)) + steps
    by_engine = {e.index: e.lifetime.steps for e in hub.snapshot().engines}
    assert by_engine == {0: 40, 1: 40}
    snap = hub.snapshot()
    assert snap.window.steps == 2 * (40 - 26)  # the steps since the longer window began (under 8 s ago)


def test_steps_added_in_batches_count_as_steps_added_one_by_one() -> None:
    """The stat logger adds a few steps at a time: batches spanning several seconds, a clock step back, steps
    carrying prefill, timed decode steps of several batch sizes and draft lengths give the same lifetime, window,
    step times, gauges and KV estimate as the same steps added one at a time."""
    import random

    rng = random.Random(7)
    t, steps = 1_000_000.0, []
    for i in range(300):
        t += rng.choice((0.05, 0.2, 0.45, -0.3, 1.2))
        batch = rng.choice((1, 2, 8))
        accepted = [rng.randrange(5) for _ in range(batch)]
        prefill = i % 9 == 0
        s = spec_step(batch, accepted, running=batch - (i % 5 == 0), waiting=i % 3, kv_usage=i / 300,
                      prompt_tokens=30 * prefill, generation_tokens=batch + sum(accepted), finished=i % 5 == 0,
                      finished_tokens=40 * (i % 5 == 0), batch=batch, prefill=prefill, first_tokens=prefill,
                      first_token_s=0.2 if prefill else None, decode_s=None if prefill else 0.01 * batch)
        if i % 7 == 0:  # drafts of mixed lengths
            s.draft_tokens_per_pos = [batch, batch, max(0, batch - 1), 0]
        steps.append((t, s))
    clock = Clock(t)
    one, batched = Hub(window_s=5, history_s=8, clock=clock), Hub(window_s=5, history_s=8, clock=clock)
    for step in steps:
        one.record_steps(3, StepBatch.of([step]))
    i = 0
    while i < len(steps):
        n = rng.randrange(1, 40)
        batched.record_steps(3, StepBatch.of(steps[i:i + n]))
        i += n
    a, b = one.snapshot(), batched.snapshot()
    assert a.lifetime.steps == 300 and a.window.steps > 0
    assert (a.lifetime, a.window, a.engines, a.kv) == (b.lifetime, b.window, b.engines, b.kv)


def test_window_rate_uses_elapsed_time_while_young_and_resets() -> None:
    clock = Clock()
    hub = Hub(window_s=60, clock=clock)
    hub.record_step(StepStats(generation_tokens=30))
    clock.t += 3
    snap = hub.snapshot()
    assert snap.window.seconds == pytest.approx(3)
    assert snap.window.generation_tokens_per_s == pytest.approx(10)
    hub.reset_window()
    assert hub.snapshot().window.generation_tokens == 0
    assert hub.snapshot().lifetime.generation_tokens == 30
    hub.set_window(5)
    assert hub.snapshot().window_seconds == 5
    with pytest.raises(ValueError):
        hub.set_window(0)


def test_request_parts_are_joined_and_listeners_get_one_complete_record() -> None:
    hub = Hub()
    hub.requests.expect_parts(2)
    got: list[Any] = []
    hub.requests.add_listener(got.append)
    hub.requests.record("a", prompt_tokens=10, generation_tokens=20, e2e_s=1.0)
    hub.wait_idle()
    assert got == []
    hub.requests.record("a", spec_steps=5, draft_tokens=20, accepted_tokens=10, acceptance_histogram=(1, 1, 1, 1, 1))
    hub.wait_idle()
    assert len(got) == 1
    rec = got[0]
    assert rec.prompt_tokens == 10 and rec.accepted_tokens == 10
    assert rec.acceptance_rate == 0.5 and rec.mean_acceptance_length == 3.0
    snap = hub.snapshot()
    assert [r.request_id for r in snap.requests] == ["a"]
    assert snap.request_acceptance_rate is None  # no speculation configured on this hub's engine


def test_a_request_missing_its_second_part_is_released_after_a_timeout() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.requests.expect_parts(2)
    got: list[Any] = []
    hub.requests.add_listener(got.append)
    hub.requests.record("lonely", e2e_s=1.0)
    clock.t += hub.requests.PENDING_TIMEOUT_S + 0.1
    hub.record_step(StepStats())
    hub.wait_idle()
    assert [r.request_id for r in got] == ["lonely"]


def test_pending_records_are_released_while_the_engine_is_idle() -> None:
    clock = Clock()
    hub = Hub(clock=clock)
    hub.requests.expect_parts(2)
    got: list[Any] = []
    hub.requests.add_listener(got.append)
    hub.requests.record("idle", e2e_s=1.0)
    clock.t += hub.requests.PENDING_TIMEOUT_S + 0.1
    deadline = time.monotonic() + 5.0
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [r.request_id for r in got] == ["idle"]


def test_a_part_that_comes_after_its_record_was_released_amends_it_and_counts_once() -> None:
    """The join path: a response's part is released alone, then the engine's part comes (the stat logger's batch
    was late). One request, one publication, its draft tokens once; the late numbers still reach the record and
    the histograms."""
    clock = Clock()
    hub = Hub(clock=clock)
    hub.set_engine(EngineInfo(num_speculative_tokens=4))
    hub.requests.expect_parts(2)
    got: list[Any] = []
    hub.requests.add_listener(got.append)
    hub.requests.record("late", e2e_s=1.0, ttft_s=0.2)
    clock.t += hub.requests.PENDING_TIMEOUT_S + 0.1
    hub.record_step(StepStats())
    hub.requests.record("late", e2e_s=1.0, ttft_s=None, spec_steps=5, draft_tokens=20, accepted_tokens=10,
                       acceptance_histogram=(1, 1, 1, 1, 1))
    hub.record_step(StepStats())
    clock.t += 2 * hub.requests.PENDING_TIMEOUT_S
    hub.record_step(StepStats())
    hub.wait_idle()
    assert [r.request_id for r in got] == ["late"]
    snap = hub.snapshot()
    assert snap.attributed is not None
    assert (snap.attributed.requests, snap.attributed.draft_tokens, snap.attributed.accepted) == (1, 20, 10)
    (rec,) = snap.requests
    assert rec.ttft_s == 0.2 and rec.accepted_tokens == 10  # the engine's unknown TTFT kept the response's
    assert snap.request_duration is not None and snap.request_duration.count == 1
    assert snap.request_acceptance_rate is not None and snap.request_acceptance_rate.count == 1


def test_the_stat_logger_keeps_steps_for_less_time_than_a_record_waits_for_its_part() -> None:
    from specscope.engine.vllm_logger import BATCH_S
    from specscope.state.request_store import RequestStore

    assert BATCH_S < RequestStore.PENDING_TIMEOUT_S


def test_request_history_is_bounded() -> None:
    hub = Hub(max_requests=100)
    for i in range(1000):
        hub.requests.record(str(i), e2e_s=0.1)
    snap = hub.snapshot()
    assert len(snap.requests) == 100
    assert snap.requests[0].request_id == "900" and snap.requests[-1].seq == 1000


def test_memory_is_flat_over_many_requests_and_steps() -> None:
    hub = Hub(max_requests=1000)
    fields = {"prompt_tokens": 10, "generation_tokens": 20, "spec_steps": 5, "draft_tokens": 20,
              "accepted_tokens": 10, "acceptance_histogram": (1, 1, 1, 1, 1)}

    def feed(start: int, n: int) -> None:
        for i in range(start, start + n):
            hub.requests.record(str(i), **fields)
            hub.record_step(spec_step(1, [2]))

    def held() -> int:
        """Bytes allocated from specscope's code (other tests' exporter and alert threads may still be running); a
        full collection first empties CPython's free lists, whose cached tuples tracemalloc counts as held."""
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/specscope/*")])
        return sum(stat.size for stat in snap.statistics("filename"))

    feed(0, 10_000)
    tracemalloc.start()
    feed(10_000, 10_000)
    base = held()
    feed(20_000, 30_000)  # 30 times the records kept: a leak of 2 bytes a request shows
    after = held()
    tracemalloc.stop()
    assert base > 100_000 and after - base < 50_000, (base, after)  # bytes: what it holds does not grow


def test_concurrent_writers_lose_nothing() -> None:
    hub = Hub()

    def writer(w: int) -> None:
        for i in range(2000):
            hub.record_step(spec_step(1, [1], generation_tokens=1))
            hub.requests.record(f"{w}-{i}", e2e_s=0.0)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        hub.snapshot()
    for t in threads:
        t.join()
    snap = hub.snapshot()
    assert snap.lifetime.generation_tokens == 8000
    assert snap.lifetime.spec.drafts == 8000 and snap.lifetime.spec.accepted == 8000


def test_failures_are_counted_always_and_logged_once(caplog: Any) -> None:
    hub = Hub(gpu_poll_s=0)
    hub.add_gpu_source("flaky", lambda: 1 / 0)
    hub.requests.add_listener(lambda rec: (_ for _ in ()).throw(RuntimeError("boom")))
    with caplog.at_level(logging.WARNING, logger="specscope"):
        for i in range(5):
            hub.snapshot()
            hub.requests.record(str(i))
        hub.wait_idle()
        deadline = time.monotonic() + 5  # the GPU thread polls every 10 ms here, failing each time
        while dict(hub.snapshot().health.errors).get("gpu source flaky", 0) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    errors = dict(hub.snapshot().health.errors)
    assert errors["gpu source flaky"] >= 5
    assert sum(n for k, n in errors.items() if k.startswith("listener")) == 5
    assert len(caplog.records) == 2
    assert hub.snapshot().health.last_error


def test_full_listener_queue_drops_and_counts() -> None:
    hub = Hub()
    hub.requests._dispatch.queue.maxsize = 3
    gate = threading.Event()
    hub.requests.add_listener(lambda rec: gate.wait(5))
    for i in range(10):
        hub.requests.record(str(i))
    dropped = hub.snapshot().health.dropped_records
    gate.set()
    assert 6 <= dropped <= 7  # one may already be in the listener's hands


def test_gpu_source_is_polled_in_the_background_never_by_a_reader() -> None:
    calls = []

    def source() -> GpuMemory:
        calls.append(threading.current_thread().name)
        return GpuMemory(status="ok")

    hub = Hub(gpu_poll_s=0.05)
    hub.add_gpu_source("fake", source)
    assert hub.snapshot().gpu.status == "ok"  # read once when added
    n = len(calls)
    for _ in range(20):
        hub.snapshot()
    assert len(calls) - n <= 1  # snapshots read the last value; they do not poll
    deadline = time.monotonic() + 5
    while len(calls) < n + 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(calls) >= n + 3 and set(calls[n:]) == {"specscope-gpu"}  # kept fresh by its own thread


def test_kv_token_estimate_follows_live_requests() -> None:
    from specscope.core.model import EngineInfo

    hub = Hub()
    hub.set_engine(EngineInfo(block_size=16, num_blocks=11))  # 160 usable token slots
    hub.record_step(StepStats(running=2, waiting=0, kv_usage=0.5, prompt_tokens=40, generation_tokens=2))
    kv = hub.snapshot().kv
    assert kv.tokens_held == 42 and kv.capacity_tokens == 160
    assert kv.token_usage == pytest.approx(42 / 160)
    assert kv.fragmentation == pytest.approx(1 - (42 / 160) / 0.5)
    assert kv.blocks_used == 5
    hub.record_step(StepStats(running=1, waiting=0, kv_usage=0.2, generation_tokens=2, finished=1, finished_tokens=30))
    assert hub.snapshot().kv.tokens_held == 14
    hub.record_step(StepStats(running=0, waiting=0, kv_usage=0.0, finished=1, finished_tokens=9))
    kv = hub.snapshot().kv
    assert kv.tokens_held == 0 and kv.fragmentation is None


def test_snapshot_is_json_ready_and_immutable() -> None:
    hub = Hub()
    hub.record_step(spec_step(1, [3]))
    hub.requests.record("x", spec_steps=1, draft_tokens=4, accepted_tokens=3, acceptance_histogram=(0, 0, 0, 1, 0))
    snap = hub.snapshot()
    d = json.loads(json.dumps(codec.to_dict(snap)))
    assert d["lifetime"]["spec"]["acceptance_rate"] == 0.75
    assert d["requests"][0]["mean_acceptance_length"] == 4.0
    with pytest.raises(AttributeError):
        snap.lifetime.spec.drafts = 5  # type: ignore[misc]


def test_the_wire_format_is_versioned() -> None:
    """Every document says its wire version; one from a newer specscope is refused with one line, one without a
    version (recorded before versions were) reads as version 1, and the endpoint's pieces carry it too."""
    hub = Hub()
    hub.record_step(spec_step(1, [3]))
    hub.requests.record("x", spec_steps=1, draft_tokens=4, accepted_tokens=3)
    snap = hub.snapshot()
    d = json.loads(json.dumps(codec.to_dict(snap)))
    assert d["wire_version"] == codec.WIRE_VERSION == 1
    assert codec.from_dict(d) == snap
    assert json.loads(b"".join(codec.encode(snap)))["wire_version"] == 1
    del d["wire_version"]
    assert codec.from_dict(d) == snap
    with pytest.raises(ValueError, match="wire version 2 by a newer specscope; this one reads up to 1: upgrade"):
        codec.from_dict({**d, "wire_version": 2})


def test_acceptance_by_output_position_bins_each_step_where_it_drafted() -> None:
    """A step drafts at the output position its request reached (the first token is prefill's); each bin of
    ``OUTPUT_POSITION_BOUNDS`` holds the steps whose position is at least its lower bound."""
    import random

    from specscope.core.model import OUTPUT_POSITION_BOUNDS

    rng = random.Random(3)
    hub = Hub()
    expected = [[0, 0] for _ in range(len(OUTPUT_POSITION_BOUNDS) + 1)]
    for i in range(20):
        accepted = [4] * 1200 if i == 0 else [rng.randint(0, 4) for _ in range(rng.randint(0, 1500))]
        position = 1
        for a in accepted:
            row = expected[sum(1 for b in OUTPUT_POSITION_BOUNDS if b <= position)]
            row[0] += 4
            row[1] += a
            position += a + 1
        hub.requests.record_positions(accepted, [4] * len(accepted))
    positions = hub.snapshot().acceptance_by_output_position
    assert positions is not None
    assert [list(x) for x in zip(positions.draft_tokens, positions.accepted, strict=True)] == expected
    assert positions.draft_tokens[-1] > 0  # past the last bound


def test_an_over_counting_token_estimate_shows_instead_of_being_clamped() -> None:
    """docs/kv-cache.md: the estimate is never clamped; an over-count reads above the block usage (negative
    fragmentation), not as a perfectly packed cache."""
    from specscope.core.model import KVCache

    kv = KVCache(block_size=16, num_blocks=11, block_usage=0.5, tokens_held=120)
    assert kv.token_usage == pytest.approx(0.75)
    assert kv.fragmentation == pytest.approx(-0.5)
    assert KVCache(block_size=16, num_blocks=11, block_usage=1.0, tokens_held=200).token_usage == pytest.approx(1.25)


def test_the_summary_of_an_engine_without_kv_data_says_n_a_once() -> None:
    """An engine that reported no KV numbers: "n/a", never "None of None-token blocks"."""
    from specscope.export.summary import summary

    text = summary(Hub().snapshot())
    assert "kv cache blocks n/a  tokens n/a" in text and "None" not in text
