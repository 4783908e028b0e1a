"""``specscope demo``: a real vLLM engine walked through the situations specscope exists for, dashboard open.

Over 400 lines on purpose: the scenarios read top to bottom as the walk-through the demo shows.

Scenarios, one engine at a time (the deep family of local models, where speculation really pays on a CPU; greedy
decoding):

1. tokenizer check: a draft whose tokenizer has the target's vocabulary size but other ids (vLLM would run it);
2. baseline: the 12-layer target alone, calibrated at batch 1 and 16 (what makes the verdict measured);
3. good draft (the target's own first layer, K=6): about 2x faster at batch 1; at batch 16 verifying costs nearly
   what it saves. specscope watches it serve one sample of the traffic and states, against scenario 2's baseline,
   what each batch size will run at, at K=6 and at the K schedule it advises; then both are measured against the
   plain engine (run alternately) on another sample, and each measurement is shown beside what was predicted before
   it;
4. weak draft (a target whose later layers matter more, so its first layer predicts it badly): acceptance under
   30%, the weak-draft and not-paying alerts fire, and the recommended K is 0;
5. traffic classes: a draft that follows some prompts and not others, sent as two classes; the engine-wide
   acceptance looks fine while the badly predicted class's alert fires.

Each scenario is a target in the dashboard's fleet; the screen follows the running one. ``--headless`` runs the
same scenarios without the screen and prints each scenario's summary and the alerts that fired.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specscope.core.model import EngineInfo, StepProfile
from specscope.engine.measure import PromptOrder
from specscope.export.alerts.rules import Thresholds
from specscope.read.fleet import Target
from specscope.read.scrape import HubSource
from specscope.read.workload import output_lengths
from specscope.state.hub import Hub
from specscope.verdict.baseline import MAX_ROUNDS

#: Short windows and waits so that every alert can come alive within the demo's few minutes.
DEMO_THRESHOLDS = Thresholds(weak_draft_min_draft_tokens=100, weak_draft_for_s=3, keep_firing_for_s=600,
                             fragmentation_for_s=5, kv_pressure_for_s=5, collapse_for_s=5, divergence_for_s=5,
                             window_s=30)
WINDOW_S = 30.0
GOOD_K = 6
WEAK_K = 4
SCENARIOS = ("tokenizer check", "baseline (no speculation)", f"good draft (layer 0, K={GOOD_K})",
             "weak draft (f=0.1)", "traffic classes (noise draft)")
#: Batch sizes shown: one request at a time, and a batch where, on a 2-core CPU, speculation stops paying.
BATCHES = (1, 16)
TOKENS = 96
#: Seconds of each engine's window in a round of the good draft's measured speedup.
ROUND_S = 4.0
#: Seconds the good draft serves the first sample at each batch size before specscope predicts.
PREDICT_S = 6.0
#: Prefix caching off, as in the benchmarks and ``specscope evaluate``: the plain engine, warm from the calibration and
#: every round before, served a third of the good draft's prompt tokens from its cache while the speculative engine
#: (fresh, and vLLM's draft-model path hitting none) prefilled them all, which measured batch 16 about 5% under
#: served traffic, where both engines see new prompts.
ENGINE: dict[str, Any] = {"enforce_eager": True, "dtype": "float32", "max_model_len": 1024, "seed": 0,
                          "enable_prefix_caching": False}


class Demo:
    """The scenarios; ``say`` reports progress, ``show`` brings a target to the screen."""

    def __init__(self, say: Callable[[str], None], show: Callable[[str], None]) -> None:
        from specscope import tiny_models

        self.say, self.show = say, show
        self.models = tiny_models.build()
        self.prompts = tiny_models.prompts(64, seed=5)
        self.lengths = output_lengths(len(self.prompts), TOKENS, seed=5)
        #: What the good draft's prediction is measured on: other prompts, with their own output lengths.
        self.sample_b = (tiny_models.prompts(64, seed=6), output_lengths(64, TOKENS, seed=6))
        self.hubs = {name: Hub(window_s=WINDOW_S) for name in SCENARIOS}
        self.measured: dict[int, float] = {}

    def run(self) -> None:
        """All scenarios, in order."""
        self.tokenizer_check()
        plain, good, baseline = self.baseline()
        self.good_draft(plain, good)
        self._close(plain)
        self.weak_draft(baseline)
        self.traffic_classes()
        from specscope.engine.measure import wait_stopped

        wait_stopped()
        self.say("done: every scenario ran. Keys: tab/enter to pick an engine in the fleet, ? for help, q to quit")

    def tokenizer_check(self) -> None:
        from specscope.core.tokenizer_check import compare

        name = SCENARIOS[0]
        target, draft = str(self.models["target"]), str(self.models["other-tokenizer"])
        self.show(name)
        self.say("1/5 tokenizer check: a draft with the target's vocabulary size but other token ids")
        report = compare(target, draft)
        hub = self.hubs[name]
        hub.set_engine(EngineInfo(model=target, draft_model=draft, method="draft_model", num_speculative_tokens=4))
        hub.set_tokenizer(report.status())
        self.say(f"1/5 tokenizer check: {report.verdict}; vLLM only compares vocabulary sizes and would run it")

    def _engine(self, name: str, family: str, k: int | None, baseline: StepProfile | None = None) -> Any:
        import specscope

        spec: dict[str, Any] = {} if k is None else {"speculative_config": {
            "method": "draft_model", "model": str(self.models[f"{family}-draft"]), "num_speculative_tokens": k}}
        return specscope.LLM(str(self.models[f"{family}-target"]), specscope_hub=self.hubs[name],
                             specscope_baseline=baseline, **spec, **ENGINE)

    def _tok_s(self, llm: Any, batch: int, seconds: float = 6.0, order: PromptOrder | None = None,
               sample: tuple[list[str], list[int]] | None = None) -> float:
        """Throughput with ``batch`` requests held in flight (each finished one replaced), as a server runs; with
        ``order``, walking through the prompts (``sample``'s, else the first sample's) with their own output
        lengths, counted once the first are in."""
        from specscope.engine.measure import steady_throughput

        if order is None:
            return steady_throughput(llm, batch, seconds, self.prompts, TOKENS)
        prompts, lengths = sample or (self.prompts, self.lengths)
        return steady_throughput(llm, batch, seconds, prompts, lengths, order=order, settle=True)

    @staticmethod
    def _close(llm: Any) -> None:
        from specscope.engine.measure import stop_engine

        stop_engine(llm)

    def baseline(self) -> tuple[Any, Any, StepProfile]:
        """The plain target, the good draft's engine (idle, started here) and the baseline: the plain target's
        steps timed as `specscope calibrate` times them by default, the only baseline every draft is priced against.
        Timed with the good draft's engine idle beside it, as the good draft later runs with the plain one idle
        beside it: an idle vLLM engine still takes ~13% of a core here, and a baseline timed alone priced the plain
        step 15-33% under the one served beside another engine (benchmarks/bench_truth_user.py)."""
        from specscope.engine.measure import measure_step_times

        name = SCENARIOS[1]
        self.show(name)
        self.say("2/5 baseline: starting the 12-layer target alone, and the good draft's engine beside it (about 25 s "
                 "each on a CPU)")
        llm = self._engine(name, "deep01", None)
        good = self._engine(SCENARIOS[2], "deep01", GOOD_K)
        self.say(f"2/5 baseline: timing decode steps at batch {' and '.join(map(str, BATCHES))}")
        profile = measure_step_times(llm, BATCHES, max_rounds=MAX_ROUNDS)
        good.specscope.set_baseline(profile)
        return llm, good, profile

    def good_draft(self, plain: Any, llm: Any) -> None:
        """Predict, then measure: specscope sees the good draft serve sample A against scenario 2's baseline (the
        only one) and says what each batch size will run at, at K=6 and at the K it advises; then both are measured
        against the plain engine on sample B, prompts neither engine saw."""
        from specscope.engine.measure import serve_until_row
        from specscope.verdict import config_text, estimate, recommended_config, scheduled_k

        self.show(SCENARIOS[2])
        self.say(f"3/5 good draft: serving sample A at batch {' and '.join(map(str, BATCHES))}: what specscope "
                 "predicts from")
        order = PromptOrder(len(self.prompts))
        for batch in BATCHES:
            def window(batch: int = batch) -> None:
                self._tok_s(llm, batch, PREDICT_S, order)
                order.next_window()

            serve_until_row(llm, batch, window)
        snap = llm.snapshot()
        config = recommended_config(snap)
        promised: dict[str, dict[int, tuple[int, float, tuple[float, float] | None]]] = {"running": {}, "advice": {}}
        for batch in BATCHES:
            est = estimate(snap, batch_size=batch)
            if est is None:
                continue
            promised["running"][batch] = (GOOD_K, est.expected_speedup, est.interval)
            k = scheduled_k(config, batch)
            if k == 0 and config is None:  # speculation removed: the plain engine's speed
                promised["advice"][batch] = (0, 1.0, None)
            elif k == 0:
                promised["advice"][batch] = (0, est.k0_speedup, None)
            else:
                promised["advice"][batch] = (k, est.by_k[k], (est.low[k], est.high[k]) if est.high else None)
            self.say(f"3/5 good draft at batch {batch}: specscope predicts {_promise(promised['running'][batch])}; "
                     f"its advice {_promise(promised['advice'][batch])}")
        advice = ("turn speculation off (remove speculative_config)" if config is None else config_text(config))
        self.say(f"3/5 good draft: specscope's K schedule: {advice}")
        self.say(f"3/5 good draft: measuring K={GOOD_K} against the plain target on sample B, other prompts")
        running = self._against_plain(llm, plain)
        self._close(llm)
        # Where the advice runs K=6 the running engine's rounds are its measurement (the same K at that batch size,
        # so the same steps); it is started and measured only at the batch sizes where it runs another K.
        other = [b for b in BATCHES if scheduled_k(config, b) != GOOD_K]
        followed = {b: r for b, r in running.items() if b not in other}
        if config is not None and other:
            self.say(f"3/5 good draft: starting the advice as vLLM takes it ({config_text(config)}), measuring it "
                     f"on sample B at batch {' and '.join(map(str, other))}")
            adv = self._engine_with(config)
            followed |= self._against_plain(adv, plain, other)
            self._close(adv)
        for batch in BATCHES:
            rounds = running.get(batch)
            if rounds is None:
                continue
            self.measured[batch] = statistics.median(rounds)
            self.say(f"3/5 good draft at batch {batch}: measured {self.measured[batch]:.2f}x on sample B, predicted "
                     f"before {_promise(promised['running'].get(batch))}; rounds "
                     + ", ".join(f"{x:.2f}x" for x in rounds))
            adv_rounds = [1.0] if config is None else followed.get(batch)
            if adv_rounds is not None and batch in promised["advice"]:
                same = f" (K={GOOD_K} here: the rounds above)" if config is not None and batch not in other else ""
                self.say(f"3/5 good draft at batch {batch}: its advice measured {statistics.median(adv_rounds):.2f}x, "
                         f"predicted before {_promise(promised['advice'][batch])}{same}"
                         + ("" if config is None else "; rounds " + ", ".join(f"{x:.2f}x" for x in adv_rounds)))

    def _engine_with(self, config: dict[str, Any]) -> Any:
        """The good pair configured as specscope advised (off screen, on a hub of its own)."""
        import specscope

        return specscope.LLM(str(self.models["deep01-target"]), specscope_hub=Hub(), **ENGINE, speculative_config={
            "method": "draft_model", "model": str(self.models["deep01-draft"]), **config})

    def _against_plain(self, llm: Any, plain: Any, batches: Sequence[int] = BATCHES) -> dict[int, list[float]]:
        """At each batch size, three rounds of sample B, ``llm`` and the plain engine alternating which goes first
        (the machine drifts) on the same prompts: the rounds' ratios of output tokens/s."""
        ratios: dict[int, list[float]] = {}
        for batch in batches:
            order = PromptOrder(len(self.sample_b))
            for r in range(3):
                pair = ((llm, "spec"), (plain, "plain")) if r % 2 == 0 else ((plain, "plain"), (llm, "spec"))
                tok_s = {role: self._tok_s(engine, batch, ROUND_S, order, self.sample_b) for engine, role in pair}
                ratios.setdefault(batch, []).append(tok_s["spec"] / tok_s["plain"])
                order.next_window()  # both engines of a round run the same prompts; the next round, the next ones
        return ratios

    def weak_draft(self, baseline: StepProfile) -> None:
        name = SCENARIOS[3]
        self.show(name)
        self.say("4/5 weak draft: starting a target whose first layer predicts it badly, as the draft")
        llm = self._engine(name, "deep10", WEAK_K, baseline)
        self.say("4/5 weak draft: acceptance under 30%; the weak-draft and not-paying alerts fire; best K is 0")
        self._tok_s(llm, 1)  # its alerts fire within seconds and stay on
        self._tok_s(llm, 16)
        self._close(llm)


    def traffic_classes(self) -> None:
        import specscope
        from specscope import tiny_models

        name = SCENARIOS[4]
        self.show(name)
        self.say("5/5 traffic classes: the small target with a draft that follows some prompts and not others")
        engine: dict[str, Any] = {**ENGINE, "max_model_len": 512}  # the small family's models hold 512 positions
        llm = specscope.LLM(str(self.models["target"]), specscope_hub=Hub(), **engine, speculative_config={
            "method": "draft_model", "model": str(self.models["noise10"]), "num_speculative_tokens": WEAK_K})
        easy, hard = tiny_models.split_by_acceptance(llm, self.prompts)  # a pass of its own, not on the screen
        specscope.instrument(llm, self.hubs[name])
        self.say(f"5/5 traffic classes: {len(easy)} 'easy' requests the draft follows, {len(hard)} 'hard' ones it "
                 "does not; engine-wide acceptance stays above 30%, the hard class's alert fires")
        from specscope.engine.measure import steady_throughput

        # Both classes in every batch, as a server's queue mixes them (taken in this order, each finished request
        # replaced by the next).
        every, rest = max(1, len(easy) // max(1, len(hard))), iter(hard)
        mix: list[tuple[str, str]] = []
        for i, prompt in enumerate(easy, start=1):
            mix.append((prompt, "easy"))
            if i % every == 0 and (h := next(rest, None)) is not None:
                mix.append((h, "hard"))
        mix += [(h, "hard") for h in rest]
        steady_throughput(llm, 8, 12.0, [p for p, _ in mix], 48, [c for _, c in mix])
        self._close(llm)


def _promise(promise: tuple[int, float, tuple[float, float] | None] | None) -> str:
    """"K=3: 2.10x (1.80-2.40x)" for a prediction (K, point, interval); "n/a" without one."""
    if promise is None:
        return "n/a"
    k, point, band = promise
    what = "speculation removed" if k == 0 and point == 1.0 and band is None else f"K={k}"
    return f"{what}: {point:.2f}x" + (f" ({band[0]:.2f}-{band[1]:.2f}x)" if band else "")


def main(args: argparse.Namespace) -> int:
    """Run the demo, on screen or headless."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("specscope: error: the demo needs vLLM: install specscope[cpu] (or [vllm] on a GPU machine)",
              file=sys.stderr)
        return 2
    if args.headless:
        return _headless(args.record)
    return _on_screen(args.record)


def _on_screen(record: str | None) -> int:
    """The engines run in a child process that serves each scenario's hub on a specscope endpoint (127.0.0.1);
    the dashboard reads them with ``--url`` sources, as it would read a production server. The child's logs go
    to a file, so they never draw over the screen."""
    from specscope.read.scrape import EndpointSource
    from specscope.read.tui.app import TopApp
    from specscope.read.tui.record import Recorder

    log_path = _cache() / "demo.log"
    with open(log_path, "w") as log:
        child = subprocess.Popen([sys.executable, "-m", "specscope.demo"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log, text=True)
    assert child.stdout is not None
    urls: dict[str, str] = {}
    while len(urls) < len(SCENARIOS):
        line = child.stdout.readline()
        if not line:
            print(f"specscope: error: the demo engine did not start; see {log_path}", file=sys.stderr)
            return 1
        msg = _decode(line)
        if msg and msg[0] == "url":
            urls[msg[1]] = msg[2]
    targets = [Target(EndpointSource(url, name=name), DEMO_THRESHOLDS) for name, url in urls.items()]
    recorder = Recorder(record) if record else None
    started = threading.Event()
    app = TopApp(targets, interval=1.0, window_s=WINDOW_S, recorder=recorder, thresholds=DEMO_THRESHOLDS,
                 on_start=started.set)

    def relay() -> None:
        assert child.stdout is not None
        started.wait()
        for line in child.stdout:
            msg = _decode(line)
            if msg and msg[0] == "say":
                app.call_from_thread(app.set_note, msg[1])
            elif msg and msg[0] == "show":
                app.call_from_thread(app.select, msg[1])

    threading.Thread(target=relay, name="specscope-demo-relay", daemon=True).start()
    try:
        app.run()
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
        if recorder is not None:
            recorder.close()
    print(f"engine log: {log_path}")
    return 0


def _decode(line: str) -> list[str] | None:
    try:
        msg = json.loads(line)
    except ValueError:
        return None  # anything else a library printed
    return msg if isinstance(msg, list) and all(isinstance(x, str) for x in msg) else None


def _child() -> None:
    """The engine side of the on-screen demo: serve each hub, run the scenarios, stay up until the parent goes."""
    from specscope.export.endpoint import Endpoint

    def send(*msg: str) -> None:
        print(json.dumps(list(msg)), flush=True)

    demo = Demo(lambda m: send("say", m), lambda name: send("show", name))
    endpoints = [Endpoint(hub.snapshot, "127.0.0.1", 0) for hub in demo.hubs.values()]
    for name, ep in zip(demo.hubs, endpoints, strict=True):
        send("url", name, ep.url)
    try:
        demo.run()
    except Exception as exc:  # shown on screen; the dashboard stays up
        send("say", f"demo stopped: {type(exc).__name__}: {exc}")
    sys.stdin.read()  # until the dashboard quits


def _cache() -> Path:
    """Where the demo's engine log goes (beside the tiny models)."""
    from specscope import tiny_models

    root = tiny_models.cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _headless(record: str | None) -> int:
    """The scenarios without the screen: specscope's lines on stdout; vLLM's, torch's and the engine processes'
    logs go to a file, named at the end (and its last lines shown if the demo fails)."""
    log_path = _cache() / "demo.log"
    out = os.fdopen(os.dup(1), "w", buffering=1)  # specscope's own lines
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log_path, "w") as log:  # fds 1 and 2, so that the engine processes, spawned later, write there too
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        code = _run_headless(record, lambda line: print(line, file=out, flush=True))
    except Exception as exc:
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        print("\n".join([*tail, f"specscope: error: the demo stopped: {type(exc).__name__}: {exc}",
                         f"engine log: {log_path}"]), file=out, flush=True)
        code = 1
    else:
        print(f"engine log: {log_path}", file=out, flush=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        out.close()
    return code


def _run_headless(record: str | None, say: Callable[[str], None]) -> int:
    from specscope.export.summary import summary
    from specscope.read.tui.record import Recorder

    fired: dict[str, set[str]] = {}
    recorder = Recorder(record) if record else None
    targets: dict[str, Target] = {}

    def poll(demo: Demo) -> None:
        for name, t in targets.items():
            t.poll()
            if recorder is not None and t.snapshot is not None:
                recorder.write(name, t.snapshot)
            for a in t.evaluate():
                if a.state == "firing" and a.rule not in fired.setdefault(name, set()):
                    fired[name].add(a.rule)
                    say(f"  ALERT {a.rule} on '{name}': {a.summary}")

    demo = Demo(say, lambda name: None)
    targets.update((name, Target(HubSource(hub, name), DEMO_THRESHOLDS)) for name, hub in demo.hubs.items())
    done = threading.Event()

    def poller() -> None:
        while not done.wait(1.0):
            poll(demo)

    thread = threading.Thread(target=poller, daemon=True)
    thread.start()
    t0 = time.monotonic()
    try:
        demo.run()
    finally:
        done.set()
        thread.join()
    poll(demo)
    if recorder is not None:
        recorder.close()
    for name, t in targets.items():
        snap = t.windowed(1e9)  # the whole run
        say(f"\n== {name}")
        if snap is not None:
            say(summary(snap))
        say("alerts fired: " + (", ".join(sorted(fired.get(name, ()))) or "none"))
    for batch, ratio in demo.measured.items():
        say(f"measured speedup of the good draft at batch {batch}: {ratio:.2f}x")
    say(f"\ndemo finished in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    _child()
