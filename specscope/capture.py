"""Served traffic as draft training data: opt-in, private, and off vLLM's event loop.

Speculative decoding with exact verification is lossless: every completion the engine returns is the target's own
output, which is what a draft or an EAGLE head is trained on. With capture on, the finished requests of chosen
traffic classes (named ones, or ``weak``: those whose window acceptance is under the weak-draft line) are written
as JSON lines that vllm-project/speculators' ``prepare-data`` reads as they are:

- ``input_ids`` and ``loss_mask``: the prompt's and the completion's token ids as the target saw and made them,
  the mask 1 on the completion (exact: nothing is tokenized again; speculators uses these when a row has them);
- ``conversations``: the chat messages where specscope saw them (``specscope.LLM.chat``, chat requests to
  ``vllm serve``), else the prompt as one user turn; then the completion as the assistant turn;
- ``class``, ``acceptance`` (the request's own), ``model``, ``finish_reason``: fields a trainer ignores;
  ``specscope evaluate --prompts`` reads the file with its classes.

Private: a directory of ours that nobody else can enter (made 0700; one that is not is refused), files 0600
opened without following links. Nothing captured leaves through OTLP, Prometheus, the snapshot or the logs: the
snapshot says only that capture is on, for which classes, how many rows and bytes, and what was dropped.

Bounded: a file is closed at a quarter of ``max_bytes`` and a new one begun; past ``max_bytes`` the oldest file goes
(its rows are counted as dropped at the cap). vLLM's path only keeps a reference to a finished request's token
lists; the choice, the text and the writing happen on specscope's threads, and rows that find the writer's queue
full are dropped and counted. Under lossy verification (a ``rejection_sample_method`` other than ``standard`` or
``block``) the completions are not the target's: capture refuses with one line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import random
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from specscope import classes, private
from specscope.model import CaptureStatus, RequestRecord

if TYPE_CHECKING:
    from specscope.hub import Hub

log = logging.getLogger("specscope")

#: The class selector that captures the classes under the weak-draft line.
WEAK = "weak"
DEFAULT_MAX_BYTES = 256 << 20
#: The fewest bytes ``max_bytes`` may be (a file is a quarter of it).
MIN_MAX_BYTES = 64 << 10
#: Files the cap is split into: the oldest goes when the cap is passed.
PARTS = 4
#: Finished requests' token lists kept until their records are final (oldest out).
MAX_HELD = 4096
#: Rows waiting for the writer; more are dropped (and counted).
QUEUE_ROWS = 1024
#: How often the classes ``weak`` selects are read again from the hub's window.
WEAK_REFRESH_S = 1.0
#: Verification methods whose completions are the target's own (vLLM's ``rejection_sample_method``).
LOSSLESS = frozenset({"standard", "block"})
#: Chat roles as speculators reads them (``developer`` is OpenAI's newer name for ``system``).
_ROLES = {"developer": "system"}
_SIZE = re.compile(r"(\d+)\s*([kmg]i?b?)?", re.IGNORECASE)

#: Captures running in this process: the output-processor hook keeps token lists only while one is.
active = 0
_active_lock = threading.Lock()


class CaptureError(ValueError):
    """A capture setting that cannot be used (one line)."""


class Payload(NamedTuple):
    """What the output-processor hook keeps of a finished request for capture: references, not copies."""

    prompt: str | None
    prompt_ids: Sequence[int] | None
    output_ids: Sequence[int]
    text: str | None
    #: The chat messages where the request was a chat that specscope saw: ``(role, text)`` pairs, or the served
    #: request's body (read on the writer's thread, not vLLM's).
    messages: tuple[tuple[str, str], ...] | bytes | None
    #: The engine's tokenizer, to decode what vLLM did not keep as text.
    tokenizer: Any


@dataclass(frozen=True)
class CaptureConfig:
    """Where and what to capture: ``directory`` (private, made if absent), ``classes`` (``weak`` and/or class
    names), ``rate`` (the share of chosen requests written, 0 < rate <= 1) and ``max_bytes`` (the cap)."""

    directory: Path
    classes: tuple[str, ...] = (WEAK,)
    rate: float = 1.0
    max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if not self.classes:
            raise CaptureError("capture classes: name at least one class, or 'weak'")
        for name in self.classes:
            if name != WEAK and name not in classes.PROMPT_BUCKETS and classes.clean(name) is None:
                raise CaptureError(f"capture class {name[:60]!r} is not a class name: 'weak', a prompt-length "
                                   f"bucket, or up to {classes.MAX_LENGTH} letters, digits and _.:/+-")
        if not (isinstance(self.rate, (int, float)) and 0 < self.rate <= 1):
            raise CaptureError(f"capture rate {self.rate!r}: give a share of requests, 0 < rate <= 1")
        if not isinstance(self.max_bytes, int) or self.max_bytes < MIN_MAX_BYTES:
            raise CaptureError(f"capture max bytes {self.max_bytes!r}: give at least {MIN_MAX_BYTES} (64K)")

    def checked(self) -> CaptureConfig:
        """This config once its directory is made, or found, private to us; CaptureError (one line) otherwise."""
        try:
            private.private_directory(self.directory, "capture directory")
        except OSError as exc:
            raise CaptureError(str(exc) if isinstance(exc, PermissionError) else
                               f"capture directory {self.directory}: {exc.strerror or exc}") from None
        return self

    @classmethod
    def of(cls, value: CaptureConfig | str | os.PathLike[str] | Mapping[str, Any]) -> CaptureConfig:
        """A config from what ``specscope.LLM(specscope_capture=...)`` takes: a config, a directory (weak classes),
        or a mapping of the fields."""
        if isinstance(value, CaptureConfig):
            return value
        if isinstance(value, (str, os.PathLike)):
            return cls(Path(value))
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"directory", "classes", "rate", "max_bytes"})
            if unknown or "directory" not in value:
                raise CaptureError("specscope_capture: give 'directory' and optionally 'classes', 'rate', "
                                   f"'max_bytes'{f' (unknown: {unknown[0]!r})' if unknown else ''}")
            names = value.get("classes", (WEAK,))
            return cls(Path(value["directory"]), (names,) if isinstance(names, str) else tuple(names),
                       value.get("rate", 1.0), _size(value.get("max_bytes", DEFAULT_MAX_BYTES)))
        raise CaptureError("specscope_capture: give a directory, a mapping or a CaptureConfig")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> CaptureConfig | None:
        """``SPECSCOPE_CAPTURE_DIR`` (capture is off where it is unset), ``SPECSCOPE_CAPTURE_CLASSES`` (comma
        separated; default ``weak``), ``SPECSCOPE_CAPTURE_RATE`` (default 1), ``SPECSCOPE_CAPTURE_MAX_BYTES``
        (bytes, or with K, M or G; default 256M)."""
        directory = env.get("SPECSCOPE_CAPTURE_DIR", "").strip()
        if not directory:
            return None
        names = tuple(n.strip() for n in env.get("SPECSCOPE_CAPTURE_CLASSES", WEAK).split(",") if n.strip())
        raw_rate = env.get("SPECSCOPE_CAPTURE_RATE", "1").strip()
        try:
            rate = float(raw_rate)
        except ValueError:
            raise CaptureError(f"SPECSCOPE_CAPTURE_RATE={raw_rate!r}: give a share of requests, 0 < rate <= 1") \
                from None
        return cls(Path(directory), names, rate, _size(env.get("SPECSCOPE_CAPTURE_MAX_BYTES", DEFAULT_MAX_BYTES)))


def _size(value: object) -> int:
    """Bytes from an int or a string such as ``512M``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE.fullmatch(str(value).strip())
    if not m:
        raise CaptureError(f"capture max bytes {str(value)[:40]!r}: give bytes, or a number with K, M or G")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[unit]


