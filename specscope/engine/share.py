"""One server's numbers across its API-server processes (``vllm serve --api-server-count N``).

Each API-server process loads the stat-logger plugin and records only its share of the steps and requests. With a
:class:`ProcessShare` attached, every process publishes its own snapshot to a directory the server's processes
share once a ``interval_s``, reads the others' in the same background thread, and its hub's
:meth:`~specscope.state.hub.Hub.snapshot` is the merge of all (:func:`specscope.state.merge.merge`): the same
whole-server
numbers from whichever process a load balancer reaches. Exports that must happen once per server (the Prometheus
port, OTLP, alert notifications) go to the process that holds the role's lock (:meth:`ProcessShare.lead`). What
cannot be done: numbers recorded in the last ``interval_s`` by another process show up one interval late, and
roles do not move if their process dies (vLLM restarts its API servers together).

A process that is gone keeps its lifetime counts in the merge, never its window or gauges
(:func:`specscope.state.merge.aged`). Gone is decided without wall-clock time, which steps (NTP, an operator): each file
names its publisher's pid and a number the publisher raises with every write; the reader notes on its own monotonic
clock when that number last changed. A peer whose pid no longer exists is gone at once; one not seen to publish for
:data:`STALE_S` of the reader's monotonic time is gone too (a hung process, or a pid this reader cannot check: another
host or pid namespace). The wall-clock times in the snapshots are shown, never used to judge a peer.

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
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from specscope.core import codec, private
from specscope.core.model import Snapshot
from specscope.state.merge import aged

if TYPE_CHECKING:
    from specscope.state.hub import Hub

log = logging.getLogger("specscope")

#: Request records each process publishes (the merge keeps the newest of all).
PUBLISHED_REQUESTS = 200
#: Seconds of the reader's monotonic clock after which a peer not seen to publish is gone.
STALE_S = 30.0
#: Where the ``vllm serve`` process hands the directory it named to its API-server processes (not a setting).
SERVER_ENV = "SPECSCOPE_SERVER_SHARE_DIR"

_PEER = re.compile(r"(0|[1-9][0-9]{0,5})\.json")
#: The reader's clock for peers' ages (a name of its own, for tests to move).
monotonic = time.monotonic


def _pid_namespace() -> str:
    """This host and pid namespace: the pids of files written in the same one name processes this one can see."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return f"{os.uname().nodename} {ns}"


_PID_NAMESPACE = _pid_namespace()


@dataclass(frozen=True)
class _Peer:
    """Another process's file as last read."""

    version: tuple[int, int, int, int]  # the file's (inode, mtime_ns, ctime_ns, size): unchanged, it is not reread
    mark: tuple[int, int]  # the publisher's (pid, write number): a change is a publish
    seen: float  # the reader's monotonic time when the mark last changed
    pid: int | None  # the pid to check; None where the publisher is in another host or pid namespace
    snap: Snapshot

    def alive(self, now: float) -> bool:
        """Seen to publish within :data:`STALE_S` before ``now`` (reader-monotonic), and its pid, where it can be
        checked, still exists."""
        if now - self.seen > STALE_S:
            return False
        if self.pid is not None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:  # it exists (another user's, so a reused pid): the silence limit decides
                pass
        return True


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
        self._peers: dict[str, _Peer] = {}  # replaced whole by each read, never changed in place
        self._written = 0  # the number of this process's last write
        self._bad: dict[str, tuple[int, int, int, int]] = {}  # refused files, counted once per version
        self._locks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specscope-share", daemon=True)
        self._thread.start()

    def others(self) -> list[Snapshot]:
        """The other processes' last published snapshots (read in the background; never blocks), those of processes
        gone as of now :func:`~specscope.state.merge.aged` (see the module docstring)."""
        now = monotonic()
        return [p.snap if p.alive(now) else aged(p.snap) for p in self._peers.values()]

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
                self.exchange()
            except Exception as exc:  # a full disk, a vanished directory: counted, never raised
                self._count(exc)

    def exchange(self) -> None:
        """Publish this process's snapshot and read the others' now (the background thread does so every
        ``interval_s``)."""
        self._publish()
        self._read()

    def _publish(self) -> None:
        snap = self._local.local_snapshot(forwards_alone=True)
        self._written += 1
        head = json.dumps({"pid": os.getpid(), "pid_namespace": _PID_NAMESPACE, "seq": self._written},
                          separators=(",", ":"))
        data = b"".join([f'{head[:-1]},"snapshot":'.encode(),
                         *codec.encode(replace(snap, requests=snap.requests[-PUBLISHED_REQUESTS:])), b"}"])
        private.replace_file(self.directory / f"{self.rank}.json", data)

    def _load(self, name: str) -> tuple[tuple[int, int], int | None, Snapshot]:
        """A peer's file: its publisher's (pid, write number), the pid to check (None: not one this process can
        see) and its snapshot."""
        path = self.directory / name
        match = _PEER.fullmatch(name)
        if not match:
            raise PermissionError(f"{path}: not named <rank>.json; refused")
        if self._processes is not None and int(match[1]) >= self._processes:
            raise PermissionError(f"{path}: rank beyond the server's {self._processes} processes; refused")
        with os.fdopen(private.open_private(path, os.O_RDONLY), "rb") as f:
            data = f.read()
        try:
            doc = json.loads(data)
            pid, seq = doc["pid"], doc["seq"]
            if type(pid) is not int or pid <= 0 or type(seq) is not int:
                raise ValueError(f"no publisher's pid and write number (pid {pid!r}, seq {seq!r})")
            snap = codec.from_dict(doc["snapshot"])
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{path}: not a share file: {exc}") from None
        return (pid, seq), pid if doc.get("pid_namespace") == _PID_NAMESPACE else None, snap

    def _read(self) -> None:
        now = monotonic()
        peers: dict[str, _Peer] = {}
        bad: dict[str, tuple[int, int, int, int]] = {}
        for entry in os.scandir(self.directory):
            if not entry.name.endswith(".json") or entry.name == f"{self.rank}.json":
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since the listing
            version = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            known = self._peers.get(entry.name)
            if known is not None and known.version == version:
                peers[entry.name] = known
                continue
            try:
                mark, pid, snap = self._load(entry.name)
            except FileNotFoundError:
                continue  # gone since the listing
            except Exception as exc:  # refused or unreadable: counted once per version of the file
                bad[entry.name] = version
                if self._bad.get(entry.name) != version:
                    self._count(exc)
                continue
            seen = known.seen if known is not None and known.mark == mark else now
            peers[entry.name] = _Peer(version, mark, seen, pid, snap)
        self._bad = bad
        self._peers = peers


def join(hub: Hub, rank: int, processes: int) -> Callable[[str], bool] | None:
    """Share ``hub``'s numbers with the server's other API-server processes (this one is ``rank`` of ``processes``,
    as vLLM numbers them); returns whether this process is to serve an export role (None: nothing to share).

    Where sharing is impossible the process goes on alone and says so: a warning, an error in health, snapshots
    that hold 1 of ``processes`` (``Snapshot.server_processes``), and every export role with process 0 alone."""
    if processes <= 1 and not os.environ.get("SPECSCOPE_SHARE_DIR"):
        return None
    hub.set_server_processes(processes)
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
