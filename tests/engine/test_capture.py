"""Capture of traffic as training data (:mod:`specscope.engine.capture`): settings, privacy, choice of rows (the
operator's
classes, never a client's claim unless named so), the rows themselves, the size cap (one for a server's processes),
what is held in memory, a failing disk (whole lines only, said without a path), and what the snapshot says (counts,
never text)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specscope.core import codec
from specscope.core.model import RequestRecord
from specscope.engine.capture import (
    Capture,
    CaptureConfig,
    CaptureError,
    Payload,
    attached,
    chat_messages,
    refusal,
    row,
)
from specscope.export.summary import capture_line, summary
from specscope.state.hub import Hub

SECRET = "the completion nobody else may read"


class Tokenizer:
    """Decodes ids as words ``t<id>`` (the rows' text where vLLM kept none)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"t{i}" for i in ids)


def finish(hub: Hub, cap: Capture, rid: str, cls: str | None, accepted: int, steps: int = 50, k: int = 4,
           text: str | None = SECRET, messages: Any = None, prompt: tuple[int, ...] = (1, 2, 3)) -> None:
    """A finished request of class ``cls`` as the stat logger hands it over: its payload, then its record."""
    cap.hold(rid, Payload("a prompt", list(prompt), [7, 8, 9, 10], text, messages, Tokenizer()))
    hub.requests.record(rid, traffic_class=cls, prompt_tokens=len(prompt), generation_tokens=4, spec_steps=steps,
                        draft_tokens=k * steps, accepted_tokens=accepted, finish_reason="length")


def rows(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(directory.glob("capture-*.jsonl")) for line in f.read_text().splitlines()]


def done(hub: Hub, cap: Capture) -> None:
    assert hub.requests.wait_idle(5)
    cap.close()


def test_settings_from_the_environment_and_bad_ones_in_one_line(tmp_path: Path) -> None:
    assert CaptureConfig.from_env({}) is None
    c = CaptureConfig.from_env({"SPECSCOPE_CAPTURE_DIR": str(tmp_path), "SPECSCOPE_CAPTURE_CLASSES": "weak, code",
                                "SPECSCOPE_CAPTURE_RATE": "0.25", "SPECSCOPE_CAPTURE_MAX_BYTES": "512M"})
    assert c == CaptureConfig(tmp_path, ("weak", "code"), 0.25, 512 << 20)
    assert CaptureConfig.of(str(tmp_path)).classes == ("weak",)
    assert CaptureConfig.of({"directory": tmp_path, "classes": "code", "max_bytes": "1g"}).max_bytes == 1 << 30
    bad = {"SPECSCOPE_CAPTURE_RATE": "lots", "SPECSCOPE_CAPTURE_CLASSES": "two words",
           "SPECSCOPE_CAPTURE_MAX_BYTES": "12 parsecs"}
    for key, value in bad.items():
        with pytest.raises(CaptureError) as info:
            CaptureConfig.from_env({"SPECSCOPE_CAPTURE_DIR": str(tmp_path), key: value})
        assert "\n" not in str(info.value) and str(info.value)
    for kwargs in ({"rate": 0}, {"rate": 1.5}, {"max_bytes": 100}, {"classes": ()}):
        with pytest.raises(CaptureError):
            CaptureConfig(tmp_path, **kwargs)
    with pytest.raises(CaptureError, match="unknown: 'path'"):
        CaptureConfig.of({"directory": tmp_path, "path": "x"})


def test_the_directory_is_private_and_one_others_can_enter_or_a_link_is_refused(tmp_path: Path) -> None:
    made = CaptureConfig(tmp_path / "new" / "capture").checked().directory
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(CaptureError, match="lets others in"):
        CaptureConfig(open_dir).checked()
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(CaptureError, match="not a directory"):
        CaptureConfig(tmp_path / "link").checked()
    with pytest.raises(CaptureError, match="capture directory"):
        CaptureConfig(Path("/proc/1/no/such")).checked()


def test_named_classes_are_written_as_rows_speculators_reads_and_others_are_not(tmp_path: Path) -> None:
    hub = Hub()
    cap = Capture(CaptureConfig(tmp_path, ("code",)), hub, "target-model")
    finish(hub, cap, "a", "code", accepted=100)
    finish(hub, cap, "b", "chat", accepted=100)
    finish(hub, cap, "c", "code", accepted=10, text=None, messages=b'{"messages": [{"role": "developer", '
           b'"content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}')
    done(hub, cap)
    out = rows(tmp_path)
    assert [r["class"] for r in out] == ["code", "code"]
    first, second = out
    assert first["input_ids"] == [1, 2, 3, 7, 8, 9, 10] and first["loss_mask"] == [0, 0, 0, 1, 1, 1, 1]
    assert first["conversations"] == [{"from": "user", "value": "a prompt"}, {"from": "assistant", "value": SECRET}]
    assert first["acceptance"] == pytest.approx(0.5) and first["model"] == "target-model"
    assert first["finish_reason"] == "length"
    # a served chat request's body, read on the writer's thread; the text decoded where vLLM kept none
    assert second["conversations"] == [{"from": "system", "value": "be brief"}, {"from": "user", "value": "hi"},
                                       {"from": "assistant", "value": "t7 t8 t9 t10"}]
    for f in tmp_path.glob("capture-*.jsonl"):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    status = hub.snapshot().capture
    assert status is not None and status.rows == 2 and status.bytes == sum(
        f.stat().st_size for f in tmp_path.glob("capture-*.jsonl"))


def test_weak_captures_the_classes_under_the_weak_draft_line(tmp_path: Path) -> None:
    hub = Hub()
    cap = Capture(CaptureConfig(tmp_path), hub)
    finish(hub, cap, "warm-hard", "hard", accepted=20)  # 200 drafted, 10% accepted: under the line
    finish(hub, cap, "warm-easy", "easy", accepted=160)
    assert hub.requests.wait_idle(5)
    cap._weak_at = float("-inf")  # read the window again now, not in 5 s
    for i in range(3):
        finish(hub, cap, f"hard-{i}", "hard", accepted=20)
        finish(hub, cap, f"easy-{i}", "easy", accepted=160)
    done(hub, cap)
    out = rows(tmp_path)
    assert {r["class"] for r in out} == {"hard"} and len(out) >= 3
    snap = hub.snapshot()
    assert snap.capture is not None and snap.capture.weak_now == ("hard",)
    assert capture_line(snap) == f"capture on: classes weak (now hard); {len(out)} rows, 0.0 MB kept"


def test_the_rate_keeps_about_its_share(tmp_path: Path) -> None:
    hub = Hub(max_requests=2000)
    cap = Capture(CaptureConfig(tmp_path, ("code",), rate=0.25), hub)
    for i in range(400):
        finish(hub, cap, f"r{i}", "code", accepted=100)
    done(hub, cap)
    assert 60 <= len(rows(tmp_path)) <= 140


def test_past_the_cap_the_oldest_file_goes_and_its_rows_are_counted(tmp_path: Path) -> None:
    hub = Hub(max_requests=2000)
    cap = Capture(CaptureConfig(tmp_path, ("code",), max_bytes=64 << 10), hub)
    for i in range(300):  # ~500 bytes a row: 150 KB offered against a 64 KB cap
        finish(hub, cap, f"r{i}", "code", accepted=100, prompt=tuple(range(40)))
    done(hub, cap)
    files = sorted(tmp_path.glob("capture-*.jsonl"))
    kept = rows(tmp_path)
    status = hub.snapshot().capture
    assert status is not None and len(files) == 4 and sum(f.stat().st_size for f in files) <= 64 << 10
    assert status.rows == len(kept) and status.dropped_at_cap == 300 - len(kept) > 0
    assert kept[-1]["input_ids"][:2] == [0, 1]  # the newest rows are the ones kept
    assert "dropped " in (capture_line(hub.snapshot()) or "") and "at the size cap" in summary(hub.snapshot())


def test_a_full_disk_stops_the_capture_says_why_and_raises_nothing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    hub = Hub()
    cap = Capture(CaptureConfig(tmp_path, ("code",)), hub)
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if data.endswith(b"\n") and b"input_ids" in data:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    finish(hub, cap, "a", "code", accepted=100)
    finish(hub, cap, "b", "code", accepted=100)
    done(hub, cap)
    snap = hub.snapshot()
    assert snap.capture is not None and snap.capture.rows == 0 and "No space left" in (snap.capture.stopped or "")
    assert snap.health.error_count == 1 and (capture_line(snap) or "").startswith("capture stopped: writing failed")


def test_nothing_captured_reaches_the_snapshot_or_its_json(tmp_path: Path) -> None:
    hub = Hub()
    cap = Capture(CaptureConfig(tmp_path, ("code",)), hub)
    finish(hub, cap, "a", "code", accepted=100, messages=(("user", "my password is hunter2"),))
    done(hub, cap)
    assert "hunter2" in (tmp_path / next(os.walk(tmp_path))[2][0]).read_text()
    doc = json.dumps(codec.to_dict(hub.snapshot()))
    assert "hunter2" not in doc and SECRET not in doc and str(tmp_path) not in doc
    assert codec.from_dict(json.loads(doc)).capture == hub.snapshot().capture


def test_lossy_verification_is_refused_in_one_line(tmp_path: Path) -> None:
    assert refusal(None) is None and refusal(SimpleNamespace(rejection_sample_method="standard")) is None
    assert refusal(SimpleNamespace(rejection_sample_method="block")) is None
    why = refusal(SimpleNamespace(rejection_sample_method="synthetic"))
    assert why is not None and "not the target's" in why
    hub = Hub()
    cap = Capture(CaptureConfig(tmp_path, ("code",)), hub, stopped=why)
    finish(hub, cap, "a", "code", accepted=100)
    done(hub, cap)
    assert rows(tmp_path) == [] and capture_line(hub.snapshot()) == f"capture stopped: {why}"


def test_chat_messages_are_read_from_lists_and_request_bodies() -> None:
    assert chat_messages([{"role": "user", "content": "hi"}]) == (("user", "hi"),)
    assert chat_messages(b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, '
                         b'{"type": "image_url"}, {"type": "text", "text": "b"}]}]}') == (("user", "ab"),)
    for bad in (b"not json", b'{"prompt": "x"}', [{"role": "user"}], [{"content": "x"}], [], None):
        assert chat_messages(bad) is None, bad


def test_a_row_without_text_or_prompt_decodes_the_tokens() -> None:
    rec = RequestRecord("r", 1, 0.0, accepted_tokens=1, draft_tokens=4)
    out = row(rec, "c", Payload(None, [5], [6], None, None, Tokenizer()))
    assert out["conversations"] == [{"from": "user", "value": "t5"}, {"from": "assistant", "value": "t6"}]
    assert out["acceptance"] == 0.25


def test_an_engine_under_lossy_verification_or_without_the_hook_captures_nothing_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specscope.engine import vllm_hook
    from specscope.engine.door import start_capture

    config = SimpleNamespace(model_config=SimpleNamespace(model="m", served_model_name="m"),
                             speculative_config=SimpleNamespace(rejection_sample_method="synthetic",
                                                                method="draft_model", num_speculative_tokens=4))
    monkeypatch.setattr(vllm_hook, "_installed", True)
    hub = Hub()
    cap = start_capture(hub, CaptureConfig(tmp_path, ("code",)), config)
    assert attached(hub) is cap and "rejection_sample_method=synthetic" in (capture_line(hub.snapshot()) or "")
    monkeypatch.setattr(vllm_hook, "_installed", False)
    config.speculative_config.rejection_sample_method = "standard"
    start_capture(hub, CaptureConfig(tmp_path, ("code",)), config)
    assert "not hooked" in (hub.snapshot().capture.stopped or "")  # type: ignore[union-attr]


def test_the_serve_plugin_says_a_bad_setting_in_one_line_and_serves_on(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from specscope.engine import door

    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    for env, why in (({"SPECSCOPE_CAPTURE_DIR": str(open_dir)}, "lets others in"),
                     ({"SPECSCOPE_CAPTURE_DIR": str(tmp_path / "c"), "SPECSCOPE_CAPTURE_CLASSES": "no such"},
                      "is not a class name")):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        hub = Hub()
        caplog.clear()
        door._capture_once(hub, SimpleNamespace())  # raises nothing into vLLM
        assert attached(hub) is None and hub.snapshot().health.error_count == 1
        lines = [r.getMessage() for r in caplog.records if "capture" in r.getMessage()]
        assert len(lines) == 1 and why in lines[0] and "\n" not in lines[0], lines
        # What reaches the snapshot (and the share files, top) says what is wrong, never where capture writes.
        last = hub.snapshot().health.last_error or ""
        assert why in last and str(tmp_path) not in last, last
        monkeypatch.delenv("SPECSCOPE_CAPTURE_CLASSES", raising=False)


def lines(directory: Path) -> list[bytes]:
    """Every line of the capture files, each checked to be a whole JSON row."""
    out = [line for f in sorted(directory.glob("capture-*.jsonl")) for line in f.read_bytes().split(b"\n")[:-1]]
    for f in directory.glob("capture-*.jsonl"):
        assert f.read_bytes()[-1:] in (b"", b"\n"), f"{f.name} ends in a torn line"
    for line in out:
        json.loads(line)
    return out


def accounted(cap: Capture) -> int:
    """The rows a capture wrote or counted as dropped."""
    status = cap.status()
    return status.rows + status.dropped_at_cap + status.dropped_behind


def test_what_is_held_for_records_is_bounded_and_what_is_pushed_out_is_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specscope.engine import capture

    monkeypatch.setattr(capture, "MAX_HELD_BYTES", 64 << 10)
    hub = Hub(max_requests=2000)
    cap = Capture(CaptureConfig(tmp_path / "bytes", ("code",)), hub)
    body = b'{"messages": [{"role": "user", "content": "' + b"y" * 4000 + b'"}]}'
    for i in range(100):  # finished, their records not in yet: 400 KB against 64 KiB
        cap.hold(f"r{i}", Payload("p", [1, 2, 3], [7, 8], "out", body, None))
    assert 0 < len(cap._held) < 20 and cap._held_bytes <= 64 << 10
    assert cap._held_bytes == sum(capture.held_size(p) for p, _ in cap._held.values())
    for i in range(100):
        hub.requests.record(f"r{i}", traffic_class="code" if i % 2 else "chat", prompt_tokens=3,
                            generation_tokens=2, finish_reason="length")
    done(hub, cap)
    status = cap.status()
    kept = len(rows(tmp_path / "bytes"))
    assert 0 < kept == status.rows and kept + status.dropped_behind == 50  # each chosen one: written or counted
    cap.hold("late", Payload("p", [1], [2], "out", body, None))
    assert not cap._held and cap._held_bytes == 0  # closed: nothing held

    monkeypatch.setattr(capture, "MAX_HELD", 20)
    cap = Capture(CaptureConfig(tmp_path / "count", ("code",)), hub)
    for i in range(60):  # records that never come
        cap.hold(f"n{i}", Payload("p", [1], [2], "out", None, None))
    assert len(cap._held) == len(cap._gone) == 20 and cap.status().dropped_behind == 20
    cap.close()


def test_a_row_that_cannot_be_made_is_counted_and_capture_goes_on(tmp_path: Path) -> None:
    hub = Hub()
    cap = Capture(CaptureConfig(tmp_path, ("code",)), hub)
    finish(hub, cap, "a", "code", accepted=100)
    finish(hub, cap, "bad", "code", accepted=100, text="\ud800 a lone surrogate: no UTF-8 for it")
    finish(hub, cap, "c", "code", accepted=100)
    done(hub, cap)
    status = cap.status()
    assert len(lines(tmp_path)) == status.rows == 2 and status.dropped_behind == 1 and status.stopped is None
    health = hub.snapshot().health
    assert dict(health.errors) == {"capture row": 1} and "UnicodeEncodeError" in (health.last_error or "")


def test_a_short_or_failed_write_leaves_whole_lines_and_writing_resumes(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from specscope.engine import capture

    monkeypatch.setattr(capture, "RETRY_S", 0.0)  # try again with the next row
    hub = Hub(max_requests=2000)
    cap = Capture(CaptureConfig(tmp_path, ("code",), max_bytes=64 << 10), hub)
    real_write, calls = os.write, [0]

    def flaky(fd: int, data: bytes) -> int:
        if b"input_ids" not in data:
            return real_write(fd, data)
        calls[0] += 1
        if calls[0] % 5 == 0:  # the disk takes half the line
            return real_write(fd, data[:len(data) // 2])
        if calls[0] % 7 == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", flaky)
    for i in range(120):
        finish(hub, cap, f"r{i}", "code", accepted=100, prompt=tuple(range(40)))
    assert hub.requests.wait_idle(5)
    deadline = time.monotonic() + 10
    while accounted(cap) < 120 and time.monotonic() < deadline:  # the writer is through them
        time.sleep(0.01)
    monkeypatch.setattr(os, "write", real_write)  # space again
    finish(hub, cap, "last", "code", accepted=100, prompt=tuple(range(40)))
    done(hub, cap)
    status = cap.status()
    on_disk = lines(tmp_path)
    assert len(on_disk) == status.rows and status.bytes == sum(len(x) + 1 for x in on_disk)
    assert accounted(cap) == 121 and status.dropped_behind >= 20
    assert status.stopped is None  # the last write went through: capture writes again
    assert dict(hub.snapshot().health.errors)["capture"] >= 1


def test_a_failure_never_says_where_capture_writes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    secret = tmp_path / "where-nobody-may-know-7f3a"
    hub = Hub()
    cap = Capture(CaptureConfig(secret, ("code",), max_bytes=64 << 10), hub)
    finish(hub, cap, "a", "code", accepted=100)
    assert hub.requests.wait_idle(5)
    shutil.rmtree(secret)  # the directory taken away
    for i in range(100):  # the next file cannot be begun
        finish(hub, cap, f"r{i}", "code", accepted=100, prompt=tuple(range(40)))
    done(hub, cap)
    snap = hub.snapshot()
    said = [snap.capture.stopped if snap.capture else None, snap.health.last_error, caplog.text,
            json.dumps(codec.to_dict(snap)), summary(snap), capture_line(snap)]
    assert not [s for s in said if s and (secret.name in s or str(tmp_path) in s)], said
    assert snap.capture is not None and "ENOENT (No such file or directory)" in (snap.capture.stopped or "")


def test_a_class_the_client_claims_is_captured_only_where_the_operator_names_it_so(tmp_path: Path) -> None:
    assert CaptureConfig(tmp_path, ("baggage:code", "weak")).classes == ("baggage:code", "weak")
    with pytest.raises(CaptureError, match="baggage"):
        CaptureConfig(tmp_path, ("baggage:prompt:<256",))  # a name no client can claim
    requests = ("code", "baggage:code", "hard", "baggage:hard")  # the operator's label, or the client's claim
    for selectors, written in ((("code",), {"code"}), (("baggage:code",), {"baggage:code"}), (("weak",), {"hard"}),
                               (("weak", "baggage:hard"), {"hard", "baggage:hard"})):
        directory = tmp_path / "-".join(selectors)
        hub = Hub()
        cap = Capture(CaptureConfig(directory, selectors), hub)
        hub.requests.record("warm", traffic_class="hard", prompt_tokens=1, spec_steps=50, draft_tokens=200,
                            accepted_tokens=20)  # the window: "hard" under the weak-draft line
        assert hub.requests.wait_idle(5)
        cap._weak_at = float("-inf")
        for i, rid in enumerate(requests):
            client = rid.startswith("baggage:")
            cap.hold(rid, Payload("p", [i], [9], "out", None, None, client))
            hub.requests.record(rid, traffic_class=rid.removeprefix("baggage:"), prompt_tokens=1, spec_steps=50,
                                draft_tokens=200, accepted_tokens=20 if rid.endswith("hard") else 180)
        done(hub, cap)
        assert {requests[r["input_ids"][0]] for r in rows(directory)} == written, selectors


def on_disk(directory: Path) -> int:
    """The bytes of the capture files there now (one removed while they are summed counts none)."""
    total = 0
    for f in directory.glob("capture-*.jsonl"):
        with contextlib.suppress(FileNotFoundError):
            total += f.stat().st_size
    return total


def test_the_server_s_processes_keep_to_one_budget_in_one_directory(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from specscope.engine import capture

    monkeypatch.setattr(capture, "RECOUNT_S", 0.05)
    cap_bytes = 64 << 10
    hubs = [Hub(max_requests=2000), Hub(max_requests=2000)]
    caps = []
    for pid, hub in enumerate(hubs, 1000):  # two API-server processes of one server
        hub.set_server_processes(2)
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        caps.append(Capture(CaptureConfig(tmp_path, ("code",), max_bytes=cap_bytes), hub))
    for i in range(600):  # ~500 bytes a row: 300 KB offered against 64 KB
        finish(hubs[i % 2], caps[i % 2], f"r{i}", "code", accepted=100, prompt=tuple(range(40)))
        if i % 20 == 0:
            assert on_disk(tmp_path) <= cap_bytes
    deadline = time.monotonic() + 10
    while any(accounted(cap) < 300 for cap in caps) and time.monotonic() < deadline:  # both writers through
        time.sleep(0.01)
    while sum(cap.status().rows for cap in caps) != len(lines(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.01)  # idle, each finds its files the other removed
    assert sum(cap.status().rows for cap in caps) == len(lines(tmp_path))
    for hub, cap in zip(hubs, caps, strict=True):
        done(hub, cap)
    assert on_disk(tmp_path) <= cap_bytes
    statuses = [cap.status() for cap in caps]
    assert sum(s.rows for s in statuses) == len(lines(tmp_path)) > 0  # each counts its own rows still there
    assert sum(s.rows + s.dropped_at_cap for s in statuses) == 600 and all(s.dropped_at_cap for s in statuses)


def test_weak_is_chosen_from_the_whole_server_s_window(tmp_path: Path) -> None:
    other, hub = Hub(), Hub()
    for i in range(3):  # another API-server process served most of class "hard", under the weak-draft line
        other.requests.record(f"o{i}", traffic_class="hard", prompt_tokens=3, spec_steps=50, draft_tokens=200,
                              accepted_tokens=20)
    assert other.wait_idle(5)
    hub.attach_share(SimpleNamespace(others=lambda: [other.local_snapshot(forwards_alone=True)]))
    cap = Capture(CaptureConfig(tmp_path), hub)
    finish(hub, cap, "mine", "hard", accepted=2, steps=10)  # this process's own share: too little to judge
    done(hub, cap)
    assert [r["class"] for r in rows(tmp_path)] == ["hard"]
    assert hub.snapshot().capture.weak_now == ("hard",)  # type: ignore[union-attr]