def refusal(speculative_config: Any) -> str | None:
    """Why an engine's completions are not the target's own (lossy verification); None where they are."""
    method = getattr(speculative_config, "rejection_sample_method", None) if speculative_config is not None else None
    if method is None or str(method) in LOSSLESS:
        return None
    return (f"rejection_sample_method={method!s} keeps draft tokens the target would not have made: its completions "
            "are not the target's, so they are not captured as training data")


class _Part(NamedTuple):
    path: Path
    rows: int
    size: int


class Capture:
    """Writes the chosen finished requests of ``hub``'s engine as training rows (see the module docstring); it is
    the hub's capture (``hub.capture``) from its start, in place of any earlier one.

    :meth:`hold` is called on vLLM's path with each finished request's :class:`Payload`; the hub's record of the
    same request reaches :meth:`_on_record` on the hub's listener thread, which chooses, and the writer thread
    writes. Nothing here raises into vLLM: failures stop the capture, are logged once and said in the status."""

    def __init__(self, config: CaptureConfig, hub: Hub, model: str | None = None, stopped: str | None = None) -> None:
        global active
        self.config = config
        self._hub = hub
        self._model = model
        self.directory = config.checked().directory
        self._lock = threading.Lock()
        self._held: OrderedDict[str, Payload] = OrderedDict()
        self._queue: queue.Queue[tuple[RequestRecord, str, Payload] | None] = queue.Queue(QUEUE_ROWS)
        self._parts: deque[_Part] = deque()
        self._fd: int | None = None
        self._rows = self._bytes = self._dropped_cap = self._dropped_behind = 0
        self._weak: tuple[str, ...] = ()
        self._weak_at = -math.inf
        self._stopped = stopped
        self._stem = f"capture-{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S')}"
        self._index = 0
        self._thread: threading.Thread | None = None
        if hub.capture is not None:
            hub.capture.close()
        hub.capture = self
        if stopped is not None:
            log.warning("specscope: capture is off: %s", stopped)
            return
        self._thread = threading.Thread(target=self._run, name="specscope-capture", daemon=True)
        self._thread.start()
        hub.requests.add_listener(self._on_record)
        with _active_lock:
            active += 1

    def hold(self, request_id: str, payload: Payload) -> None:
        """Keep ``payload`` until the request's record is final (vLLM's path: a dict insert)."""
        if self._stopped is not None:
            return
        with self._lock:
            self._held[request_id] = payload
            if len(self._held) > MAX_HELD:
                self._held.popitem(last=False)

    def status(self) -> CaptureStatus:
        """Counts for the snapshot: never the captured text or where it is."""
        with self._lock:
            return CaptureStatus(", ".join(self.config.classes), self._rows, self._bytes, self._dropped_cap,
                                 self._dropped_behind, self._weak if WEAK in self.config.classes else (),
                                 self._stopped)

    def close(self) -> None:
        """Write what is queued, close the file, and stop listening."""
        global active
        if self._thread is None:
            return
        self._hub.requests.remove_listener(self._on_record)
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._thread = None
        with _active_lock:
            active -= 1

    def _on_record(self, rec: RequestRecord) -> None:
        with self._lock:
            payload = self._held.pop(rec.request_id, None)
        if payload is None or self._stopped is not None or not payload.output_ids or payload.prompt_ids is None:
            return
        name = rec.class_name or ""
        if not self._chosen(name) or (self.config.rate < 1 and random.random() >= self.config.rate):
            return
        try:
            self._queue.put_nowait((rec, name, payload))
        except queue.Full:
            with self._lock:
                self._dropped_behind += 1

    def _chosen(self, name: str) -> bool:
        if name in self.config.classes:
            return True
        if WEAK not in self.config.classes:
            return False
        now = time.monotonic()
        if now - self._weak_at >= WEAK_REFRESH_S:
            self._weak_at = now
            self._weak = weak_classes(self._hub)
        return name in self._weak

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            if self._stopped is not None:
                continue
            try:
                self._write(json.dumps(row(*item, model=self._model), ensure_ascii=False).encode() + b"\n")
            except Exception as exc:  # a full disk, a directory taken away: stop, say it once
                self._stop(f"writing failed: {exc}")
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write(self, line: bytes) -> None:
        part = self._parts[-1] if self._parts else None
        if self._fd is None or part is None or part.size + len(line) > self.config.max_bytes // PARTS:
            self._next_part()
            part = self._parts[-1]
        os.write(self._fd, line)  # type: ignore[arg-type]
        with self._lock:
            self._parts[-1] = _Part(part.path, part.rows + 1, part.size + len(line))
            self._rows += 1
            self._bytes += len(line)

    def _next_part(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        path = self.directory / f"{self._stem}-{self._index:04d}.jsonl"
        self._index += 1
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | private.OPEN_FLAGS, 0o600)
        with self._lock:
            self._parts.append(_Part(path, 0, 0))
            while len(self._parts) > PARTS:  # the cap: the oldest file goes
                old = self._parts.popleft()
                self._dropped_cap += old.rows
                self._rows -= old.rows
                self._bytes -= old.size
                with contextlib.suppress(OSError):
                    old.path.unlink()

    def _stop(self, why: str) -> None:
        with self._lock:
            if self._stopped is not None:
                return
            self._stopped = why
        self._hub.health.count_error("capture", RuntimeError(why))  # logged once, in one line


