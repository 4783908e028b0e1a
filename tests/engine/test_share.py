"""The API-server share directory against another local user: each test plants what an attacker could.

Every attack runs twice. As "another uid" the attacker is uid 65534 (a child process that drops to it), which needs
root; run by another user, those cases that need a second uid are skipped with a reason that names what was not
tested (``pytest -rs``). As "this uid" the attacker is the test's own user planting what any user can plant in
reach of the share (symlinks, files and directories that others may enter), so those run for everyone.
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specscope.core.codec import encode
from specscope.engine.share import SERVER_ENV, ProcessShare, join, name_directory
from specscope.export.summary import part_line, summary
from specscope.state.hub import Hub, StepStats
from tests.conftest import REPO

NOBODY = 65534
ROOT = os.geteuid() == 0


def declared_entry_points(group: str) -> dict[str, str]:
    """The entry points of ``group`` that pyproject.toml declares (read as text: no tomllib on Python 3.10)."""
    lines = (REPO / "pyproject.toml").read_text().splitlines()
    points = {}
    for line in lines[lines.index(f'[project.entry-points."{group}"]') + 1:]:
        if not line.strip() or line.startswith("["):
            break
        name, value = line.split("=", 1)
        points[name.strip()] = value.strip().strip('"')
    return points


def needs_second_uid(what: str) -> None:
    """Skip, naming what goes untested, where no second uid can be had."""
    if not ROOT:
        pytest.skip(f"not tested: {what} (needs a second uid; run as root)")


def in_child(act: Callable[[], object], uid: int | None = None, hold: bool = False) -> Callable[[], None]:
    """Run ``act`` in a child process (as ``uid``/gid if given). With ``hold`` the child (and what it holds open)
    lives on until the returned function is called."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(ready_r)
            os.close(done_w)
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
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
    assert ok, "the attacker's process failed"
    return finish


def plant(directory: Path, act: Callable[[], object], other: bool, hold: bool = False) -> Callable[[], None]:
    """The attacker plants files in ``directory``: another uid while it is open to all, then it is private again;
    else this user."""
    if not other:
        return in_child(act, hold=hold)
    directory.chmod(0o777)
    try:
        return in_child(act, NOBODY, hold)
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


@pytest.fixture(params=["another uid", "this uid"])
def other(request: pytest.FixtureRequest) -> bool:
    """Whether the attacker is another uid (else this user, planting what it can against itself)."""
    return bool(request.param == "another uid")


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


