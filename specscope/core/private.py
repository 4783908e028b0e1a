"""Files only this user can read: directories and files specscope writes that no other local user may plant, link,
enter or read (the share directory of :mod:`specscope.engine.share`, the captured traffic of
:mod:`specscope.engine.capture`)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

#: Flags every open of a private file adds: never through a symlink, never blocking on a planted FIFO.
OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def refusal(st: os.stat_result, directory: bool = False) -> str | None:
    """Why a file (or directory) with this ``lstat``/``fstat`` is not private to us; None if it is."""
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
        return "not a directory" if directory else "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):o} lets others in"
    return None


def private_directory(path: Path, what: str = "share directory") -> Path:
    """``path``, created 0700 if absent; PermissionError (naming it ``what``) if it is not a private directory of
    ours."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    why = refusal(os.lstat(path), directory=True)
    if why:
        raise PermissionError(f"{what} {path}: {why}; refused")
    return path


def open_private(path: Path, flags: int) -> int:
    """A descriptor of ``path`` (never through a symlink) if it is a regular file of ours; else PermissionError."""
    try:
        fd = os.open(path, flags | OPEN_FLAGS, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError(f"{path}: a symlink; refused") from None
        raise
    why = refusal(os.fstat(fd))
    if why:
        os.close(fd)
        raise PermissionError(f"{path}: {why}; refused")
    return fd


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` at once: through a fresh ``O_EXCL|O_NOFOLLOW`` temp file of ours (0600) beside it,
    renamed over ``path`` (which replaces a symlink there, never its target); the temp file is removed on failure."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
