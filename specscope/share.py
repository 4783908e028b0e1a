"""One server's numbers across its API-server processes (``vllm serve --api-server-count N``).

Each API-server process loads the stat-logger plugin and records only its share of the steps and requests. With a
:class:`ProcessShare` attached, every process publishes its own snapshot to a directory the server's processes
share once a ``interval_s``, reads the others' in the same background thread, and its hub's
:meth:`~specscope.hub.Hub.snapshot` is the merge of all (:func:`specscope.merge.merge`): the same whole-server
numbers from whichever process a load balancer reaches. Exports that must happen once per server (the Prometheus
port, OTLP, alert notifications) go to the process that holds the role's lock (:meth:`ProcessShare.lead`). What
cannot be done: numbers recorded in the last ``interval_s`` by another process show up one interval late, and
roles do not move if their process dies (vLLM restarts its API servers together).

The directory: ``SPECSCOPE_SHARE_DIR`` where set, else one the ``vllm serve`` process names before it starts its
API-server processes (:func:`name_directory`, vLLM's ``vllm.general_plugins`` entry point): ``specscope-<uid>-<128
random bits>`` under ``$XDG_RUNTIME_DIR`` where that is private, else the temp directory, handed to the children
in the environment they inherit (``SPECSCOPE_SERVER_SHARE_DIR``) and removed when that process exits. Nobody else
can know the name before the first API-server process makes it. Where sharing is impossible (no name, a directory
that fails the checks), :func:`join` says so instead of passing a part for the whole: a warning, an error in health,
snapshots that say they hold 1 of N processes (``Snapshot.server_processes``), exports from process 0 alone.

Security: the directory must be ours (owner our euid, no group/other permission bits, not a symlink); one that is
not is refused with :class:`PermissionError` (no sharing). Files are written through a fresh
``O_EXCL|O_NOFOLLOW`` temp file and an atomic rename; only regular files named ``<rank>.json`` that we own and
nobody else can access are read, without following symlinks; a lock file that is not ours is replaced, never
honoured. Each refused or unreadable file is counted once per version in the hub's health (``process share``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import multiprocessing
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from specscope import codec, private
from specscope.model import Snapshot

if TYPE_CHECKING:
    from specscope.hub import Hub

log = logging.getLogger("specscope")

#: Request records each process publishes (the merge keeps the newest of all).
PUBLISHED_REQUESTS = 200
#: Where the ``vllm serve`` process hands the directory it named to its API-server processes (not a setting).
SERVER_ENV = "SPECSCOPE_SERVER_SHARE_DIR"

_PEER = re.compile(r"(0|[1-9][0-9]{0,5})\.json")


def name_directory() -> None:
    """vLLM's ``vllm.general_plugins`` entry point, which vLLM calls in every process it runs, in ``vllm serve``'s
    before it spawns its API-server processes: name a directory for them in the environment they inherit, and remove
    it (if made) when this process exits. Nothing where ``SPECSCOPE_SHARE_DIR`` is set, nor in a process that vLLM
    started (``multiprocessing`` child) and that inherited a name: the API servers keep their parent's."""
    if os.environ.get("SPECSCOPE_SHARE_DIR") or (SERVER_ENV in os.environ
                                                 and multiprocessing.parent_process() is not None):
        return
    root = Path(tempfile.gettempdir())
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        with contextlib.suppress(OSError):
            st = os.stat(runtime)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                root = Path(runtime)
    path = root / f"specscope-{os.geteuid()}-{secrets.token_hex(16)}"
    os.environ[SERVER_ENV] = str(path)
    atexit.register(_remove, path)


def _remove(path: Path) -> None:
    """Remove the directory :func:`name_directory` named, if it was made and is ours."""
    with contextlib.suppress(OSError):
        if private.refusal(os.lstat(path), directory=True) is None:
            shutil.rmtree(path)


def default_directory() -> Path:
    """``SPECSCOPE_SHARE_DIR``, else the directory the ``vllm serve`` process named; OSError where neither is set."""
    path = os.environ.get("SPECSCOPE_SHARE_DIR") or os.environ.get(SERVER_ENV)
    if not path:
        raise OSError(f"no share directory: the vllm serve process named none ({SERVER_ENV} unset: is specscope "
                      "left out of VLLM_PLUGINS?) and SPECSCOPE_SHARE_DIR is unset")
    return Path(path)


