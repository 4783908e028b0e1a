"""One algebra for interval counts: what two hubs counted adds up to what one hub fed both counted, and a
lifetime reading minus an earlier one is what a hub fed only the steps in between counted."""

from __future__ import annotations

import pytest

from specscope.core import intervals
from specscope.core.model import StepProfile, StepTime, Totals
from specscope.state.hub import Hub
from tests.verdict.test_verdict import Clock, steps


def fed(*parts: tuple[int, float, int, int]) -> tuple[Hub, Clock]:
    """A hub fed, for each part, a prefill step and decode steps: (batch, step seconds, steps, accepted)."""
    clock = Clock()
    hub = Hub(clock=clock)
    for batch, dt, n, accepted in parts:
        steps(hub, clock, batch, dt, n, accepted=accepted, prefill_s=0.01)
    return hub, clock


def counts(t: Totals) -> Totals:
    """The counts without the interval's length (which two hubs with their own clocks measure apart)."""
    return Totals(seconds=0.0, steps=t.steps, prompt_tokens=t.prompt_tokens, generation_tokens=t.generation_tokens,
                  requests=t.requests, preemptions=t.preemptions, prefix_cache_queries=t.prefix_cache_queries,
                  prefix_cache_hits=t.prefix_cache_hits, spec=t.spec,
                  step_times=StepProfile(t.step_times.times), prefills=t.prefills)


FIRST, SECOND = (1, 0.008, 20, 3), (4, 0.012, 30, 1)


def test_two_processes_counts_add_up_to_one_hubs() -> None:
    a, b, both = fed(FIRST)[0], fed(SECOND, FIRST)[0], fed(FIRST, SECOND, FIRST)[0]
    total = intervals.add(a.snapshot().lifetime, b.snapshot().lifetime)
    one = both.snapshot().lifetime
    assert counts(total).spec == one.spec and total.steps == one.steps and total.prefills == one.prefills
    assert counts(total).step_times.times == pytest.approx(one.step_times.times)  # step-weighted means
    assert total.seconds == max(a.snapshot().lifetime.seconds, b.snapshot().lifetime.seconds)  # the same interval


def test_a_lifetime_minus_an_earlier_one_is_what_came_between() -> None:
    hub, clock = fed(FIRST)
    earlier = hub.snapshot().lifetime
    steps(hub, clock, *SECOND[:3], accepted=SECOND[3], prefill_s=0.01)
    steps(hub, clock, *FIRST[:3], accepted=FIRST[3], prefill_s=0.01)
    later = hub.snapshot().lifetime
    between = intervals.since(later, earlier)
    only = fed(SECOND, FIRST)[0].snapshot().lifetime
    assert counts(between).spec == only.spec and between.generation_tokens == only.generation_tokens
    assert {t.batch_size: (t.steps, t.prefill_steps) for t in between.step_times.times} == \
        {t.batch_size: (t.steps, t.prefill_steps) for t in only.step_times.times}
    assert [t.mean_s for t in between.step_times.times] == pytest.approx([t.mean_s for t in only.step_times.times])
    assert between.seconds == pytest.approx(later.seconds - earlier.seconds)
    # Nothing new: no step rows, zero counts.
    nothing = intervals.since(later, later)
    assert nothing.step_times.times == () and nothing.generation_tokens == 0 and nothing.spec.drafts == 0  # type: ignore[union-attr]


def test_baselines_merge_as_step_weighted_means_keeping_the_first_setup() -> None:
    from specscope.verdict import merge_profiles

    a = StepProfile((StepTime(1, 10, 0.010), StepTime(8, 10, 0.020)), "calibration 1")
    b = StepProfile((StepTime(1, 30, 0.014),), "calibration 2")
    merged = merge_profiles([a, b])
    assert merged.source == "calibration 1" and [t.batch_size for t in merged.times] == [1, 8]
    assert merged.times[0].steps == 40 and merged.times[0].mean_s == pytest.approx((10 * 0.010 + 30 * 0.014) / 40)
    assert merged.times[1] == StepTime(8, 10, 0.020)
