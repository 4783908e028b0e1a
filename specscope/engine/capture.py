"""Served traffic as draft training data: opt-in, private, bounded, and off vLLM's event loop.

Over 400 lines on purpose: everything that touches a client's prompts and completions (what is held, for how
long, what is written, where and how much) is in this one room, so that it is audited in one reading.

Speculative decoding with exact verification is lossless: every completion the engine returns is the target's own
output, which is what a draft or an EAGLE head is trained on. With capture on, the finished requests of chosen
traffic classes are written as JSON lines that vllm-project/speculators' ``prepare-data`` reads as they are:

- ``input_ids`` and ``loss_mask``: the prompt's and the completion's token ids as the target saw and made them,
  the mask 1 on the completion (exact: nothing is tokenized again; speculators uses these when a row has them);
- ``conversations``: the chat messages where specscope saw them (``specscope.LLM.chat``, chat requests to
  ``vllm serve``), else the prompt as one user turn; then the completion as the assistant turn;
- ``class``, ``acceptance`` (the request's own), ``model``, ``finish_reason``: fields a trainer ignores;
  ``specscope evaluate --prompts`` reads the file with its classes.

Chosen: only the operator decides what is written. A class name chooses the requests the operator's labels put in
it: the operator's header (``SPECSCOPE_CLASS_HEADER``), the served model (``model:<name>``), a prompt-length bucket
(``prompt:...``), or ``specscope_class`` offline; ``weak`` chooses those of the classes whose window acceptance (the
server's, all its API-server processes merged) is under the weak-draft line. A class a client claims for itself
(the W3C ``baggage`` member ``traffic_class``) is written only where the operator names it so: ``baggage:<name>``.

Private: a directory of ours that nobody else can enter (made 0700; one that is not is refused), files 0600
opened without following links. Neither what is captured nor where it is written leaves through OTLP,
Prometheus, the snapshot or the logs: the snapshot says only that capture is on, for which classes, how many rows
and bytes, what was dropped, and why writing stopped (the kind of failure, e.g. ``ENOSPC``, never a path).

Bounded: ``max_bytes`` is the directory's budget, for all its ``capture-*.jsonl`` files, whichever process wrote
them (the server's API-server processes share it, and an earlier run's files count). Each process writes files of
``max_bytes / (4 x processes)`` and, as it begins one, removes the oldest files of the directory (never one that
another process is writing) until all of them fit with every process's file in flight full; the rows of its own
files gone (removed by any process: it looks as it begins a file, and every :data:`RECOUNT_S` while idle) are
counted as dropped at the cap, as is a row larger than a file. What is held for rows in memory is
bounded by count (:data:`MAX_HELD`) and bytes (:data:`MAX_HELD_BYTES`) and let go when its request ends, aborted
ones included; what is pushed out is counted as dropped behind where its request is chosen. vLLM's path only keeps
references; the choice, the text and the writing happen on specscope's threads, and rows that find the writer's
queue full are dropped and counted.

Whole lines: a row that cannot be made (text that does not encode) is counted and skipped. A row is written with
one ``write`` of its whole line; where that fails or falls short, the file is cut back to its last whole line and
the row counted as dropped, so the files hold only whole lines, as many as ``rows`` says. A failing disk stops the
writing (the status says why), and rows are dropped and counted until it is tried again :data:`RETRY_S` later.
Under lossy verification (a ``rejection_sample_method`` other than ``standard`` or ``block``) the completions are
not the target's: capture refuses with one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import queue
import random
import re
import secrets
import stat
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from specscope.core import classes, private
from specscope.core.model import CaptureStatus, RequestRecord

if TYPE_CHECKING:
    from specscope.state.hub import Hub

log = logging.getLogger("specscope")

#: The class selector that captures the classes under the weak-draft line.
WEAK = "weak"
#: The prefix of a class selector that names a class clients claim in their W3C baggage.
BAGGAGE = "baggage:"
DEFAULT_MAX_BYTES = 256 << 20
#: The fewest bytes ``max_bytes`` may be.
MIN_MAX_BYTES = 64 << 10
#: Files the budget is split into, per API-server process: the oldest goes when a new one would not fit.
PARTS = 4
#: Requests held for capture at most, in each of the two places they are held: the chat bodies of requests in
#: flight (the output-processor hook's) and the finished requests waiting for their records (a capture's).
MAX_HELD = 4096
#: Bytes held for capture at most, in each of those two places (oldest out).
MAX_HELD_BYTES = 32 << 20
#: What a token id held in a list costs: its slot and its int.
TOKEN_BYTES = 36
#: Rows waiting for the writer; more are dropped (and counted).
QUEUE_ROWS = 1024
#: How often the classes ``weak`` selects are read again from the hub's window.
WEAK_REFRESH_S = 1.0
#: How often an idle writer looks for its files another process removed at the cap (a busy one does as it begins a
#: file).
RECOUNT_S = 5.0
#: Seconds after a failed write before writing is tried again (rows meanwhile are dropped and counted).
RETRY_S = 30.0
#: Verification methods whose completions are the target's own (vLLM's ``rejection_sample_method``).
LOSSLESS = frozenset({"standard", "block"})
#: Chat roles as speculators reads them (``developer`` is OpenAI's newer name for ``system``).
_ROLES = {"developer": "system"}
_SIZE = re.compile(r"(\d+)\s*([kmg]i?b?)?", re.IGNORECASE)
_FILE = re.compile(r"capture-.*\.jsonl")

#: Captures running in this process: the output-processor hook keeps token lists only while one is.
active = 0
_active_lock = threading.Lock()
#: Each hub's capture: the last one started for it (closed or not).
_ATTACHED: weakref.WeakKeyDictionary[Hub, Capture] = weakref.WeakKeyDictionary()
#: Chat bodies the output-processor hook let go with their requests' other notes, past :data:`MAX_HELD` requests in
#: flight (this process); a capture counts those since its start as dropped behind.
pushed_out = 0


class CaptureError(ValueError):
    """A capture setting that cannot be used (one line)."""


class Lost:
    """A chat body let go before its request finished (past :data:`MAX_HELD_BYTES`): its row, if chosen, is dropped
    and counted."""

    __slots__ = ()


LOST = Lost()
#: Chat messages as noted: ``(role, text)`` pairs, or a served chat request's body.
Messages = tuple[tuple[str, str], ...] | bytes


class Payload(NamedTuple):
    """What the output-processor hook keeps of a finished request for capture: references, not copies."""

    prompt: str | None
    prompt_ids: Sequence[int] | None
    output_ids: Sequence[int]
    text: str | None
    #: The chat messages where the request was a chat that specscope saw: ``(role, text)`` pairs, or the served
    #: request's body (read on the writer's thread, not vLLM's); :data:`LOST` where they were let go.
    messages: Messages | Lost | None
    #: The engine's tokenizer, to decode what vLLM did not keep as text.
    tokenizer: Any
    #: Whether the request's class is the client's own claim (W3C baggage) rather than the operator's label.
    client_class: bool = False


def body_size(messages: object) -> int:
    """The bytes held for chat ``messages`` (a request body, or ``(role, text)`` pairs)."""
    if isinstance(messages, (bytes, bytearray)):
        return len(messages)
    if isinstance(messages, tuple):
        return sum(len(role) + len(text) for role, text in messages)
    return 0


def held_size(payload: Payload) -> int:
    """The bytes a held :class:`Payload` keeps alive (roughly: text as one byte a character)."""
    return (body_size(payload.messages) + len(payload.prompt or "") + len(payload.text or "")
            + TOKEN_BYTES * (len(payload.prompt_ids or ()) + len(payload.output_ids)))


def failure(exc: BaseException) -> str:
    """The kind of ``exc`` without what it names (a file, a directory, captured text): ``ENOSPC (No space left on
    device)``, or its type's name."""
    if isinstance(exc, OSError) and exc.errno:
        return f"{errno.errorcode.get(exc.errno, exc.errno)} ({os.strerror(exc.errno)})"
    return type(exc).__name__


