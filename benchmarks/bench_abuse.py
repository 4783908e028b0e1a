"""Reliability under abuse and faults (issue 48): ``vllm serve`` with two API-server processes and specscope's plugin,
middleware and capture on, under minutes of hostile traffic while the capture disk fills, the reading side's clock
steps and one API-server process is killed.

**Server**: the tiny target with its 2%-noise draft (K = 4), ``--api-server-count 2`` (one engine), the stat-logger
plugin and the middleware, ``SPECSCOPE_CLASS_HEADER=X-Tenant``, capture of ``tenant-a`` and ``weak`` into a
size-limited directory (a tmpfs of :data:`DISK_BYTES`, with ``SPECSCOPE_CAPTURE_MAX_BYTES`` well above it, so that
the disk fills, not the cap). Where the tmpfs cannot be mounted (not root), a plain directory, recorded so, and the
disk is not filled.

**Load** (asyncio + httpx, ``--concurrency`` at once, paced to ``--requests`` over ``--minutes``, and on until both are
reached): a third streamed completions the client abandons after one or two chunks (it closes the connection; vLLM
aborts them), a fifth chats with n = 2 (temperature 0.8: vLLM refuses n > 1 greedy), a tenth chats with ~4 MiB bodies
(a short message and a padded ``user`` field: half 64 KiB under the middleware's MAX_BODY of 4 MiB, half 64 KiB over),
the rest greedy completions, non-streamed or streamed whole with usage. Classes: half the requests from three real
tenants (the operator's ``X-Tenant`` header), a third with W3C ``baggage: traffic_class=NAME`` naming 50 invented
classes each minute (``made-up-<minute>-<0..49>``), the rest none.

**Faults**: at 25% of the run the capture disk is filled (a ballast file takes all but 8 KiB; capture then meets
ENOSPC), and at 80% given its space back (whether capture resumed is reported, not judged). At 40% the wall clock of
API-server process 0 steps +40 s, at 60% -40 s (back): a ``sitecustomize`` first on the server's PYTHONPATH wraps
``time.time``/``time.time_ns`` with an offset read from a file the benchmark writes, for the PIDs it names;
``time.monotonic`` is untouched, as a real step leaves it. Process 0 is a reading side: it merges its peer's share
file (written on the peer's unstepped clock) and answers /specscope/snapshot. ``kill -9`` of API-server process 1: by
default (``--kill-at end``) after the end measurements, under a tail of the same traffic, since vLLM 0.32's
``wait_for_completion_or_failure`` ends the whole server once any API-server process exits non-zero (seen here: the
server is gone ~8 s after the kill), which would cut a kill midway short of the run; ``--kill-at 0.5`` kills midway
instead, and what can still be judged is judged on the state read just before the kill. Either way the kill's outcome
(which processes lived, /health, the killed process's last published capture rows against its lines on disk) is
recorded, and nothing is restarted.

**Measured**: the resident memory of every process of the server's tree at the start (after a warm-up) and the end
(load done, counters settled), and every ``--sample-s`` between; every capture line on disk parsed as JSON, and each
API-server process's capture rows (its published status, read from the share directory) against the lines in its own
files; whether each real tenant has its own class row in /specscope/snapshot at every sample (two fresh connections
each, so both processes answer); specscope's lifetime speculative counts against vLLM's /metrics counters, and, in a
clean probe at the start and the end (no abandoned streams: vLLM keeps per-request numbers for all of them), the
change of the per-request sums (``attributed``) against the change of vLLM's counters, and each probe request's
record against vLLM's own per-request ``metrics.speculative_decoding``; the server's log for tracebacks raised in
specscope (innermost frame in its package, or its exception naming it; those that only pass through the middleware's
frames are counted apart), before and after the kill apart.

**Goals** (pass/fail as measured, thresholds fixed): ≥ ``--requests`` requests over ≥ ``--minutes``; every process's
resident memory within 50 MB of its start; every capture line parses; rows counted equal lines on disk (each live
process); the three tenants have their rows in every sample; lifetime counts and per-request sums equal vLLM's; no
specscope traceback in vLLM's log.

**Without specscope** (``--without-specscope``): the same server (no plugin, no middleware, no ``SPECSCOPE_*``
setting) under the same warm-up and load, no faults, the resident memory of its processes alone
(``abuse_without_specscope``): how much of a process's growth is vLLM's own.

**Where a growth lives**: each process's resident memory is also read split into anonymous, file-backed and shared
memory (/proc/PID/status), and the model worker's by mapping at the start and the end (/proc/PID/smaps: ``[heap]``
is glibc's main heap). ``--malloc-mmap-threshold BYTES`` fixes glibc's mmap threshold for the server's processes
(``MALLOC_MMAP_THRESHOLD_``; by default it rises up to 32 MiB as blocks are freed, after which freed tensors up to
that size stay in the heap): a growth that disappears with it was freed memory the allocator kept, not memory held.

**Untimed** (``--untimed``): all of specscope but the forward timer (``SPECSCOPE_FORWARD_DIR`` named where it cannot
be made, so the worker keeps no sums and starts no publishing thread), with the same load and faults
(``abuse_untimed``): how much of the worker's memory is the timer's.

Run: python benchmarks/bench_abuse.py [--minutes 5] [--requests 3000] [--concurrency 24] [--kill-at end|FRACTION]
     python benchmarks/bench_abuse.py --without-specscope   (the baseline of the memory goal)
     python benchmarks/bench_abuse.py --malloc-mmap-threshold 131072   (freed blocks of 128 KiB or more unmapped)
     python benchmarks/bench_abuse.py --smoke   (about a minute and 300 requests: the code paths, numbers not to keep)
Needs root for the tmpfs (else the disk-full fault is skipped, recorded so). Two cores: nothing else should run.
Results: benchmarks/results/abuse.json and abuse.md (``--smoke``: smoke_abuse.*; ``--results NAME`` otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._common import RESULTS, ROOT, reap, write
from tests.conftest import free_port, spec_config
from tests.e2e.test_server import launch, stop, wait_up

TENANTS = ("tenant-a", "tenant-b", "tenant-c")
CLASS_HEADER = "X-Tenant"
CAPTURE_CLASSES = "tenant-a,weak"
INVENTED_PER_MINUTE = 50
#: The middleware keeps a chat body for the capture up to this (specscope.engine.middleware.MAX_BODY).
BIG_BODY = 4 << 20
BIG_DELTA = 64 << 10
#: The capture disk (a tmpfs) and the cap specscope is given, larger: the disk fills first.
DISK_BYTES = 4 << 20
CAPTURE_MAX_BYTES = "64M"
#: What the ballast leaves free on the capture disk.
DISK_RESERVE = 8 << 10
MEMORY_GOAL_MB = 50.0
CLOCK_STEP_S = 40.0
#: When the faults come, as shares of the run's ``--minutes`` (the disk is given its space back at FREE_AT).
FILL_AT, STEP_UP_AT, STEP_DOWN_AT, FREE_AT = 0.25, 0.40, 0.60, 0.80
#: The API-server process whose clock steps (a reading side), and the one killed.
STEPPED_RANK, KILLED_RANK = 0, 1
#: After an end-of-run kill: traffic goes on this long, the kill this far into it.
TAIL_S, KILL_INTO_TAIL_S = 25.0, 5.0
WORDS = ("river", "stone", "garden", "light", "engine", "token", "draft", "model", "cache", "block", "memory", "window",
         "signal", "metric", "alert", "tenant", "budget", "queue", "batch", "stream", "chunk", "order", "value",
         "plain", "prompt", "answer", "north", "south", "harbor", "forest")
#: Kinds of request, 30 of them in each turn: 1/3 abandoned streams, 1/5 chat n=2, 1/10 4 MiB bodies, the rest plain.
TURN = ["abandon"] * 10 + ["chat_n2"] * 6 + ["big"] * 3 + ["plain"] * 7 + ["stream"] * 4
#: The clean probe: every kind vLLM keeps per-request numbers for, nothing abandoned.
PROBE = ["plain"] * 8 + ["stream"] * 4 + ["chat_n2"] * 4 + ["big"] * 4

CLOCK_HOOK = '''"""Fault injection for benchmarks/bench_abuse.py: time.time() and time.time_ns() of the processes
whose PIDs the file $ABUSE_CLOCK_FILE names ("OFFSET_S PID PID ...") are stepped by its offset, read again every
0.2 s of time.monotonic(), which is untouched, as a real step of the wall clock leaves it."""
import os
import time

_file = os.environ.get("ABUSE_CLOCK_FILE")
if _file:
    _time, _time_ns, _mono = time.time, time.time_ns, time.monotonic
    _state = [-1.0, 0.0]

    def _offset():
        now = _mono()
        if now >= _state[0]:
            _state[0] = now + 0.2
            try:
                with open(_file) as f:
                    words = f.read().split()
                _state[1] = float(words[0]) if str(os.getpid()) in words[1:] else 0.0
            except (OSError, ValueError, IndexError):
                _state[1] = 0.0
        return _state[1]

    def _stepped_time():
        return _time() + _offset()

    def _stepped_time_ns():
        return _time_ns() + int(_offset() * 1e9)

    time.time = _stepped_time
    time.time_ns = _stepped_time_ns
'''

SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts_total",
                 "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
                 "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
#: specscope's attributed (per-request sums) fields beside vLLM's counter names' keys above.
ATTRIBUTED = {"drafts": "spec_steps", "draft_tokens": "draft_tokens", "accepted": "accepted"}


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))


class Traffic:
    """Sends the benchmark's kinds of request and counts their outcomes (by kind)."""

    def __init__(self, url: str, model: str, seed: int, tag: str = "") -> None:
        self.url, self.model, self.tag = url, model, tag
        self.rng = random.Random(seed)
        self.order = list(TURN)
        self.rng.shuffle(self.order)
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.classes: Counter[str] = Counter()
        self.invented: dict[int, set[str]] = defaultdict(set)
        self._invented_n: Counter[int] = Counter()
        self._big_n = 0
        self._pad: dict[int, str] = {}
        self.t0 = time.monotonic()
        #: vLLM's per-request metrics by response id, where kept (the clean probe).
        self.keep: dict[str, dict[str, Any]] | None = None
        self.sent = 0

    def headers(self) -> dict[str, str]:
        r = self.rng.random()
        if r < 0.5:
            tenant = self.rng.choice(TENANTS)
            self.classes[tenant] += 1
            return {CLASS_HEADER: tenant}
        if r < 0.5 + 1 / 3:
            minute = int((time.monotonic() - self.t0) // 60)
            name = f"made-up-{self.tag}{minute}-{self._invented_n[minute] % INVENTED_PER_MINUTE}"
            self._invented_n[minute] += 1
            self.invented[minute].add(name)
            self.classes["invented"] += 1
            return {"baggage": f"traffic_class={name};source=bench, other=1"}
        self.classes["none"] += 1
        return {}

    async def send(self, client: httpx.AsyncClient, kind: str, headers: dict[str, str]) -> None:
        self.sent += 1
        try:
            outcome = await getattr(self, f"_{kind}")(client, headers)
        except (httpx.HTTPError, OSError) as exc:
            outcome = f"error:{type(exc).__name__}"
        except Exception as exc:  # a response that is not what vLLM sends: counted, never fatal to the run
            outcome = f"bad:{type(exc).__name__}"
        self.outcomes[kind][outcome] += 1

    def _kept(self, body: dict[str, Any], ids: tuple[str, ...]) -> None:
        sd = (body.get("metrics") or {}).get("speculative_decoding")
        if self.keep is not None and sd:
            self.keep[ids[0]] = {"candidates": ids, **sd}

    def _completion(self, **extra: Any) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt(self.rng), "max_tokens": self.rng.randint(8, 24),
                "temperature": 0, "ignore_eos": True, **extra}

    async def _plain(self, client: httpx.AsyncClient, headers: dict[str, str]) -> str:
        r = await client.post(f"{self.url}/v1/completions", json=self._completion(), headers=headers)
        if r.status_code == 200:
            body = r.json()
            self._kept(body, (f"{body['id']}-0", body["id"]))
        return str(r.status_code)

    async def _stream(self, client: httpx.AsyncClient, headers: dict[str, str]) -> str:
        body = self._completion(stream=True, stream_options={"include_usage": True})
        async with client.stream("POST", f"{self.url}/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                return str(r.status_code)
            last = None
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    last = line
        if last is not None:
            chunk = json.loads(last[6:])
            self._kept(chunk, (f"{chunk['id']}-0", chunk["id"]))
        return "200"

    async def _abandon(self, client: httpx.AsyncClient, headers: dict[str, str]) -> str:
        wanted = self.rng.choice((1, 2))
        body = {**self._completion(stream=True), "max_tokens": 96}
        got = 0
        async with client.stream("POST", f"{self.url}/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                return str(r.status_code)
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    got += 1
                    if got >= wanted:
                        break  # the client hangs up: leaving the block closes the connection mid-stream
        return "abandoned" if got >= wanted else "200 (ended before abandoned)"

    async def _chat_n2(self, client: httpx.AsyncClient, headers: dict[str, str]) -> str:
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt(self.rng)}], "n": 2,
                "temperature": 0.8, "max_tokens": 12, "ignore_eos": True}
        r = await client.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)
        return str(r.status_code)

    async def _big(self, client: httpx.AsyncClient, headers: dict[str, str]) -> str:
        self._big_n += 1
        size = BIG_BODY + (BIG_DELTA if self._big_n % 2 else -BIG_DELTA)
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt(self.rng)}], "max_tokens": 8,
                "temperature": 0, "ignore_eos": True, "user": ""}
        pad = size - len(json.dumps(body))
        if pad not in self._pad:
            self._pad[pad] = "u" * pad
        data = json.dumps({**body, "user": self._pad[pad]}).encode()
        r = await client.post(f"{self.url}/v1/chat/completions", content=data,
                              headers={**headers, "content-type": "application/json"})
        if r.status_code == 200:
            out = r.json()
            self._kept(out, (out["id"], f"{out['id']}-0"))
        return f"{r.status_code} ({'over' if size > BIG_BODY else 'under'} 4 MiB)"

    async def run(self, client: httpx.AsyncClient, seconds: float, count: int, cap_s: float, concurrency: int,
                  stop_event: asyncio.Event, order: list[str] | None = None) -> tuple[int, float]:
        """Requests paced to ``count`` over ``seconds``, on until both are reached (at most ``cap_s``), at most
        ``concurrency`` at once; returns how many were sent and the seconds it took (in-flight ones finished)."""
        sem = asyncio.Semaphore(concurrency)
        tasks: set[asyncio.Task[None]] = set()
        order = order or self.order
        start, gap, i = time.monotonic(), seconds / max(1, count), 0

        async def one(kind: str, headers: dict[str, str]) -> None:
            try:
                await self.send(client, kind, headers)
            finally:
                sem.release()

        while not stop_event.is_set():
            elapsed = time.monotonic() - start
            if (elapsed >= seconds and i >= count) or elapsed >= cap_s:
                break
            wait = start + i * gap - time.monotonic()
            if wait > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop_event.wait(), wait)
                continue
            await sem.acquire()
            task = asyncio.create_task(one(order[i % len(order)], self.headers()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        return i, time.monotonic() - start


def rss_kinds(pid: int) -> dict[str, float]:
    """The kernel's split of a process's resident memory (/proc/PID/status): anonymous (heap, tensors: what the
    process holds), file-backed (library code and data paged in as it is first used, shared and reclaimable) and
    shared memory."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                out[f"{key[3:].lower()}_mb"] = round(int(value.split()[0]) * 1024 / 1e6, 1)
    return out


def resident_by_mapping(pid: int, top: int = 30) -> dict[str, float]:
    """A process's resident MB by what is mapped (/proc/PID/smaps: a file's path, or [heap], [anon] and the like),
    the ``top`` largest."""
    by: dict[str, float] = {}
    name = "[anon]"
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            head = line.split()
            if head and re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", head[0]):
                name = head[5] if len(head) > 5 else "[anon]"
            elif head and head[0] == "Rss:":
                by[name] = by.get(name, 0.0) + int(head[1]) * 1024 / 1e6
    return {k: round(v, 1) for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:top]}


def role(p: psutil.Process) -> str:
    """What a process of the server's tree is, from its title (vLLM sets ``VLLM::APIServer_0`` and the like)."""
    try:
        cmd = " ".join(p.cmdline())
        name = p.name()
    except psutil.Error:
        return "gone"
    if name == "timeout":
        return "timeout"
    m = re.search(r"APIServer_(\d+)", cmd)
    if m:
        return f"api-server-{m[1]}"
    for key, label in (("EngineCore", "engine-core"), ("Worker", "worker"), ("DPCoordinator", "dp-coordinator"),
                       ("tests.e2e.vllm_serve", "vllm-serve"), ("resource_tracker", "resource-tracker")):
        if key in cmd:
            return label
    return name


def counts_on_disk(directory: Path) -> dict[str, Any]:
    """Every capture file's lines: how many (a last line without its newline counts), by writing process, and the
    lines that do not parse as JSON objects."""
    by_pid: Counter[int] = Counter()
    bad: list[dict[str, Any]] = []
    files = sorted(directory.glob("capture-*.jsonl")) if directory.is_dir() else []
    for f in files:
        data = f.read_bytes()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        pid = int(f.name.split("-")[1])
        by_pid[pid] += len(lines)
        for n, line in enumerate(lines, 1):
            try:
                ok = isinstance(json.loads(line), dict)
            except ValueError:
                ok = False
            if not ok:
                bad.append({"file": f.name, "line": n, "of": len(lines), "bytes": len(line),
                            "newline": n < len(lines) or data.endswith(b"\n"), "tail": line[-60:].decode("latin-1")})
    return {"files": len(files), "lines": sum(by_pid.values()), "by_pid": dict(by_pid), "bad_lines": bad,
            "bytes": sum(f.stat().st_size for f in files)}


def spec_life(snap: dict[str, Any] | None) -> dict[str, int] | None:
    spec = ((snap or {}).get("lifetime") or {}).get("spec")
    return None if not spec else {k: spec[k] for k in SPEC_COUNTERS}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: vLLM's log line head: ``(APIServer pid=12) `` on whatever a process writes, and for its logger's records the
#: level, time and place too, repeated on every line of a multi-line record (a traceback's included).
_HEAD = re.compile(r"(?:\(([^)]*pid=\d+)\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:]+ \[[^\]]*\] )?")
_CHAIN = ("During handling", "The above exception", "Traceback")


def tracebacks(text: str) -> list[str]:
    """The traceback blocks of vLLM's log, where processes' lines interleave (each line's ``(Name pid=N)`` head keeps
    one process's apart): from ``Traceback`` to the exception's line (a chained exception's parts apart)."""
    open_blocks: dict[str, list[str]] = {}
    done: list[str] = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).rstrip("\r")
        m = _HEAD.match(line)
        key, line = (m[1] or "") if m else "", line[m.end():] if m else line
        if line.startswith("Traceback (most recent call last)"):
            if key in open_blocks:
                done.append("\n".join(open_blocks.pop(key)))
            open_blocks[key] = [line]
            continue
        block = open_blocks.get(key)
        if block is None:
            continue
        block.append(line)
        if line and not line[0].isspace() and not line.startswith(_CHAIN):
            done.append("\n".join(open_blocks.pop(key)))
    done += ["\n".join(b) for b in open_blocks.values()]
    return done


