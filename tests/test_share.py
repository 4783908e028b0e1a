"""The API-server share directory against another local user: each test plants what an attacker could."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from specscope.codec import encode
from specscope.hub import Hub
from specscope.share import ProcessShare, default_directory

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user")


def as_nobody(act: Callable[[], object], hold: bool = False) -> Callable[[], None]:
    """Run ``act`` in a child process as uid/gid 65534. With ``hold`` the child (and what it holds open) lives on
    until the returned function is called."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(ready_r)
            os.close(done_w)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            act()
            os.write(ready_w, b"1")
            os.read(done_r, 1)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    ok = os.read(ready_r, 1) == b"1"
    os.close(ready_r)

    def finish() -> None:
        os.close(done_w)
        assert os.waitpid(pid, 0)[1] == 0

    if not ok or not hold:
        finish()
    assert ok, "the other user's process failed"
    return finish


def plant(directory: Path, act: Callable[[], object], hold: bool = False) -> Callable[[], None]:
    """Another user plants files in ``directory`` while it is open to all, then it is private again."""
    directory.chmod(0o777)
    try:
        return as_nobody(act, hold)
    finally:
        directory.chmod(0o700)


def share_errors(hub: Hub) -> int:
    return dict(hub.local_snapshot().health.errors).get("process share", 0)


def wait_for(check: Callable[[], bool], rounds: float = 0.3) -> None:
    """Wait for ``check``, then a few more rounds of the share's thread (so that a repeat would show)."""
    deadline = time.monotonic() + 5
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(rounds)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory under the temp directory that another user can reach."""
    path = Path(tempfile.mkdtemp(prefix="specscope-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def shared(base: Path) -> Path:
    directory = base / "share"
    directory.mkdir(mode=0o700)
    return directory


@needs_root
def test_a_directory_another_user_made_first_is_refused(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base.chmod(0o1777)  # like /tmp
    mine = f"specscope-{os.geteuid()}-{os.getppid()}"
    as_nobody(lambda: [(base / name).mkdir(mode=0o700) for name in ("chosen", mine)])
    with pytest.raises(PermissionError, match="owned by uid 65534"):  # a chosen directory: no sharing
        ProcessShare(Hub(), 0, base / "chosen", 60)
    monkeypatch.delenv("SPECSCOPE_SHARE_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    hub = Hub()
    share = ProcessShare(hub, 0, interval_s=60)  # the default: the next name, which the other processes reach too
    try:
        assert share.directory == base / f"{mine}.1"
        assert os.stat(share.directory).st_uid == os.geteuid() and os.stat(share.directory).st_mode & 0o777 == 0o700
        assert share_errors(hub) == 1
    finally:
        share.close()


def test_a_directory_others_can_enter_or_a_symlink_is_refused(base: Path) -> None:
    (base / "open").mkdir()
    (base / "open").chmod(0o777)
    with pytest.raises(PermissionError, match="mode 777"):
        ProcessShare(Hub(), 0, base / "open", 60)
    (base / "private").mkdir(mode=0o700)
    (base / "link").symlink_to(base / "private")
    with pytest.raises(PermissionError, match="not a directory"):
        ProcessShare(Hub(), 0, base / "link", 60)


def test_the_default_is_under_a_private_xdg_runtime_dir(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSCOPE_SHARE_DIR", raising=False)
    (base / "run").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base / "run"))
    assert default_directory().parent == base / "run"
    (base / "run").chmod(0o777)  # not a runtime directory to trust
    assert default_directory().parent == Path(tempfile.gettempdir())


@needs_root
def test_writes_never_follow_a_planted_symlink(base: Path, shared: Path) -> None:
    victim = base / "victim"
    victim.write_bytes(b"precious")
    plant(shared, lambda: [(shared / name).symlink_to(victim) for name in ("0.json", "0.tmp", ".0.tmp")])
    share = ProcessShare(Hub(), 0, shared, 0.02)
    try:
        wait_for(lambda: not (shared / "0.json").is_symlink())
    finally:
        share.close()
    assert victim.read_bytes() == b"precious"
    published = os.lstat(shared / "0.json")
    assert published.st_uid == os.geteuid() and published.st_mode & 0o777 == 0o600


@needs_root
def test_files_another_user_planted_are_not_merged_and_are_counted_once(base: Path, shared: Path) -> None:
    valid = b"".join(encode(Hub().local_snapshot()))
    (base / "elsewhere.json").write_bytes(valid)  # ours, but outside the directory

    def attack() -> None:
        for name in ("1.json", "evil.json"):
            (shared / name).write_bytes(valid)
        (shared / "2.json").symlink_to(base / "elsewhere.json")

    plant(shared, attack)
    (shared / "5.json").write_bytes(valid)  # ours, but no such process (2 processes)
    hub = Hub()
    share = ProcessShare(hub, 0, shared, 0.02, processes=2)
    try:
        wait_for(lambda: share_errors(hub) >= 4)
        assert share.others() == [] and hub.snapshot().processes == 1
        assert share_errors(hub) == 4  # once each, not once a round
        os.utime(shared / "1.json", ns=(0, 10**9))  # a new version of a bad file counts again
        wait_for(lambda: share_errors(hub) >= 5)
        assert share_errors(hub) == 5
    finally:
        share.close()


@needs_root
def test_a_lock_another_user_planted_and_holds_is_not_honoured(base: Path, shared: Path) -> None:
    import fcntl

    victim = base / "victim"
    victim.write_bytes(b"precious")
    held: list[int] = []

    def attack() -> None:
        fd = os.open(shared / "prometheus.lock", os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)  # kept open while the child lives
        (shared / "alerts.lock").symlink_to(victim)

    release = plant(shared, attack, hold=True)
    a, b = Hub(), Hub()
    share_a, share_b = ProcessShare(a, 0, shared, 60), ProcessShare(b, 1, shared, 60)
    try:
        assert share_a.lead("prometheus") and not share_b.lead("prometheus")  # still one of the server's
        assert share_b.lead("alerts") and not share_a.lead("alerts")
        assert victim.read_bytes() == b"precious"
        assert share_errors(a) == 1 and share_errors(b) == 1
        for role in ("prometheus", "alerts"):
            st = os.lstat(shared / f"{role}.lock")
            assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o600
    finally:
        share_a.close()
        share_b.close()
        release()


def test_a_peer_file_that_does_not_parse_shows_in_health(shared: Path) -> None:
    (shared / "1.json").write_bytes(b"{not json")
    (shared / "1.json").chmod(0o600)
    hub = Hub()
    share = ProcessShare(hub, 0, shared, 0.02)
    try:
        wait_for(lambda: share_errors(hub) >= 1)
        assert share_errors(hub) == 1 and share.others() == []
        assert "1.json" in (hub.local_snapshot().health.last_error or "")
    finally:
        share.close()