@dataclass(frozen=True)
class CaptureConfig:
    """Where and what to capture: ``directory`` (private, made if absent), ``classes`` (``weak``, class names, and
    ``baggage:<name>`` for a class clients claim), ``rate`` (the share of chosen requests written, 0 < rate <= 1)
    and ``max_bytes`` (the directory's budget)."""

    directory: Path
    classes: tuple[str, ...] = (WEAK,)
    rate: float = 1.0
    max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if not self.classes:
            raise CaptureError("capture classes: name at least one class, or 'weak'")
        for name in self.classes:
            if name != WEAK and name not in classes.PROMPT_BUCKETS and not (
                    classes.claimed(name.removeprefix(BAGGAGE)) if name.startswith(BAGGAGE) else classes.clean(name)):
                raise CaptureError(f"capture class {name[:60]!r} is not a class name: 'weak', a prompt-length "
                                   f"bucket, up to {classes.MAX_LENGTH} letters, digits and _.:/+-, or 'baggage:' "
                                   "and a class clients may claim")
        if not (isinstance(self.rate, (int, float)) and 0 < self.rate <= 1):
            raise CaptureError(f"capture rate {self.rate!r}: give a share of requests, 0 < rate <= 1")
        if not isinstance(self.max_bytes, int) or self.max_bytes < MIN_MAX_BYTES:
            raise CaptureError(f"capture max bytes {self.max_bytes!r}: give at least {MIN_MAX_BYTES} (64K)")

    def checked(self) -> CaptureConfig:
        """This config once its directory is made, or found, private to us; CaptureError (one line, naming the
        directory: it is said at start-up only) otherwise."""
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
        separated: ``weak``, class names, ``baggage:<name>`` for a class clients claim in their baggage, which is
        never captured otherwise; default ``weak``), ``SPECSCOPE_CAPTURE_RATE`` (default 1),
        ``SPECSCOPE_CAPTURE_MAX_BYTES`` (the directory's budget for all the server's processes: bytes, or with K, M
        or G; default 256M)."""
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


class _ShortWrite(OSError):
    """A write that took only part of its line (a full disk, a file size limit)."""


def attached(hub: Hub) -> Capture | None:
    """The capture last started for ``hub`` (closed or not); None where none was."""
    return _ATTACHED.get(hub)


class Capture:
    """Writes the chosen finished requests of ``hub``'s engine as training rows (see the module docstring); it is
    the hub's capture (:func:`attached`) from its start, in place of any earlier one.

    :meth:`hold` is called on vLLM's path with each finished request's :class:`Payload`; the hub's record of the
    same request reaches :meth:`_on_record` on the hub's listener thread, which chooses, and the writer thread
    writes. Nothing here raises into vLLM: failures are counted, logged once (their kind, never a path) and said
    in the status."""

    def __init__(self, config: CaptureConfig, hub: Hub, model: str | None = None, stopped: str | None = None) -> None:
        global active
        self.config = config
        self._hub = hub
        self._model = model
        self.directory = config.checked().directory
        self._lock = threading.Lock()
        #: Finished requests waiting for their records: the payload and its size; and the requests whose payload
        #: was pushed out (whether each one's class was the client's), counted if chosen when their record comes.
        self._held: OrderedDict[str, tuple[Payload, int]] = OrderedDict()
        self._held_bytes = 0
        self._gone: OrderedDict[str, bool] = OrderedDict()
        self._pushed_out_at = pushed_out
        self._queue: queue.Queue[tuple[RequestRecord, str, Payload] | None] = queue.Queue(QUEUE_ROWS)
        self._parts: list[_Part] = []
        self._fd: int | None = None
        self._rows = self._bytes = self._dropped_cap = self._dropped_behind = 0
        self._weak: tuple[str, ...] = ()
        self._weak_at = -math.inf
        #: Why capture is off for good (lossy verification, no hook, a file not cut back to whole lines); why
        #: writing failed, until it is tried again.
        self._refused = stopped
        self._failed: str | None = None
        self._retry_at = -math.inf
        self._stem = f"capture-{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
        self._index = 0
        self._thread: threading.Thread | None = None
        earlier = _ATTACHED.get(hub)
        if earlier is not None:
            earlier.close()
        _ATTACHED[hub] = self
        hub.set_capture(self.status)
        if stopped is not None:
            log.warning("specscope: capture is off: %s", stopped)
            return
        self._thread = threading.Thread(target=self._run, name="specscope-capture", daemon=True)
        self._thread.start()
        hub.requests.add_listener(self._on_record)
        with _active_lock:
            active += 1

    @property
    def running(self) -> bool:
        """Whether requests are taken (not refused, not closed)."""
        return self._thread is not None and self._refused is None

    def hold(self, request_id: str, payload: Payload) -> None:
        """Keep ``payload`` until the request's record is final (vLLM's path: a dict insert; the oldest go past
        :data:`MAX_HELD` requests or :data:`MAX_HELD_BYTES`)."""
        if not self.running:
            return
        size = held_size(payload)
        with self._lock:
            old = self._held.pop(request_id, None)
            self._held_bytes += size - (old[1] if old else 0)
            self._held[request_id] = (payload, size)
            while len(self._held) > MAX_HELD or self._held_bytes > MAX_HELD_BYTES:
                rid, (pushed, n) = self._held.popitem(last=False)
                self._held_bytes -= n
                self._gone[rid] = pushed.client_class
            while len(self._gone) > MAX_HELD:  # never claimed by a record: counted, chosen or not
                self._gone.popitem(last=False)
                self._dropped_behind += 1

    def status(self) -> CaptureStatus:
        """Counts for the snapshot: never the captured text or where it is."""
        with self._lock:
            return CaptureStatus(", ".join(self.config.classes), self._rows, self._bytes, self._dropped_cap,
                                 self._dropped_behind + pushed_out - self._pushed_out_at,
                                 self._weak if WEAK in self.config.classes else (), self._refused or self._failed)

    def close(self) -> None:
        """Write what is queued, close the file, let go of what is held, and stop listening."""
        global active
        if self._thread is None:
            return
        self._hub.requests.remove_listener(self._on_record)
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._thread = None
        with self._lock:
            self._held.clear()
            self._gone.clear()
            self._held_bytes = 0
        with _active_lock:
            active -= 1

    def _on_record(self, rec: RequestRecord) -> None:
        client: bool | None = None
        with self._lock:
            held = self._held.pop(rec.request_id, None)
            if held is not None:
                self._held_bytes -= held[1]
                client = held[0].client_class
            elif rec.request_id in self._gone:
                client = self._gone.pop(rec.request_id)
        if client is None or not self.running:
            return
        name = rec.class_name or ""
        if not self._chosen(name, client) or (self.config.rate < 1 and random.random() >= self.config.rate):
            return
        if held is None or held[0].messages is LOST:  # chosen, but what it needs was let go
            with self._lock:
                self._dropped_behind += 1
            return
        payload = held[0]
        if not payload.output_ids or payload.prompt_ids is None:
            return
        try:
            self._queue.put_nowait((rec, name, payload))
        except queue.Full:
            with self._lock:
                self._dropped_behind += 1

    def _chosen(self, name: str, client: bool) -> bool:
        if client:  # a class the client claimed: only where the operator named it so
            return BAGGAGE + name in self.config.classes
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
            try:
                item = self._queue.get(timeout=RECOUNT_S)
            except queue.Empty:
                self._let_go(self._removed(None), at_cap=True)
                continue
            if item is None:
                break
            try:
                line = json.dumps(row(*item, model=self._model), ensure_ascii=False).encode() + b"\n"
            except Exception as exc:  # this request's row alone: counted, and capture goes on
                with self._lock:
                    self._dropped_behind += 1
                self._hub.health.count_error("capture row", RuntimeError(f"a row could not be made ({failure(exc)})"))
                continue
            self._put(line)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        self._let_go(self._removed(None), at_cap=True)

    def _put(self, line: bytes) -> None:
        """Write ``line`` whole, or count it as dropped: at the cap (larger than a file), or behind (writing off)."""
        part_bytes = self._part_bytes()
        if len(line) > part_bytes:
            with self._lock:
                self._dropped_cap += 1
            return
        if self._refused is not None or (self._failed is not None and time.monotonic() < self._retry_at):
            with self._lock:
                self._dropped_behind += 1
            return
        try:
            self._write(line, part_bytes)
        except Exception as exc:  # a full disk, a directory taken away: said by its kind, tried again later
            why = "a short write" if isinstance(exc, _ShortWrite) else failure(exc)
            failed = f"writing failed: {why}; tried again after {RETRY_S:.0f} s"
            with self._lock:
                self._dropped_behind += 1
                first, self._failed = self._failed is None, failed
                self._retry_at = time.monotonic() + RETRY_S
            if first:
                self._hub.health.count_error("capture", RuntimeError(failed))  # logged once, in one line
            return
        if self._failed is not None:
            with self._lock:
                self._failed = None
            log.warning("specscope: capture writes again")

    def _part_bytes(self) -> int:
        """The size of a file: the budget's share of one of :data:`PARTS` files of each API-server process."""
        return self.config.max_bytes // (PARTS * max(1, self._hub.server_processes))

    def _write(self, line: bytes, part_bytes: int) -> None:
        if self._fd is None or self._parts[-1].size + len(line) > part_bytes:
            self._next_part(part_bytes)
        fd, part = self._fd, self._parts[-1]
        assert fd is not None
        try:
            written = os.write(fd, line)
        except OSError:
            self._cut(fd, part)
            raise
        if written != len(line):
            self._cut(fd, part)
            raise _ShortWrite("a short write")
        with self._lock:
            self._parts[-1] = _Part(part.path, part.rows + 1, part.size + written)
            self._rows += 1
            self._bytes += written

    def _cut(self, fd: int, part: _Part) -> None:
        """Cut the file in flight (``fd``) back to its last whole line; where that fails, remove it (its rows
        counted as dropped), and where that fails too, write no more."""
        try:
            os.ftruncate(fd, part.size)
            return
        except OSError:
            os.close(fd)
            self._fd = None
        try:
            os.unlink(part.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            why = f"writing failed: a file could not be cut back to whole lines ({failure(exc)})"
            with self._lock:
                self._refused = why
            self._hub.health.count_error("capture", RuntimeError(why))
            return
        self._let_go([part], at_cap=False)

    def _next_part(self, part_bytes: int) -> None:
        """Close the file in flight; make room in the directory for every process's next file; begin a new one."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with self._directory_locked():
            room = self.config.max_bytes - part_bytes * max(1, self._hub.server_processes)
            present = self._trim(room)
            self._let_go(self._removed(present), at_cap=True)
            path = self.directory / f"{self._stem}-{self._index:04d}.jsonl"
            self._index += 1
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | private.OPEN_FLAGS, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # in flight: no process removes it
            except OSError:
                os.close(fd)
                raise
        self._fd = fd
        with self._lock:
            self._parts.append(_Part(path, 0, 0))

    @contextlib.contextmanager
    def _directory_locked(self) -> Iterator[None]:
        """The directory's lock: one process at a time makes room and begins a file."""
        dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | private.OPEN_FLAGS)
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(dfd)

    def _trim(self, room: int) -> set[str]:
        """Remove the oldest capture files of the directory (not one being written) until they take at most
        ``room`` bytes; the names of those left."""
        files = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if _FILE.fullmatch(entry.name):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        files.append((st.st_mtime_ns, entry.name, st.st_size))
        total = sum(size for _, _, size in files)
        present = {name for _, name, _ in files}
        for _, name, size in sorted(files):
            if total <= room:
                break
            if self._remove(self.directory / name):
                total -= size
                present.discard(name)
        return present

    @staticmethod
    def _remove(path: Path) -> bool:
        """Remove a capture file unless a process is writing it (it holds the file's lock)."""
        try:
            fd = os.open(path, os.O_RDONLY | private.OPEN_FLAGS)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        else:
            os.unlink(path)
            return True
        finally:
            os.close(fd)

    def _removed(self, present: set[str] | None) -> list[_Part]:
        """This capture's files that are gone, removed at the cap by any process. ``present``: the names left in
        the directory (None: look); the file in flight is never among those gone."""
        with self._lock:
            parts = list(self._parts)
        in_flight = parts[-1] if self._fd is not None and parts else None
        return [p for p in parts if p != in_flight and not (
            p.path.name in present if present is not None else os.path.lexists(p.path))]

    def _let_go(self, gone: list[_Part], at_cap: bool) -> None:
        """Forget files of this capture that are gone: their rows dropped at the cap, or behind (the disk)."""
        with self._lock:
            self._parts = [p for p in self._parts if p not in gone]
            for p in gone:
                self._rows -= p.rows
                self._bytes -= p.size
                if at_cap:
                    self._dropped_cap += p.rows
                else:
                    self._dropped_behind += p.rows


def weak_classes(hub: Hub) -> tuple[str, ...]:
    """The classes of the server's window (``hub.snapshot()``: every API-server process's, where they share) that
    drafted enough and accept under the weak-draft line (the ``SpecscopeWeakDraftForClass`` thresholds), by name."""
    from specscope.export.alerts.rules import Thresholds

    t = Thresholds()
    snap = hub.snapshot()
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
