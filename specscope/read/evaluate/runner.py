"""The engines of ``specscope evaluate``: the target without speculation throughout, one speculative engine at a
time beside it, measured round by round at each batch size (:class:`Runner`); with ``--gate``, the incumbent's
engine and then the candidate's, class by class on the same prompts (:meth:`Runner.run_gate`)."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from specscope.core import intervals
from specscope.core.model import StepProfile
from specscope.read.evaluate.choose import choose_schedule
from specscope.read.evaluate.results import Candidate, Cell, Evaluation, Forecast, GateArm, KRun
from specscope.read.evaluate.stats import acceptance_interval
from specscope.read.workload import Workload

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

    def run_gate(self, ev: Evaluation, work: Workload) -> None:
        """Measure the incumbent, then the candidate, at the gate's K beside the plain target, filling ``ev.gate``.

        At each batch size each traffic class runs in windows of its own prompts (:func:`class_rounds`), plain and
        speculative alternating which goes first, round after round. Round r of every engine starts at the same
        prompt of each class, r / rounds of the way through the class's prompts, so the two drafts are measured on
        the same held-out prompts in the same round (paired) and the rounds between them walk the class's prompts.
        No engine is served a prompt from a cache: prefix caching is off in every engine the gate starts (the command
        refuses ``--engine-arg enable_prefix_caching=true`` with ``--gate``), and each draft's engine is a process of
        its own started empty, so no prompt's KV is reused, within an engine or between the engines compared. An
        incumbent whose engine fails leaves the candidate unmeasured (nothing to compare with); a candidate whose
        engine fails is marked failed (the gate rejects it)."""
        gate = ev.gate
        assert gate is not None
        sizes = gate.batch_sizes
        groups = class_rounds(work)
        self._warm(self.plain, work, sizes)
        for i, (role, arm) in enumerate((("incumbent", gate.incumbent), ("candidate", gate.candidate))):
            cand = arm.candidate
            self.todo = {"start": 2 - i, "window": (2 - i) * self.rounds * len(sizes) * len(groups) * 2}
            label = f"[{role} {cand.short}]"
            try:
                self.spec = self._start(cand.config(gate.k))
                self._warm(self.spec, work, sizes)
                hub = self._gate_windows(arm, groups, sizes, label)
                cand.status = "measured"
                _gate_acceptance(arm, hub.snapshot(), gate.confidence)
            except KeyboardInterrupt:
                cand.status = "interrupted"
                raise
            except Exception as exc:  # a configuration vLLM refuses, or an engine that died
                cand.status, cand.note = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                self.progress(f"{label} failed: {cand.note}")
                if getattr(getattr(self.plain.llm_engine.engine_core, "resources", None), "engine_dead", False):
                    raise EngineStopped(f"the target without speculation stopped ({cand.note})") from None
                if role == "incumbent":
                    return
            finally:
                if self.spec is not None:
                    _shutdown(self.spec)
                    self.spec = None

    def _gate_windows(self, arm: GateArm, groups: dict[str, ClassPrompts], sizes: Sequence[int], label: str) -> Any:
        """The gate's rounds for one draft's engine (``self.spec``); returns the hub that recorded its requests."""
        from specscope.engine import vllm_engine
        from specscope.engine.measure import PromptOrder, steady_throughput
        from specscope.state.hub import Hub

        hub = Hub(window_s=3600, max_requests=100_000)
        vllm_engine.instrument(self.spec, hub)
        n = 0
        for r in range(self.rounds):
            for b in sizes:
                for name, group in groups.items():
                    order = PromptOrder(len(group.where), start=(r * len(group.where)) // self.rounds)
                    tok_s = {}
                    for who in (("plain", "spec") if n % 2 == 0 else ("spec", "plain")):
                        t0 = time.monotonic()
                        tok_s[who] = steady_throughput(self.plain if who == "plain" else self.spec, b, self.window_s,
                                                       group.prompts, group.max_tokens, [name] * len(group.where),
                                                       order, settle=True, warm=b)
                        self._done("window", time.monotonic() - t0)
                    n += 1
                    self.ran |= {group.where[j] for j in order.ran}
                    cell = arm.cells.setdefault(b, {}).setdefault(name, Cell())
                    cell.plain.append(tok_s["plain"])
                    cell.spec.append(tok_s["spec"])
                    self.progress(f"{label} batch {b} class {name} round {r + 1}/{self.rounds}: "
                                  f"{tok_s['spec'] / tok_s['plain']:.2f}x (plain {tok_s['plain']:.0f} tok/s, "
                                  f"speculative {tok_s['spec']:.0f}); {self.left()}")
        return hub

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


class ClassPrompts(NamedTuple):
    """One traffic class's prompts of a workload: where they are in it, the prompts and their output lengths."""

    where: list[int]
    prompts: list[dict[str, list[int]]]
    max_tokens: list[int]


def class_rounds(work: Workload) -> dict[str, ClassPrompts]:
    """The workload's prompts by class (in file order within a class; classes by name), as the gate's windows take
    them: each window runs one class's prompts alone."""
    out: dict[str, ClassPrompts] = {}
    for i, name in enumerate(work.classes):
        group = out.setdefault(name or "(unclassed)", ClassPrompts([], [], []))
        group.where.append(i)
        group.prompts.append(work.prompts[i])
        group.max_tokens.append(work.max_tokens[i])
    return dict(sorted(out.items()))


def _gate_acceptance(arm: GateArm, snap: Any, confidence: float) -> None:
    """Each class's acceptance over the draft's measured requests, with its interval over requests."""
    arm.acceptance = {tc.name: tc.lifetime for tc in snap.classes if tc.lifetime.draft_tokens}
    per: dict[str, list[tuple[int, int]]] = {}
    for r in snap.requests:
        if r.class_name is not None and r.draft_tokens:
            per.setdefault(r.class_name, []).append((r.draft_tokens, r.accepted_tokens or 0))
    arm.acceptance_interval = {name: iv for name, rows in per.items()
                               if (iv := acceptance_interval(rows, confidence)) is not None}