@pytest.fixture
def server(base: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process as a ``vllm serve`` process with the temp directory at ``base`` (made like /tmp): what its
    API-server processes would inherit is undone afterwards."""
    for name in ("SPECSCOPE_SHARE_DIR", SERVER_ENV, "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    base.chmod(0o1777)
    yield base
    os.environ.pop(SERVER_ENV, None)


def test_a_chosen_directory_not_private_to_us_is_refused(base: Path, other: bool) -> None:
    if other and ROOT:
        base.chmod(0o1777)  # like /tmp
        in_child(lambda: (base / "chosen").mkdir(mode=0o700), NOBODY)
        with pytest.raises(PermissionError, match="owned by uid 65534"):
            ProcessShare(Hub(), 0, base / "chosen", 60)
    elif other:  # no second uid to plant with: a directory another uid made that is there anyway
        theirs = next(p for p in (Path(tempfile.gettempdir()), Path("/")) if p.stat().st_uid != os.geteuid())
        with pytest.raises(PermissionError, match=f"owned by uid {theirs.stat().st_uid}"):
            ProcessShare(Hub(), 0, theirs, 60)
    else:
        (base / "open").mkdir()
        (base / "open").chmod(0o777)
        with pytest.raises(PermissionError, match="mode 777"):
            ProcessShare(Hub(), 0, base / "open", 60)
        (base / "private").mkdir(mode=0o700)
        (base / "link").symlink_to(base / "private")
        (base / "file").write_bytes(b"")
        for name in ("link", "file"):
            with pytest.raises(PermissionError, match="not a directory"):
                ProcessShare(Hub(), 0, base / name, 60)


def _api_server(rank: int, accepted: int, results: Any, done: Any) -> None:
    """One API-server process as vLLM starts it (a ``multiprocessing`` spawn child): vLLM loads its general plugins
    (:func:`name_directory`), then the stat logger joins the share."""
    name_directory()
    hub = Hub()
    hub.record_step(StepStats(running=1, generation_tokens=accepted + 1, num_spec_tokens=4, drafts=1,
                              draft_tokens=4, accepted=accepted))
    lead = join(hub, rank, 2)
    assert lead is not None
    deadline = time.monotonic() + 20
    while hub.snapshot().processes < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    snap = hub.snapshot()
    results.put((rank, os.environ[SERVER_ENV], snap.processes, snap.server_processes,
                 snap.lifetime.spec.accepted if snap.lifetime.spec else None, lead("prometheus")))
    done.wait(20)  # the other process may still be reading this one's numbers


def test_names_planted_before_the_server_starts_do_not_stop_its_processes_sharing(server: Path, other: bool) -> None:
    if other:
        needs_second_uid("directories another uid made first under the names the processes could be guessed to use")
    guesses = [server / f"specscope-{os.geteuid()}-{pid}{suffix}" for pid in (os.getpid(), os.getppid())
               for suffix in ("", ".1", ".2", ".3")]  # the names specscope used to derive from public facts

    def attack() -> None:
        for path in guesses:
            if other:
                path.mkdir(mode=0o700)
            elif path.suffix:  # the same names, open to all or pointing elsewhere
                path.mkdir()
                path.chmod(0o777)
            else:
                path.symlink_to("/")

    in_child(attack, NOBODY if other else None)
    name_directory()  # the vllm serve process, before it starts its API-server processes
    named = Path(os.environ[SERVER_ENV])
    assert named.parent == server and named not in guesses and not named.exists()
    spawn = multiprocessing.get_context("spawn")  # as vLLM starts them
    results, done = spawn.Queue(), spawn.Event()
    children = [spawn.Process(target=_api_server, args=(rank, 1 + 2 * rank, results, done)) for rank in (0, 1)]
    for child in children:
        child.start()
    try:
        reports = sorted(results.get(timeout=60) for _ in children)
    finally:
        done.set()
        for child in children:
            child.join(30)
    assert [r[1] for r in reports] == [str(named)] * 2  # both kept the name their parent gave them
    assert [r[2:5] for r in reports] == [(2, 2, 1 + 3)] * 2  # the whole server's numbers from either process
    assert sorted(r[5] for r in reports) == [False, True]  # one of them serves the Prometheus port
    st = os.lstat(named)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700


def test_the_directory_goes_when_the_server_stops_and_a_chosen_one_stays(base: Path) -> None:
    script = ("import os; from specscope.state.hub import Hub; "
              "from specscope.engine.share import ProcessShare, name_directory; "
              "name_directory(); s = ProcessShare(Hub(), 0, interval_s=0.01); s.lead('prometheus'); "
              "import time; time.sleep(0.1); s.close(); print(s.directory)")
    env = {k: v for k, v in os.environ.items() if k not in ("SPECSCOPE_SHARE_DIR", SERVER_ENV, "XDG_RUNTIME_DIR")}
    made = Path(subprocess.run([sys.executable, "-c", script], env={**env, "TMPDIR": str(base)}, check=True,
                               capture_output=True, text=True).stdout.strip())
    assert made.parent == base and not made.exists()
    chosen = base / "chosen"
    subprocess.run([sys.executable, "-c", script], env={**env, "SPECSCOPE_SHARE_DIR": str(chosen)}, check=True,
                   capture_output=True)
    assert (chosen / "0.json").is_file()  # the user's own directory is theirs to remove


def test_a_vllm_child_keeps_the_name_and_a_new_server_makes_its_own(server: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    name_directory()
    first = os.environ[SERVER_ENV]
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # a process vLLM started
    name_directory()
    assert os.environ[SERVER_ENV] == first
    monkeypatch.undo()
    name_directory()  # another vllm serve started from this one's environment
    assert os.environ[SERVER_ENV] != first
    assert Path(os.environ[SERVER_ENV]).name.startswith(f"specscope-{os.geteuid()}-")


def test_the_name_is_under_a_private_xdg_runtime_dir(server: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (server / "run").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(server / "run"))
    name_directory()
    assert Path(os.environ[SERVER_ENV]).parent == server / "run"
    (server / "run").chmod(0o777)  # not a runtime directory to trust
    name_directory()
    assert Path(os.environ[SERVER_ENV]).parent == server


@pytest.mark.parametrize("cause", ["no name", "planted by this uid", "planted by another uid"])
def test_a_process_that_cannot_share_says_it_holds_1_of_n_and_leaves_exports_to_process_0(
        server: Path, cause: str, caplog: pytest.LogCaptureFixture) -> None:
    if cause != "no name":  # the named directory, made first (a leaked name)
        other = cause == "planted by another uid"
        if other:
            needs_second_uid("a named directory another uid made first")
        name_directory()
        named = Path(os.environ[SERVER_ENV])
        in_child(lambda: named.mkdir(mode=0o700) if other else named.symlink_to(server), NOBODY if other else None)
    hubs = [Hub() for _ in range(3)]
    with caplog.at_level(logging.WARNING, "specscope"):
        leads = [join(hub, rank, 3) for rank, hub in enumerate(hubs)]
    for role in ("prometheus", "otlp", "alerts"):
        assert [lead(role) if lead else None for lead in leads] == [True, False, False]
    for hub in hubs:
        snap = hub.snapshot()
        assert (snap.processes, snap.server_processes) == (1, 3) and share_errors(hub) == 1
        assert part_line(snap) == "1 of 3 API-server processes: these numbers are its, not the server's totals"
        assert "partial  1 of 3 API-server processes" in summary(snap)
    assert "this API-server process (index 2 of 3) shares nothing" in caplog.text


def test_a_server_of_one_process_shares_nothing_and_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSCOPE_SHARE_DIR", raising=False)
    hub = Hub()
    assert join(hub, 0, 1) is None
    snap = hub.snapshot()
    assert (snap.processes, snap.server_processes) == (1, 1) and part_line(snap) is None and share_errors(hub) == 0


def test_vllm_loads_the_namer_with_the_stat_logger() -> None:
    """One name in ``VLLM_PLUGINS`` lets vLLM load all: the stat logger in the API-server processes, the namer (and
    the forward timer) in every process (``vllm serve``'s first)."""
    assert declared_entry_points("vllm.general_plugins") == {"specscope": "specscope.engine.plugin:load"}
    assert set(declared_entry_points("vllm.stat_logger_plugins")) == {"specscope"}


def test_writes_never_follow_a_planted_symlink(base: Path, shared: Path, other: bool) -> None:
    victim = base / "victim"
    victim.write_bytes(b"precious")
    plant(shared, lambda: [(shared / name).symlink_to(victim) for name in ("0.json", "0.tmp", ".0.tmp")], other)
    share = ProcessShare(Hub(), 0, shared, 0.02)
    try:
        wait_for(lambda: not (shared / "0.json").is_symlink())
    finally:
        share.close()
    assert victim.read_bytes() == b"precious"
    published = os.lstat(shared / "0.json")
    assert published.st_uid == os.geteuid() and published.st_mode & 0o777 == 0o600


def test_planted_files_are_not_merged_and_are_counted_once(base: Path, shared: Path, other: bool) -> None:
    if other:
        needs_second_uid("snapshots another uid planted in the share directory")
    valid = b"".join(encode(Hub().local_snapshot()))
    (base / "elsewhere.json").write_bytes(valid)  # ours, but outside the directory

    def attack() -> None:
        for name in ("1.json", "evil.json"):
            (shared / name).write_bytes(valid)
            (shared / name).chmod(0o600 if other else 0o644)  # another's, or one that others can write or read
        (shared / "2.json").symlink_to(base / "elsewhere.json")

    plant(shared, attack, other)
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


def test_a_planted_lock_held_by_the_attacker_is_not_honoured(base: Path, shared: Path, other: bool) -> None:
    if other:
        needs_second_uid("lock files another uid planted and holds")
    victim = base / "victim"
    victim.write_bytes(b"precious")
    held: list[int] = []

    def attack() -> None:
        fd = os.open(shared / "prometheus.lock", os.O_RDWR | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600 if other else 0o666)  # another's, or one that anyone may open
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)  # kept open while the child lives
        (shared / "alerts.lock").symlink_to(victim)

    release = plant(shared, attack, other, hold=True)
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


class Wall:
    """The wall clock, which the test steps: the hubs' clock and ``time.time``."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def record_steps(hub: Hub, engine: int) -> None:
    """Three steps of ``engine`` (each process's own engine index, so that the merge shows whose numbers are whose)."""
    for _ in range(3):
        hub.record_step(StepStats(running=1, generation_tokens=2, num_spec_tokens=4, drafts=1, draft_tokens=4,
                                  accepted=1), engine_index=engine)


def engine(snap: Any, index: int) -> Any:
    return next(e for e in snap.engines if e.index == index)


def publish_as(shared: Path, rank: int, wall: Wall | None = None) -> Callable[[], None]:
    """A process that publishes its snapshot (three steps of engine ``rank``) once; returns its
    :func:`in_child` release, which ends it."""

    def act() -> None:
        hub = Hub(clock=wall) if wall is not None else Hub()
        record_steps(hub, rank)
        ProcessShare(hub, rank, shared, 60).exchange()

    return in_child(act, hold=True)


def test_a_clock_step_neither_brings_back_a_dead_process_nor_drops_a_live_one(
        shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: a 40 s backward step of the wall clock brought a dead process's window back into the merge; a 31 s
    forward step dropped a live one's. Liveness is the peer's pid and the reader's monotonic clock: neither moves."""
    wall = Wall()
    monkeypatch.setattr(time, "time", wall)
    publish_as(shared, 2, wall)()  # it published, then it was killed
    reader, live = Hub(clock=wall), Hub(clock=wall)
    record_steps(live, 1)
    wall.t += 35  # the dead process's snapshot is 35 s old
    share_r, share_l = ProcessShare(reader, 0, shared, 60), ProcessShare(live, 1, shared, 60)
    reader.attach_share(share_r)
    try:
        def merged(step: float, publish: bool = True) -> tuple[int, int, bool]:
            """After a clock step: the dead process's engine's window and lifetime steps, and whether the live
            one's engine is live (its gauges kept, not aged)."""
            if publish:
                share_l.exchange()
            wall.t += step
            share_r.exchange()
            snap = reader.snapshot()
            return engine(snap, 2).window.steps, engine(snap, 2).lifetime.steps, engine(snap, 1).updated_at > 0

        assert merged(0) == (0, 3, True)
        assert merged(-40) == (0, 3, True)  # the dead one's file is "5 s old" now: still dead
        merged(40)
        assert merged(31, publish=False) == (0, 3, True)  # the live one's file is "31 s old": still live
    finally:
        share_r.close()
        share_l.close()


def test_a_killed_process_leaves_the_window_at_once_and_keeps_its_lifetime(shared: Path) -> None:
    release = publish_as(shared, 1)
    reader = Hub()
    share = ProcessShare(reader, 0, shared, 60)
    reader.attach_share(share)
    try:
        share.exchange()
        assert engine(reader.snapshot(), 1).window.steps == 3
        release()  # killed: no further read of the file is needed to know
        gone = engine(reader.snapshot(), 1)
        assert gone.window.steps == 0 and gone.lifetime.steps == 3 and gone.updated_at == 0.0
    finally:
        share.close()


def test_a_peer_silent_past_the_limit_is_gone_until_it_publishes_again(
        shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer whose pid lives on (hung, or a pid reused) but that has not been seen to publish for STALE_S of the
    reader's monotonic time is gone; a fresh write brings it back."""
    from specscope.engine import share as share_module

    now = [1000.0]
    monkeypatch.setattr(share_module, "monotonic", lambda: now[0])
    reader, peer = Hub(), Hub()
    record_steps(peer, 1)
    share_r, share_p = ProcessShare(reader, 0, shared, 60), ProcessShare(peer, 1, shared, 60)
    reader.attach_share(share_r)
    try:
        share_p.exchange()
        share_r.exchange()
        now[0] += share_module.STALE_S
        assert engine(reader.snapshot(), 1).window.steps == 3
        now[0] += 1
        share_r.exchange()  # the same file, unchanged: not a sign of life
        assert engine(reader.snapshot(), 1).window.steps == 0
        share_p.exchange()
        share_r.exchange()
        assert engine(reader.snapshot(), 1).window.steps == 3
    finally:
        share_r.close()
        share_p.close()