def weak_classes(hub: Hub) -> tuple[str, ...]:
    """The classes of ``hub``'s window that drafted enough and accept under the weak-draft line (the
    ``SpecscopeWeakDraftForClass`` thresholds), by name."""
    from specscope.alerts.rules import Thresholds

    t = Thresholds()
    snap = hub.local_snapshot()
    return tuple(c.name for c in snap.classes if c.window.draft_tokens >= t.weak_draft_min_draft_tokens
                 and c.window.acceptance_rate is not None and c.window.acceptance_rate < t.weak_draft_acceptance)


def row(rec: RequestRecord, name: str, payload: Payload, model: str | None = None) -> dict[str, Any]:
    """One training row for a finished request (see the module docstring)."""
    prompt_ids, output_ids = list(payload.prompt_ids or ()), list(payload.output_ids)
    text = payload.text if payload.text is not None else _decode(payload.tokenizer, output_ids)
    messages = chat_messages(payload.messages)
    if messages:
        turns = [{"from": _ROLES.get(role, role), "value": content} for role, content in messages]
    else:
        prompt = payload.prompt if payload.prompt is not None else _decode(payload.tokenizer, prompt_ids)
        turns = [{"from": "user", "value": prompt}]
    return {"conversations": [*turns, {"from": "assistant", "value": text}],
            "input_ids": prompt_ids + output_ids,
            "loss_mask": [0] * len(prompt_ids) + [1] * len(output_ids),
            "class": name or None, "acceptance": rec.acceptance_rate, "model": model,
            "finish_reason": rec.finish_reason}


def chat_messages(value: Any) -> tuple[tuple[str, str], ...] | None:
    """``(role, text)`` pairs of OpenAI chat messages (a list of them, or a request body holding ``messages``; a
    tuple of pairs is taken as read); the text of content parts joined; None where they cannot be read so."""
    if isinstance(value, tuple):  # read already
        return value or None
    try:
        if isinstance(value, (bytes, bytearray)):
            value = json.loads(value).get("messages")
        out = []
        for m in value:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            if not isinstance(m.get("role"), str) or not isinstance(content, str):
                return None
            out.append((m["role"], content))
        return tuple(out) or None
    except (ValueError, TypeError, AttributeError):
        return None


def _decode(tokenizer: Any, ids: list[int]) -> str:
    if tokenizer is None:
        return ""
    return str(tokenizer.decode(ids, skip_special_tokens=True))