class ProcessShare:
    """Publishes this process's snapshot and collects the other processes' (see the module docstring).

    ``processes``: the server's number of API-server processes, if known (files of other ranks are refused)."""

    def __init__(self, local: Hub, rank: int, directory: Path | None = None, interval_s: float = 1.0,
                 processes: int | None = None) -> None:
        self._local = local
        self.directory = private.private_directory(directory or default_directory())
        self.rank = rank
        self._processes = processes
        self.interval_s = interval_s
        self._others: list[Snapshot] = []
        self._bad: dict[str, tuple[int, int, int]] = {}  # refused files, counted once per version
        self._locks: dict[str, int] = {}
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
        path = self.directory / f"{role}.lock"
        try:
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | private.OPEN_FLAGS)
            try:
                fcntl.flock(dfd, fcntl.LOCK_EX)  # one process at a time checks (and replaces) the lock file
                try:
                    fd = private.open_private(path, os.O_RDWR | os.O_CREAT)
                except PermissionError as exc:  # planted: never honoured, replaced by ours
                    self._count(exc)
                    os.unlink(path)
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | private.OPEN_FLAGS, 0o600)
            finally:
                os.close(dfd)
        except OSError as exc:
            self._count(exc)
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._locks[role] = fd
        return True

    def close(self) -> None:
        """Stop publishing; release the roles."""
        self._stop.set()
        self._thread.join(5)
        for fd in self._locks.values():
            os.close(fd)
        self._locks.clear()

    def _count(self, exc: BaseException) -> None:
        self._local.health.count_error("process share", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._publish()
                self._read()
            except Exception as exc:  # a full disk, a vanished directory: counted, never raised
                self._count(exc)

    def _publish(self) -> None:
        snap = self._local.local_snapshot(forwards_alone=True)
        data = b"".join(codec.encode(replace(snap, requests=snap.requests[-PUBLISHED_REQUESTS:])))
        private.replace_file(self.directory / f"{self.rank}.json", data)

    def _load(self, name: str) -> Snapshot:
        path = self.directory / name
        match = _PEER.fullmatch(name)
        if not match:
            raise PermissionError(f"{path}: not named <rank>.json; refused")
        if self._processes is not None and int(match[1]) >= self._processes:
            raise PermissionError(f"{path}: rank beyond the server's {self._processes} processes; refused")
        with os.fdopen(private.open_private(path, os.O_RDONLY), "rb") as f:
            data = f.read()
        try:
            return codec.from_dict(json.loads(data))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def _read(self) -> None:
        others, bad = [], {}
        for entry in os.scandir(self.directory):
            if not entry.name.endswith(".json") or entry.name == f"{self.rank}.json":
                continue
            try:
                snap = self._load(entry.name)
            except FileNotFoundError:
                continue  # gone since the listing
            except Exception as exc:  # refused or unreadable: counted once per version of the file
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                bad[entry.name] = version = (st.st_ino, st.st_mtime_ns, st.st_size)
                if self._bad.get(entry.name) != version:
                    self._count(exc)
                continue
            others.append(snap)
        self._bad = bad
        self._others = others


def join(hub: Hub, rank: int, processes: int) -> Callable[[str], bool] | None:
    """Share ``hub``'s numbers with the server's other API-server processes (this one is ``rank`` of ``processes``,
    as vLLM numbers them); returns whether this process is to serve an export role (None: nothing to share).

    Where sharing is impossible the process goes on alone and says so: a warning, an error in health, snapshots
    that hold 1 of ``processes`` (``Snapshot.server_processes``), and every export role with process 0 alone."""
    if processes <= 1 and not os.environ.get("SPECSCOPE_SHARE_DIR"):
        return None
    hub.server_processes = max(1, processes)
    try:
        share = ProcessShare(hub, rank, processes=processes if processes > 1 else None)
    except OSError as exc:
        hub.health.count_error("process share", exc)
        log.warning("specscope: this API-server process (index %d of %d) shares nothing: its snapshots hold its own "
                    "part of the server (\"1 of %d API-server processes\"), and the Prometheus port, OTLP and alerts "
                    "are served by index 0 alone", rank, processes, processes)
        return lambda role: rank == 0
    hub.attach_share(share)
    if rank == 0:  # a warning, so that it reaches the server's log under Python's default logging
        log.warning("specscope: %d API-server processes share their numbers through %s; each one's appear up to "
                    "%.0f s late in the others', and the Prometheus port, OTLP and notifications stay with the "
                    "process that took them", processes, share.directory, share.interval_s)
    return share.lead
