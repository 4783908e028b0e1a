"""One server's numbers across its API-server processes (``vllm serve --api-server-count N``).

Each API-server process loads the stat-logger plugin and records only its share of the steps and requests. With a
:class:`ProcessShare` attached, every process publishes its own snapshot to a directory the server's processes
share (``SPECSCOPE_SHARE_DIR``, by default a private directory named after their common parent process) once a
``interval_s``, reads the others' in the same background thread, and its hub's :meth:`~specscope.hub.Hub.snapshot`
is the merge of all (:func:`specscope.merge.merge`): the same whole-server numbers from whichever process a load
balancer reaches. Exports that must happen once per server (the Prometheus port, OTLP, alert notifications) go to
the process that holds the role's lock (:meth:`ProcessShare.lead`). What cannot be done: numbers recorded in the
last ``interval_s`` by another process show up one interval late, and roles do not move if their process dies
(vLLM restarts its API servers together).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import IO

from specscope.model import Snapshot, encode

log = logging.getLogger("specscope")

#: Request records each process publishes (the merge keeps the newest of all).
PUBLISHED_REQUESTS = 200
#: A process's file older than this is someone gone: its counts stay, its gauges are not fresh anyway.
STALE_S = 30.0


def default_directory() -> Path:
    """``SPECSCOPE_SHARE_DIR``, else a directory named after the parent process (the ``vllm serve`` process)."""
    chosen = os.environ.get("SPECSCOPE_SHARE_DIR")
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / f"specscope-{os.getuid()}-{os.getppid()}"


class ProcessShare:
    """Publishes this process's snapshot and collects the other processes' (see the module docstring)."""

    def __init__(self, local: object, rank: int, directory: Path | None = None, interval_s: float = 1.0) -> None:
        self.directory = directory or default_directory()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.rank = rank
        self._local = local  # the hub, read through its local_snapshot()
        self._interval = interval_s
        self._others: list[Snapshot] = []
        self._locks: dict[str, IO[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specscope-share", daemon=True)
        self._thread.start()

    def others(self) -> list[Snapshot]:
        """The other processes' last published snapshots (read in the background; never blocks)."""
        return list(self._others)

    def lead(self, role: str) -> bool:
        """Whether this process holds ``role`` (a lock in the shared directory, held until the process ends)."""
        if role in self._locks:
            return True
        f = open(self.directory / f"{role}.lock", "w")  # noqa: SIM115  (held open: the lock lives with it)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        f.write(str(os.getpid()))
        f.flush()
        self._locks[role] = f
        return True

    def close(self) -> None:
        """Stop publishing; release the roles."""
        self._stop.set()
        self._thread.join(5)
        for f in self._locks.values():
            f.close()
        self._locks.clear()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._publish()
                self._read()
            except Exception as exc:  # a full disk, a vanished directory: counted, never raised
                count = getattr(self._local, "count_error", None)
                if count is not None:
                    count("process share", exc)

    def _publish(self) -> None:
        snap: Snapshot = self._local.local_snapshot()  # type: ignore[attr-defined]
        snap = replace(snap, requests=snap.requests[-PUBLISHED_REQUESTS:])
        path = self.directory / f"{self.rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(b"".join(encode(snap)))
        os.replace(tmp, path)

    def _read(self) -> None:
        others = []
        now = time.time()
        for path in self.directory.glob("*.json"):
            if path.stem == str(self.rank):
                continue
            try:
                snap = Snapshot.from_dict(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # being replaced, or not ours
            if now - snap.time > STALE_S:  # gone: keep its counts, not its gauges
                snap = replace(snap, engines=tuple(replace(e, updated_at=0.0) for e in snap.engines))
            others.append(snap)
        self._others = others
