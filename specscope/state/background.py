"""The hub's helpers off the engine's path: finished requests to the listeners, GPU memory readings for the
snapshots, and the writers that keep steps to flush before a read."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable

from specscope.core.health import HealthLog
from specscope.core.model import GpuMemory, RequestRecord

#: A finished-request consumer; runs on the dispatch thread, never in the engine's.
Listener = Callable[[RequestRecord], None]
#: A polled source of GPU memory readings (see :mod:`specscope.engine.gpu_source`).
GpuSource = Callable[[], GpuMemory]


class Dispatcher:
    """Hands final request records to the listeners on one daemon thread, through a bounded queue (a full queue
    drops them, counted in ``health``); while idle it publishes what ``expired`` releases (records whose other part
    never came)."""

    def __init__(self, health: HealthLog, expired: Callable[[], list[RequestRecord]]) -> None:
        self.listeners: list[Listener] = []
        self.queue: queue.Queue[RequestRecord] = queue.Queue(maxsize=10_000)
        self._health = health
        self._expired = expired
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, listener: Listener) -> None:
        """Call ``listener`` with every record published from now on (the thread starts with the first)."""
        with self._lock:
            self.listeners.append(listener)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specscope-dispatch", daemon=True)
                self._thread.start()

    def remove(self, listener: Listener) -> None:
        """Stop calling ``listener``."""
        with self._lock:
            self.listeners = [x for x in self.listeners if x != listener]

    def publish(self, records: list[RequestRecord]) -> None:
        """Queue ``records`` for the listeners, if there are any; never blocks."""
        if not records or not self.listeners:
            return
        for rec in records:
            try:
                self.queue.put_nowait(rec)
            except queue.Full:
                self._health.count_dropped()

    def wait_idle(self, timeout: float) -> bool:
        """Block until every record queued so far reached the listeners; False after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.queue.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False

    def _run(self) -> None:
        while True:
            try:
                rec = self.queue.get(timeout=1.0)
            except queue.Empty:
                self.publish(self._expired())  # even when the engine is idle
                continue
            for listener in list(self.listeners):
                try:
                    listener(rec)
                except Exception as exc:  # a consumer's failure must not stop the others
                    self._health.count_error(f"listener {getattr(listener, '__qualname__', listener)!s}", exc)
            self.queue.task_done()


class GpuPoller:
    """GPU sources polled every ``interval`` seconds on a background thread (NVML takes milliseconds, which no
    reader, least of all a server's event loop, should wait for); a snapshot takes the last reading."""

    def __init__(self, interval: float, health: HealthLog) -> None:
        self.interval = interval
        self.sources: list[tuple[str, GpuSource]] = []
        self.last = GpuMemory(status="not collected")
        self._health = health
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, name: str, source: GpuSource) -> None:
        """Poll ``source`` from now on, replacing one of the same name; a first reading is taken now."""
        with self._lock:
            self.sources = [(n, s) for n, s in self.sources if n != name] + [(name, source)]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specscope-gpu", daemon=True)
                self._thread.start()
        self._wake.set()
        self.poll()

    def poll(self) -> None:
        """Ask every source once, the first that answers wins (what the thread does each interval)."""
        for name, source in list(self.sources):
            try:
                self.last = source()
                break
            except Exception as exc:
                self._health.count_error(f"gpu source {name}", exc)

    def _run(self) -> None:
        while True:
            self._wake.clear()
            self._wake.wait(max(self.interval, 0.01))
            self.poll()


class Flushers:
    """Writers that keep steps before adding them (the stat logger), flushed before every read so that readers see
    every step recorded so far; held weakly, and a failing one is counted in ``health``."""

    def __init__(self, health: HealthLog) -> None:
        self._health = health
        self._lock = threading.Lock()
        self._refs: list[weakref.WeakMethod[Callable[[], None]]] = []

    def add(self, flush: Callable[[], None]) -> None:
        """Call ``flush`` (a bound method) before every read while its object lives."""
        with self._lock:
            self._refs = [w for w in self._refs if w() is not None]
            self._refs.append(weakref.WeakMethod(flush))

    def flush(self) -> None:
        """Call every live writer's flush."""
        for ref in self._refs:
            flush = ref()
            if flush is not None:
                try:
                    flush()
                except Exception as exc:
                    self._health.count_error("stat logger flush", exc)