def raised_by_specscope(block: str) -> bool:
    """Whether a traceback is specscope's error: its innermost frame is in specscope's package, or its exception
    names specscope (a vLLM error that only passed through the middleware's frames is not)."""
    files = re.findall(r'File "([^"]+)"', block)
    return (bool(files) and "/specscope/" in files[-1]) or "specscope" in block.splitlines()[-1]


class Run:
    """One server under abuse: its processes, its capture disk, its clock file, what was read from it."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.log = root / "server.log"
        self.disk = root / "disk"
        self.capture_dir = self.disk / "capture"
        self.clock_file = root / "clock"
        self.mounted = False
        self.mount_error: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.share: Path | None = None
        self.seen: dict[int, psutil.Process] = {}
        self.events: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.kill_log_offset: int | None = None
        self.killed: dict[str, Any] = {}
        self.last_share: dict[int, dict[str, Any]] = {}
        self.capture_stopped: dict[int, str] = {}
        self.rows_at_free: int | None = None
        #: The server without specscope: memory alone (``--without-specscope``).
        self.bare: bool = args.without_specscope

    # ------------------------------------------------------------------ setup and teardown
    def mount(self) -> None:
        self.disk.mkdir(mode=0o700)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0700", "tmpfs",
                               str(self.disk)], capture_output=True, text=True)
        self.mounted = done.returncode == 0
        if not self.mounted:
            self.mount_error = (done.stderr or done.stdout).strip()[:200]

    def unmount(self) -> None:
        if self.mounted:
            if subprocess.run(["umount", str(self.disk)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(self.disk)], capture_output=True)
            self.mounted = False

    def start(self, tiny: dict[str, Path]) -> None:
        hook = self.root / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(CLOCK_HOOK)
        self.clock_file.write_text("0\n")
        port = free_port()
        life = int(self.args.minutes * 60 * 3 + 900)
        cmd = ["timeout", str(life), sys.executable, "-m", "tests.e2e.vllm_serve", "--model", str(tiny["target"]),
               "--speculative-config", json.dumps(spec_config(tiny, "noise2")),
               "--per-request-spec-decode-metrics", "detailed",
               *(() if self.bare else ("--middleware", "specscope.engine.middleware.SpecscopeMiddleware")),
               "--host", "127.0.0.1", "--port", str(port), "--api-server-count", "2",
               "--enforce-eager", "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "32",
               "--disable-uvicorn-access-log"]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSCOPE_")} | {
            "VLLM_PLUGINS": "specscope", "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}", "ABUSE_CLOCK_FILE":
            str(self.clock_file), "SPECSCOPE_CLASS_HEADER": CLASS_HEADER, "SPECSCOPE_CAPTURE_DIR":
            str(self.capture_dir), "SPECSCOPE_CAPTURE_CLASSES": CAPTURE_CLASSES,
            "SPECSCOPE_CAPTURE_MAX_BYTES": CAPTURE_MAX_BYTES}
        if self.args.malloc_mmap_threshold:
            env["MALLOC_MMAP_THRESHOLD_"] = str(self.args.malloc_mmap_threshold)
        if self.bare:
            env = {k: v for k, v in env.items() if not k.startswith("SPECSCOPE_")} | {"VLLM_PLUGINS": ""}
        elif self.args.untimed:  # a forward-time directory that cannot be made: the worker times nothing
            env["SPECSCOPE_FORWARD_DIR"] = "/proc/specscope-untimed"
        self.proc = launch(cmd, env, self.log)
        self.tree()
        wait_up(self.proc, cmd, self.log)
        self.url = f"http://127.0.0.1:{port}"
        self.tree()
        for _ in range(0 if self.bare else 40):
            m = re.search(r"share their numbers through (\S+?);", self.log.read_text(errors="replace"))
            if m:
                self.share = Path(m[1])
                break
            time.sleep(0.5)

    def stop(self) -> list[str]:
        """Stop the server and every process it started; returns those that had to be killed."""
        left = []
        if self.proc is not None:
            self.tree()
            stop(self.proc)
            left = reap(self.seen, lambda pid, p: f"{pid} {role(p)}")
        return left

    # ------------------------------------------------------------------ reading the server
    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def event(self, what: str, **info: Any) -> None:
        self.events.append({"t": self.elapsed(), "event": what, **info})
        print(f"[{self.elapsed():7.1f}s] {what} {json.dumps(info) if info else ''}", flush=True)

    def tree(self) -> dict[int, psutil.Process]:
        """The server's processes now (each one seen is kept, for the final stop)."""
        if self.proc is None:
            return {}
        try:
            top = psutil.Process(self.proc.pid)
            procs = [top, *top.children(recursive=True)]
        except psutil.Error:
            return {}
        alive = {}
        for p in procs:
            self.seen.setdefault(p.pid, p)
            alive[p.pid] = self.seen[p.pid]
        return alive

    def api_pids(self) -> dict[int, int]:
        """rank -> PID of the live API-server processes."""
        out = {}
        for pid, p in self.tree().items():
            r = role(p)
            if r.startswith("api-server-"):
                out[int(r.rsplit("-", 1)[1])] = pid
        return out

    def rss(self) -> dict[str, dict[str, Any]]:
        out = {}
        for pid, p in self.tree().items():
            with contextlib.suppress(psutil.Error):
                out[str(pid)] = {"role": role(p), "mb": round(p.memory_info().rss / 1e6, 1), **rss_kinds(pid)}
        return out

    def worker_mappings(self) -> dict[str, dict[str, float]]:
        """The model-running processes' resident memory by mapping (where a growth lives)."""
        return {str(pid): resident_by_mapping(pid) for pid, p in self.tree().items() if role(p) == "worker"}

    def share_status(self) -> dict[int, dict[str, Any]]:
        """Each API-server process's last published snapshot's capture status and clock (from the share directory)."""
        out: dict[int, dict[str, Any]] = {}
        if self.share is None or not self.share.is_dir():
            return out
        for f in self.share.glob("*.json"):
            if not f.stem.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(f.read_bytes())
                snap = doc.get("snapshot", doc)  # {"pid", "seq", "snapshot"}; the snapshot alone before
                out[int(f.stem)] = {"pid": doc.get("pid"), "seq": doc.get("seq"), "capture": snap.get("capture"),
                                    "time": snap.get("time"), "health_errors": (snap.get("health") or {}).get("errors")}
        if out:
            self.last_share = out
        return out

    def per_process(self, share: dict[int, dict[str, Any]], by_pid: dict[int, int]) -> dict[str, dict[str, Any]]:
        """Each API-server process's capture rows (its published status) beside the lines in its own files. The
        status is published once a second, so rows written in the last second may be on disk and not yet counted."""
        api, out = self.api_pids(), {}
        for rank, st in sorted(share.items()):
            pid = st.get("pid") or api.get(rank)
            rows = (st.get("capture") or {}).get("rows")
            lines = by_pid.get(pid, 0) if pid is not None else None
            out[str(rank)] = {"pid": pid, "rows": rows, "lines": lines, "equal": rows == lines,
                              "capture": st.get("capture")}
        return out

    def disk_free(self) -> int | None:
        with contextlib.suppress(OSError):
            st = os.statvfs(self.disk)
            return st.f_bavail * st.f_frsize
        return None

    async def snapshot(self) -> dict[str, Any] | None:
        """/specscope/snapshot on a fresh connection (either API-server process may answer)."""
        try:
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.get(f"{self.url}/specscope/snapshot")
            return r.json() if r.status_code == 200 else {"status": r.status_code}
        except (httpx.HTTPError, ValueError) as exc:
            return {"error": type(exc).__name__}

    async def counters(self) -> dict[str, float] | None:
        try:
            async with httpx.AsyncClient(timeout=30) as c:
                page = (await c.get(f"{self.url}/metrics")).text
        except httpx.HTTPError:
            return None
        out = dict.fromkeys(SPEC_COUNTERS, 0.0)
        names = {v: k for k, v in SPEC_COUNTERS.items()}
        for fam in text_string_to_metric_families(page):
            for s in fam.samples:
                if s.name in names:
                    out[names[s.name]] += s.value
        return out

    async def settle(self, timeout_s: float = 45.0) -> tuple[dict[str, float] | None, list[dict[str, Any]], bool]:
        """vLLM's counters once they stopped moving, and snapshots (two fresh connections) once both show them."""
        deadline, last, steady = time.monotonic() + timeout_s, None, 0
        counters, snaps, match = None, [], False
        while time.monotonic() < deadline:
            counters = await self.counters()
            snaps = [s for s in [await self.snapshot(), await self.snapshot()] if s]
            match = counters is not None and all(spec_life(s) == {k: int(v) for k, v in counters.items()}
                                                 for s in snaps)
            steady = steady + 1 if counters == last and counters is not None else 0
            if steady >= 2 and match:
                break
            last = counters
            await asyncio.sleep(1.0)
        return counters, snaps, match

    async def sample(self, traffic: Traffic | None) -> dict[str, Any]:
        snaps = [] if self.bare else [await self.snapshot(), await self.snapshot()]
        row: dict[str, Any] = {"t": self.elapsed(), "sent": traffic.sent if traffic else None,
                               "clock_offset_s": float(self.clock_file.read_text().split()[0]),
                               "disk_free": self.disk_free(), "rss": self.rss(), "snapshots": []}
        for s in snaps:
            if not s or "classes" not in s:
                row["snapshots"].append({"failed": s})
                continue
            names = [c["name"] for c in s["classes"]]
            row["snapshots"].append({
                "tenants": {t: t in names for t in TENANTS}, "classes": len(names),
                "invented_rows": sum(n.startswith("made-up-") for n in names), "other": "other" in names,
                "folded": s.get("folded_classes"), "processes": s.get("processes"),
                "capture": s.get("capture"), "health_errors": (s.get("health") or {}).get("error_count")})
        row["share"] = self.share_status()
        for rank, st in sorted(row["share"].items()):
            why = (st.get("capture") or {}).get("stopped")
            if why and rank not in self.capture_stopped:
                self.capture_stopped[rank] = why
                self.event("capture stopped", process=f"api-server-{rank}", why=why)
        return row

    async def sampler(self, traffic: Traffic, stop_event: asyncio.Event) -> None:
        while not stop_event.is_set():
            if self.proc is not None and self.proc.poll() is not None:
                self.event("server exited", code=self.proc.returncode)
                stop_event.set()
                break
            self.samples.append(await self.sample(traffic))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop_event.wait(), self.args.sample_s)

    # ------------------------------------------------------------------ faults
    def fill_disk(self) -> None:
        if not self.mounted:
            self.event("disk not filled", why="no tmpfs: a plain directory on the machine's disk is not filled")
            return
        free = self.disk_free() or 0
        size = max(0, free - DISK_RESERVE)
        chunk, left = b"\0" * (1 << 20), size
        with open(self.disk / "ballast", "wb", buffering=0) as f, contextlib.suppress(OSError):
            while left > 0:
                left -= f.write(chunk[:left]) or 0
        self.event("capture disk filled", free_before=free, ballast=size - max(0, left), free_after=self.disk_free())

    def free_disk(self) -> None:
        if not self.mounted:
            return
        with contextlib.suppress(OSError):
            (self.disk / "ballast").unlink()
        self.rows_at_free = sum((st.get("capture") or {}).get("rows") or 0 for st in self.share_status().values())
        self.event("capture disk given its space back", free_after=self.disk_free(), capture_rows=self.rows_at_free)

    def step_clock(self, offset: float) -> None:
        pid = self.api_pids().get(STEPPED_RANK)
        step = offset - float(self.clock_file.read_text().split()[0])
        self.clock_file.write_text(f"{offset:g} {pid}\n")
        self.event("clock stepped", process=f"api-server-{STEPPED_RANK}", pid=pid, step_s=step, offset_s=offset)

    def kill(self) -> None:
        pid = self.api_pids().get(KILLED_RANK)
        share, disk = self.share_status(), counts_on_disk(self.capture_dir)
        self.killed = {"rank": KILLED_RANK, "pid": pid, "rss": self.rss(), "share_before": share,
                       "capture_per_process_before": self.per_process(share, disk["by_pid"])}
        self.kill_log_offset = len(self.log.read_bytes())
        if pid is None:
            self.event("kill skipped", why=f"no api-server-{KILLED_RANK}")
            return
        os.kill(pid, signal.SIGKILL)
        self.killed["at"] = self.elapsed()
        self.event("kill -9", process=f"api-server-{KILLED_RANK}", pid=pid)

    async def watch_after_kill(self, seconds: float) -> None:
        """What the server does once a process is killed: each second, which processes live and whether /health
        answers; the killed process's share file as it left it."""
        timeline = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            status = None
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient(timeout=3) as c:
                    status = (await c.get(f"{self.url}/health")).status_code
            alive = sorted({role(p) for p in self.tree().values()})
            timeline.append({"t": self.elapsed(), "serve_alive": self.proc is not None and self.proc.poll() is None,
                             "processes": alive, "health": status})
            share = self.share_status()
            if KILLED_RANK in share:
                self.killed["share_after"] = share[KILLED_RANK]
            if self.proc is not None and self.proc.poll() is not None:
                break
            await asyncio.sleep(1.0)
        self.killed["after"] = timeline
        self.killed["server_survived"] = self.proc is not None and self.proc.poll() is None

    async def faults(self, stop_event: asyncio.Event) -> None:
        if self.bare:
            return
        seconds = self.args.minutes * 60
        plan: list[tuple[float, Callable[[], None]]] = [
            (FILL_AT * seconds, self.fill_disk), (STEP_UP_AT * seconds, lambda: self.step_clock(CLOCK_STEP_S)),
            (STEP_DOWN_AT * seconds, lambda: self.step_clock(0.0)), (FREE_AT * seconds, self.free_disk)]
        if self.args.kill_at != "end":
            plan.append((float(self.args.kill_at) * seconds, self.kill))
        start = time.monotonic()
        for at, fn in sorted(plan, key=lambda x: x[0]):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop_event.wait(), max(0.0, start + at - time.monotonic()))
            if stop_event.is_set():
                return
            fn()
            if fn == self.kill:
                await self.watch_after_kill(20.0)

    # ------------------------------------------------------------------ measurements
    async def measure(self, label: str) -> dict[str, Any]:
        """The state at a quiet moment: counters settled, memory, capture rows against lines on disk (without
        specscope: memory, once the engine is idle)."""
        if self.bare:
            await asyncio.sleep(5.0)
            self.event(f"measured {label}")
            return {"t": self.elapsed(), "rss": self.rss(), "worker_mappings": self.worker_mappings()}
        counters, snaps, match = await self.settle()
        disk = counts_on_disk(self.capture_dir)
        per_process = self.per_process(self.share_status(), disk["by_pid"])
        snap = snaps[-1] if snaps else {}
        out = {"t": self.elapsed(), "rss": self.rss(), "worker_mappings": self.worker_mappings(), "counters": counters,
               "lifetime": [spec_life(s) for s in snaps], "lifetime_equal": match,
               "attributed": snap.get("attributed"), "unattributed_draft_tokens": snap.get("unattributed_draft_tokens"),
               "capture": snap.get("capture"), "capture_per_process": per_process,
               "lines_on_disk": {k: v for k, v in disk.items() if k != "bad_lines"},
               "bad_lines": disk["bad_lines"][:20],
               "processes": snap.get("processes"), "server_processes": snap.get("server_processes"),
               "health": snap.get("health"), "folded_classes": snap.get("folded_classes"),
               "class_rows": [c["name"] for c in snap.get("classes") or ()]}
        self.event(f"measured {label}", lifetime_equal=match, capture_rows=(snap.get("capture") or {}).get("rows"),
                   lines=disk["lines"])
        return out

    async def probe(self, label: str, model: str, seed: int) -> dict[str, Any]:
        """The clean probe: requests vLLM keeps per-request numbers for; the change of specscope's per-request sums
        against the change of vLLM's counters, and each request's record against vLLM's own numbers for it."""
        c0, s0, _ = await self.settle()
        traffic = Traffic(self.url, model, seed, tag=f"probe-{label}-")
        traffic.keep = {}
        stop_event = asyncio.Event()
        async with httpx.AsyncClient(timeout=httpx.Timeout(180, connect=10)) as client:
            await traffic.run(client, 1.0, len(PROBE), 120.0, 8, stop_event, order=PROBE)
        c1, s1, match = await self.settle()
        snap0, snap1 = (s0[-1] if s0 else {}), (s1[-1] if s1 else {})
        att0, att1 = snap0.get("attributed") or {}, snap1.get("attributed") or {}
        deltas = {}
        for key, field in ATTRIBUTED.items():
            dv = None if c0 is None or c1 is None else int(c1[key] - c0[key])
            da = att1.get(field, 0) - att0.get(field, 0) if att1 else None
            deltas[key] = {"vllm": dv, "per_request_sum": da, "equal": dv == da}
        records = {r["request_id"]: r for r in snap1.get("requests") or ()}
        compared, mismatched, missing = 0, [], 0
        for kept in traffic.keep.values():
            rec = next((records[c] for c in kept["candidates"] if c in records), None)
            if rec is None:
                missing += 1
                continue
            compared += 1
            theirs = (kept.get("num_draft_tokens"), kept.get("num_accepted_draft_tokens"), kept.get("num_spec_steps"))
            ours = (rec.get("draft_tokens"), rec.get("accepted_tokens"), rec.get("spec_steps"))
            if theirs != ours:
                mismatched.append({"id": kept["candidates"][0], "vllm": theirs, "specscope": ours})
        out = {"requests": len(PROBE), "outcomes": {k: dict(v) for k, v in traffic.outcomes.items()},
               "deltas": deltas, "lifetime_equal": match, "vllm_per_request_metrics": len(traffic.keep),
               "records_compared": compared, "records_missing": missing, "records_mismatched": mismatched[:10],
               "pass": match and all(d["equal"] for d in deltas.values()) and not mismatched and missing == 0}
        self.event(f"probe {label}", passed=out["pass"])
        return out


