"""The engines of ``specscope evaluate``: the target without speculation throughout, one speculative engine at a
time beside it, measured round by round at each batch size (:class:`Runner`)."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from specscope.core import intervals
from specscope.core.model import StepProfile
from specscope.read.evaluate.choose import choose_schedule
from specscope.read.evaluate.results import Candidate, Cell, Evaluation, Forecast, KRun
from specscope.read.evaluate.workload import Workload

#: Each engine's share of a GPU's memory (vLLM's ``gpu_memory_utilization``, a per-engine budget) where the plain
#: target and a candidate run side by side on it: vLLM's default 0.92 for the first leaves the second no room.
GPU_SHARE = 0.45


def gpu_memory_split(engine_kw: dict[str, Any]) -> float | None:
    """The ``gpu_memory_utilization`` to give each engine: :data:`GPU_SHARE` on a GPU unless set, else None."""
    if "gpu_memory_utilization" in engine_kw:
        return None
    from vllm.platforms import current_platform

    return None if current_platform.is_cpu() else GPU_SHARE


class EngineStopped(RuntimeError):
    """The target without speculation stopped: nothing more can be measured (exit code 1, partial results)."""


def _shutdown(llm: Any) -> None:
    """Stop an engine's worker processes (:func:`specscope.engine.measure.stop_engine`); never raises (an interrupted
    engine
    may be half gone)."""
    from specscope.engine.measure import stop_engine
    from specscope.engine.vllm_engine import uninstrument

    with contextlib.suppress(Exception):
        uninstrument(llm)
    stop_engine(llm)
    gc.collect()


class Runner:
    """Runs the engines: the plain target throughout, one speculative engine at a time beside it."""

    def __init__(self, target: str, engine_kw: dict[str, Any], rounds: int, window_s: float,
                 progress: Callable[[str], None]) -> None:
        self.target, self.engine_kw, self.rounds, self.window_s = target, engine_kw, rounds, window_s
        self.progress = progress
        self.plain: Any = None
        self.spec: Any = None
        #: Seconds an engine start and a window took (for the time left).
        self.took: dict[str, list[float]] = {"start": [], "window": []}
        self.todo: dict[str, int] = {"start": 0, "window": 0}
        #: Indexes of the workload's prompts that some window ran.
        self.ran: set[int] = set()

    def start_plain(self) -> tuple[Any, int, int]:
        """Start the target without speculation: its tokenizer, max_model_len and max_num_seqs."""
        from specscope.engine import wrapper
        from specscope.state.hub import Hub

        self.plain = wrapper.LLM(self.target, specscope_hub=Hub(), **self.engine_kw)
        config = self.plain.llm_engine.vllm_config
        return self.plain.get_tokenizer(), config.model_config.max_model_len, config.scheduler_config.max_num_seqs

    def close(self) -> None:
        """Stop every engine still running."""
        from specscope.engine.measure import wait_stopped

        for llm in (self.spec, self.plain):
            if llm is not None:
                _shutdown(llm)
        self.spec = self.plain = None
        wait_stopped()

    # -- time left
    def _plan(self, candidates: int, ks: int, batches: int) -> None:
        """What is left for ``candidates`` more candidates (each: its Ks and maybe a schedule run)."""
        self.todo = {"start": candidates * (ks + 1), "window": candidates * (ks + 1) * self.rounds * batches * 2}

    def _done(self, kind: str, seconds: float) -> None:
        self.took[kind].append(seconds)
        self.todo[kind] = max(0, self.todo[kind] - 1)

    def left(self) -> str:
        """The time left, estimated from what each kind of work took so far."""
        guess = {"start": 40.0, "window": self.window_s * 1.1 + 0.5}
        s = sum(n * (statistics.mean(self.took[kind]) if self.took[kind] else guess[kind])
                for kind, n in self.todo.items())
        return f"about {int(s // 60)}m{int(s % 60):02d}s left"

    # -- measuring
    def run(self, ev: Evaluation, work: Workload, max_batch: int) -> None:
        """Measure every candidate not refused, filling ``ev`` as it goes (an interrupt leaves what was measured)."""
        ks, sizes = ev.settings["k"], ev.settings["batch_sizes"]
        one_k = ev.settings.get("data_parallel_size", 1) > 1
        todo = [c for c in ev.candidates if c.status == "pending"]
        self._warm(self.plain, work, sizes)
        for i, cand in enumerate(todo):
            self._plan(len(todo) - i, len(ks), len(sizes))
            label = f"[{i + 1}/{len(todo)} {cand.short}]"
            try:
                for k in ks:
                    run = cand.runs.setdefault(k, KRun(k))
                    for b, forecast in cand.forecast.items():  # predicted before it is measured
                        forecast.predict(run.cells.setdefault(b, Cell()), k)
                    self.spec = self._start(cand.config(k))
                    hub, plain = self._measure(self.spec, run.cells, work, sizes, f"{label} K={k}")
                    self._predict(cand, run, hub, plain, sizes)
                    _shutdown(self.spec)
                    self.spec = None
                cand.schedule = choose_schedule(cand, sizes, max_batch, one_k)
                sched = cand.schedule
                if sched is not None and sched.config is not None and sched.same_as_k is None:
                    for ch in sched.choices:
                        if (ahead := cand.forecast.get(ch.batch_size)) is not None:
                            ahead.predict(sched.cells.setdefault(ch.batch_size, Cell()), ch.k)
                    self.spec = self._start({**cand.config(1), **sched.config})
                    self._measure(self.spec, sched.cells, work, sizes, f"{label} schedule")
                    _shutdown(self.spec)
                    self.spec = None
                cand.status = "measured"
            except KeyboardInterrupt:
                cand.status = "interrupted"
                if cand.runs and cand.schedule is None:
                    cand.schedule = choose_schedule(cand, sizes, max_batch, one_k)
                raise
            except Exception as exc:  # a configuration vLLM refuses: that candidate fails, the others go on
                cand.status, cand.note = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                self.progress(f"{label} failed: {cand.note}")
                if self.spec is not None:
                    _shutdown(self.spec)
                    self.spec = None
                if getattr(getattr(self.plain.llm_engine.engine_core, "resources", None), "engine_dead", False):
                    raise EngineStopped(f"the target without speculation stopped ({cand.note})") from None

    def _start(self, spec_config: dict[str, Any]) -> Any:
        from specscope.engine import wrapper
        from specscope.state.hub import Hub

        t0 = time.monotonic()
        llm = wrapper.LLM(self.target, specscope_hub=Hub(), speculative_config=spec_config,
                            **self.engine_kw)
        self._done("start", time.monotonic() - t0)
        return llm

    def _warm(self, llm: Any, work: Workload, sizes: Sequence[int]) -> None:
        """A few tokens at each batch size: a fresh engine's first steps are slower."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        for b in sizes:
            llm.generate([work.prompts[i % len(work.prompts)] for i in range(b)], params, use_tqdm=False)

    def _measure(self, spec: Any, cells: dict[int, Cell], work: Workload, sizes: Sequence[int],
                 label: str) -> tuple[Any, StepProfile]:
        """Rounds of plain and speculative throughput at each batch size (which goes first alternating); returns
        the hub that recorded the speculative engine's measured runs, and the plain engine's step times in them."""
        from specscope.engine import vllm_engine
        from specscope.engine.measure import PromptOrder, median_rows, steady_throughput
        from specscope.state.hub import Hub

        self._warm(spec, work, sizes)
        hub = Hub(window_s=3600, max_requests=100_000)
        vllm_engine.instrument(spec, hub)
        plain_rounds = []
        # Every run walks the workload (its classes interleaved) through to its end, window after window, plain and
        # speculative on the same stretch of it, every run alike: the whole file is measured, not its first prompts.
        order = PromptOrder(len(work.prompts))
        for r in range(self.rounds):
            before = self.plain.snapshot().lifetime.step_times
            for i, b in enumerate(sizes):
                cell = cells.setdefault(b, Cell())
                tok_s = {}
                for name in (("plain", "spec") if (r + i) % 2 == 0 else ("spec", "plain")):
                    t0 = time.monotonic()
                    # Counted once the batch's first prompts are in and it turned over once: a window from a
                    # fresh batch weighs its first prompts' prefill as served traffic does not (on ~450-token
                    # prompts at batch 16, 0.96-1.06x measured against 1.07-1.09x counted after a turnover).
                    tok_s[name] = steady_throughput(self.plain if name == "plain" else spec, b, self.window_s,
                                                    work.prompts, work.max_tokens, work.classes, order, settle=True,
                                                    warm=b)
                    self._done("window", time.monotonic() - t0)
                order.next_window()
                self.ran |= order.ran
                cell.plain.append(tok_s["plain"])
                cell.spec.append(tok_s["spec"])
                self.progress(f"{label} batch {b} round {r + 1}/{self.rounds}: {tok_s['spec'] / tok_s['plain']:.2f}x "
                              f"(plain {tok_s['plain']:.0f} tok/s, speculative {tok_s['spec']:.0f}); {self.left()}")
            plain_rounds.append(intervals.since(self.plain.snapshot().lifetime.step_times, before))
        setup = self.plain.snapshot().engine.setup
        # No fit of the forward: timed in the same moments as the candidate, the baseline needs no anchor.
        return hub, StepProfile(tuple(median_rows(plain_rounds, sizes)),
                                "the target without speculation, alternated with this one on the workload", setup)

    def _predict(self, cand: Candidate, run: KRun, hub: Any, plain: StepProfile, sizes: Sequence[int]) -> None:
        """specscope's estimate of the run against ``plain``, the target's step times without speculation in the same
        windows (the same prompts and contexts, the machine as it ran then): at this K it explains these windows; for
        the candidate's first K it is also the forecast of every other K and the schedule, made before they are
        measured. Acceptance by position and class; the draft's KV cost."""
        from specscope.core.memory import draft_kv_cost
        from specscope.verdict import estimate

        hub.set_baseline(plain)
        snap = hub.snapshot()
        first = cand.forecast_k is None
        if first:
            cand.forecast_k = run.k
        for b in sizes:
            est = estimate(snap, batch_size=b)
            if est is not None and b in run.cells:
                run.cells[b].explained = est.expected_speedup
                run.k0_price[b] = est.k0_speedup
                if first:
                    cand.forecast[b] = Forecast(est.by_k, est.low, est.high, est.k0_speedup)
        spec = snap.lifetime.spec
        if spec is not None:
            run.acceptance, run.alpha, run.per_position = spec.acceptance_rate, spec.alpha, tuple(spec.per_position)
        run.by_class = {tc.name: tc.lifetime for tc in snap.classes if tc.lifetime.draft_tokens}
        kv = draft_kv_cost(snap)
        if kv is not None and cand.draft_kv is None:
            cand.draft_kv = {"blocks": round(kv.blocks, 1), "share": round(kv.share, 4), "text": kv.explain()}