def judge(args: argparse.Namespace, run: Run, result: dict[str, Any]) -> dict[str, Any]:
    """The goals, pass or fail as measured."""
    goals: dict[str, Any] = {}
    load = result["load"]
    goals["load"] = {"pass": load["requests"] >= args.requests and load["seconds"] >= args.minutes * 60,
                     "detail": f"{load['requests']} requests in {load['seconds']:.0f} s "
                               f"(goal >= {args.requests} in >= {args.minutes * 60:.0f} s)"}
    start, end = result.get("start") or {}, result.get("end") or result.get("pre_kill") or {}
    rows = []
    for pid, s in (start.get("rss") or {}).items():
        e = (end.get("rss") or {}).get(pid)
        peak = max((smp["rss"][pid]["mb"] for smp in run.samples if pid in smp["rss"]), default=s["mb"])
        rows.append({"pid": int(pid), "role": s["role"], "start_mb": s["mb"], "end_mb": e["mb"] if e else None,
                     "change_mb": round(e["mb"] - s["mb"], 1) if e else None, "peak_mb": peak,
                     **{f"{k[:-3]}_change_mb": round(e[k] - s[k], 1) for k in ("anon_mb", "file_mb", "shmem_mb")
                        if e and k in s and k in e},
                     "pass": e is not None and abs(e["mb"] - s["mb"]) <= MEMORY_GOAL_MB})
    result["memory"] = rows
    goals["memory_flat"] = {"pass": bool(rows) and all(r["pass"] for r in rows),
                            "detail": ", ".join(f"{r['role']} {r['change_mb']:+} MB" if r["change_mb"] is not None
                                                else f"{r['role']} gone" for r in rows)}
    if run.bare:
        return goals
    final = result["capture_final"]
    goals["capture_lines_parse"] = {"pass": final["lines"] > 0 and not final["bad_lines"],
                                    "detail": f"{len(final['bad_lines'])} of {final['lines']} lines in "
                                              f"{final['files']} files do not parse"}
    per = end.get("capture_per_process") or {}
    total = (end.get("capture") or {}).get("rows"), (end.get("lines_on_disk") or {}).get("lines")
    goals["capture_rows_equal_lines"] = {
        "pass": bool(per) and all(p["equal"] for p in per.values()) and ("capture" not in end or total[0] == total[1]),
        "detail": "; ".join([*(f"api-server-{r}: rows {p['rows']} vs lines {p['lines']}" for r, p in per.items()),
                             *([f"snapshot: rows {total[0]} vs lines {total[1]}"] if "capture" in end else [])])
        or "no per-process status read"}
    fractions = {}
    answered = [s for smp in run.samples for s in smp["snapshots"] if "tenants" in s]
    for t in TENANTS:
        fractions[t] = round(sum(s["tenants"][t] for s in answered) / len(answered), 3) if answered else None
    failed = sum(1 for smp in run.samples for s in smp["snapshots"] if "tenants" not in s)
    goals["tenants_keep_rows"] = {"pass": bool(answered) and all(f == 1.0 for f in fractions.values()) and not failed,
                                  "detail": f"share of {len(answered)} snapshots with the tenant's row: {fractions}; "
                                            f"{failed} snapshot reads failed", "fractions": fractions}
    probes = [result.get("probe_start"), result.get("probe_end")]
    goals["counters_equal"] = {
        "pass": bool(end.get("lifetime_equal")) and all(p and p["pass"] for p in probes),
        "detail": f"lifetime counts = vLLM's at the end: {end.get('lifetime_equal')}; clean probes (per-request sums "
                  f"vs counters, records vs vLLM's per-request metrics): "
                  f"{[p and p['pass'] for p in probes]}; unattributed draft tokens at the end (aborted streams): "
                  f"{end.get('unattributed_draft_tokens')}"}
    logs = result["log"]
    goals["no_specscope_traceback"] = {"pass": not logs["specscope_raised"],
                                       "detail": f"{logs['specscope_raised']} of {logs['tracebacks']} tracebacks "
                                                 f"raised in specscope ({logs['through_specscope_frames']} more "
                                                 f"only pass through its frames)"}
    return goals


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# {result['benchmark']}: reliability under abuse and faults", "",
             f"commit {result.get('commit', '')[:12]}, dirty {result.get('dirty')}, {result.get('date')}", "",
             "| goal | pass | detail |", "|---|---|---|"]
    for name, g in result["goals"].items():
        lines.append(f"| {name} | {'PASS' if g['pass'] else 'FAIL'} | {g['detail']} |")
    lines += ["", "| process | pid | start MB | end MB | change MB | of it anonymous / file / shmem | peak MB |",
              "|---|---|---|---|---|---|---|"]
    for r in result.get("memory") or ():
        kinds = " / ".join(str(r.get(f"{k}_change_mb", "-")) for k in ("anon", "file", "shmem"))
        lines.append(f"| {r['role']} | {r['pid']} | {r['start_mb']} | {r['end_mb']} | {r['change_mb']} | {kinds} | "
                     f"{r['peak_mb']} |")
    start, end = (result.get(k) or {} for k in ("start", "end"))
    for pid, before in (start.get("worker_mappings") or {}).items():
        after = (end.get("worker_mappings") or {}).get(pid) or {}
        grew = sorted(((after.get(m, 0.0) - before.get(m, 0.0), m) for m in set(before) | set(after)), reverse=True)
        lines += ["", f"Worker {pid}, resident MB by mapping that grew most (start -> end): " + "; ".join(
            f"{m} {before.get(m, 0.0)} -> {after.get(m, 0.0)}" for d, m in grew[:6] if d > 0)]
    lines += ["", "Faults:", ""]
    lines += [f"- {e['t']} s: {e['event']} {json.dumps({k: v for k, v in e.items() if k not in ('t', 'event')})}"
              for e in result["events"]]
    kill = result.get("kill") or {}
    lines += ["", f"Kill: server survived: {kill.get('server_survived')}; {kill.get('note', '')}; the killed "
                  f"process's capture: {kill.get('killed_capture')}", "",
              f"Capture after the disk was given its space back: {result.get('capture_after_disk_freed')}", ""]
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace, run: Run, result: dict[str, Any]) -> None:
    from specscope import tiny_models

    tiny = tiny_models.build()
    if not run.bare:
        run.mount()
    run.event("capture disk", tmpfs=run.mounted, size=DISK_BYTES if run.mounted else None, error=run.mount_error)
    run.start(tiny)
    run.event("server up", url=run.url, share=str(run.share), processes=sorted(role(p) for p in run.tree().values()))
    async with httpx.AsyncClient(timeout=30) as c:
        model = (await c.get(f"{run.url}/v1/models")).json()["data"][0]["id"]
    result["rss_up"] = run.rss()
    # Warm-up: every kind of request a few times (first shapes, first big bodies), then the start's state.
    warm = Traffic(run.url, model, args.seed + 7, tag="warm-")
    async with httpx.AsyncClient(timeout=httpx.Timeout(180, connect=10)) as client:
        await warm.run(client, 10.0, 60, 120.0, 8, asyncio.Event())
    result["warm_up"] = {k: dict(v) for k, v in warm.outcomes.items()}
    if not run.bare:
        result["probe_start"] = await run.probe("start", model, args.seed + 1)
    result["start"] = await run.measure("start")

    traffic = Traffic(run.url, model, args.seed)
    seconds = args.minutes * 60
    stop_event = asyncio.Event()
    limits = httpx.Limits(max_connections=args.concurrency + 8, max_keepalive_connections=args.concurrency)
    run.event("load", minutes=args.minutes, requests=args.requests, concurrency=args.concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(180, connect=10), limits=limits) as client:
        sampler = asyncio.create_task(run.sampler(traffic, stop_event))
        faults = asyncio.create_task(run.faults(stop_event))
        sent, took = await traffic.run(client, seconds, args.requests, 2.5 * seconds, args.concurrency, stop_event)
        server_up = run.proc is not None and run.proc.poll() is None
        stop_event.set()
        await asyncio.gather(sampler, faults)
    run.event("load done", sent=sent, seconds=round(took, 1))
    invented = {str(m): len(v) for m, v in sorted(traffic.invented.items())}
    result["load"] = {"requests": sent, "seconds": round(took, 1), "by_kind": {k: dict(v) for k, v in
                                                                               traffic.outcomes.items()},
                      "kind_shares": {k: round(sum(v.values()) / max(1, sent), 3) for k, v in traffic.outcomes.items()},
                      "classes": dict(traffic.classes), "invented_names_by_minute": invented}
    if run.args.kill_at != "end" and run.killed:
        result["pre_kill"] = {"rss": run.killed.get("rss"),
                              "capture_per_process": run.killed.get("capture_per_process_before")}
    if server_up and run.proc is not None and run.proc.poll() is None:
        result["end"] = await run.measure("end")
        if not run.bare:
            result["probe_end"] = await run.probe("end", model, args.seed + 2)
    if run.args.kill_at == "end" and not run.bare and run.proc is not None and run.proc.poll() is None:
        tail = Traffic(run.url, model, args.seed + 3, tag="tail-")
        tail_stop = asyncio.Event()
        async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=5), limits=limits) as client:
            tail_task = asyncio.create_task(
                tail.run(client, TAIL_S, int(TAIL_S * args.requests / seconds), TAIL_S, args.concurrency, tail_stop))
            await asyncio.sleep(KILL_INTO_TAIL_S)
            run.kill()
            await run.watch_after_kill(TAIL_S - KILL_INTO_TAIL_S)
            tail_stop.set()
            await tail_task
        result["tail"] = {k: dict(v) for k, v in tail.outcomes.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--kill-at", default="end", help="'end' (after the end measurements) or a share of the run")
    ap.add_argument("--seed", type=int, default=48)
    ap.add_argument("--smoke", action="store_true", help="about a minute, 300 requests: numbers not to keep")
    ap.add_argument("--without-specscope", action="store_true",
                    help="the same server and load without specscope: memory alone (abuse_without_specscope)")
    ap.add_argument("--untimed", action="store_true",
                    help="all of specscope but the forward timer (its sums and publishing thread in the worker): "
                         "what of the worker's memory is the timer's (abuse_untimed)")
    ap.add_argument("--malloc-mmap-threshold", type=int, metavar="BYTES",
                    help="glibc's mmap threshold, fixed, for the server's processes (MALLOC_MMAP_THRESHOLD_): blocks "
                         "this big or bigger are unmapped when freed instead of kept in the heap; tells memory still "
                         "held from freed memory the allocator keeps")
    ap.add_argument("--results", default=None)
    args = ap.parse_args()
    if args.smoke:
        args.minutes, args.requests, args.sample_s = 1.0, 300, 5.0
    if args.kill_at != "end" and not 0 < float(args.kill_at) < 1:
        ap.error("--kill-at: 'end' or a share of the run between 0 and 1")
    name = args.results or ("smoke_abuse" if args.smoke else "abuse") + (
        "_without_specscope" if args.without_specscope else "_untimed" if args.untimed else "")
    root = Path(tempfile.mkdtemp(prefix="bench-abuse-"))
    run = Run(args, root)
    result: dict[str, Any] = {"config": {
        "minutes": args.minutes, "requests": args.requests, "concurrency": args.concurrency, "kill_at": args.kill_at,
        "smoke": args.smoke, "without_specscope": args.without_specscope, "untimed": args.untimed,
        "malloc_mmap_threshold": args.malloc_mmap_threshold,
        "model": "tiny target + noise2 draft, K=4, --api-server-count 2, --max-num-seqs 32",
        "capture": {"classes": CAPTURE_CLASSES, "disk_bytes": DISK_BYTES, "max_bytes": CAPTURE_MAX_BYTES},
        "tenants": TENANTS, "invented_per_minute": INVENTED_PER_MINUTE,
        "faults_at": {"fill": FILL_AT, "clock_up": STEP_UP_AT, "clock_down": STEP_DOWN_AT, "disk_freed": FREE_AT},
        "clock": f"api-server-{STEPPED_RANK} +{CLOCK_STEP_S:g} s, then back", "killed": f"api-server-{KILLED_RANK}"}}
    try:
        asyncio.run(main_async(args, run, result))
    finally:
        try:
            result["left_running"] = run.stop()
            result["capture_final"] = counts_on_disk(run.capture_dir)
            result["disk"] = {"tmpfs": run.mounted, "mount_error": run.mount_error, "free_at_end": run.disk_free()}
        finally:
            run.unmount()
    text = run.log.read_text(errors="replace") if run.log.exists() else ""
    cut = len(text.encode()[: run.kill_log_offset].decode(errors="replace")) if run.kill_log_offset else len(text)
    blocks_before, blocks_after = tracebacks(text[:cut]), tracebacks(text[cut:])
    ours = [b for b in blocks_before + blocks_after if raised_by_specscope(b)]
    through = [b for b in blocks_before + blocks_after if "specscope" in b and not raised_by_specscope(b)]
    result["log"] = {"tracebacks": len(blocks_before) + len(blocks_after), "before_kill": len(blocks_before),
                     "after_kill": len(blocks_after), "specscope_tracebacks": [b[-1500:] for b in ours[:5]],
                     "specscope_raised": len(ours), "through_specscope_frames": len(through),
                     "through_specscope_examples": [b[-1500:] for b in through[:3]],
                     "last_lines_of_tracebacks": sorted({b.splitlines()[-1][:200]
                                                         for b in blocks_before + blocks_after}),
                     "specscope_said": sorted({_ANSI.sub("", ln).strip()[:300] for ln in text.splitlines()
                                               if "specscope: " in ln})[:30]}
    killed = dict(run.killed)
    if killed:
        pid = killed.get("pid")
        last = killed.get("share_after") or (killed.get("share_before") or {}).get(KILLED_RANK) or {}
        published = last.get("capture") or {}
        killed["killed_capture"] = {"last_published_rows": published.get("rows"),
                                    "lines_on_disk": result["capture_final"]["by_pid"].get(pid)}
        down = next((a["t"] for a in killed.get("after") or () if not a["serve_alive"]), None)
        if "at" not in killed:
            killed["note"] = "no kill: the API-server process was not found"
        elif down is not None:
            killed["note"] = (f"the whole server exited {down - killed['at']:.1f} s after the kill (vLLM 0.32's "
                              "wait_for_completion_or_failure ends every process once one API server exits non-zero)")
        else:
            up_s = killed["after"][-1]["t"] - killed["at"]
            killed["note"] = f"the server's main process was still up {up_s:.0f} s after the kill"
        killed.pop("rss", None)
    result["kill"] = killed
    end = result.get("end") or {}
    result["capture_after_disk_freed"] = {
        "rows_when_freed": run.rows_at_free, "rows_at_end": (end.get("capture") or {}).get("rows"),
        "stopped_at_end": (end.get("capture") or {}).get("stopped"),
        "resumed": run.rows_at_free is not None and ((end.get("capture") or {}).get("rows") or 0) > run.rows_at_free}
    result["events"] = run.events
    result["samples"] = run.samples
    result["goals"] = judge(args, run, result)
    result["server_log"] = str(run.log)
    write(name, result, seed=args.seed)
    (RESULTS / f"{name}.md").write_text(markdown({**json.loads((RESULTS / f"{name}.json").read_text())}))
    print(markdown(json.loads((RESULTS / f"{name}.json").read_text())))


if __name__ == "__main__":
    main()
