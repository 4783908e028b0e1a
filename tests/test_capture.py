"""Capture of traffic as training data (:mod:`specscope.capture`): settings, privacy, choice of rows, the rows
themselves, the size cap, a failing disk, and what the snapshot says (counts, never text)."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specscope import codec
from specscope.capture import Capture, CaptureConfig, CaptureError, Payload, chat_messages, refusal, row
from specscope.hub import Hub
from specscope.model import RequestRecord
from specscope.summary import capture_line, summary

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
    from specscope.collectors import vllm_hook
    from specscope.collectors.vllm_logger import start_capture

    config = SimpleNamespace(model_config=SimpleNamespace(model="m", served_model_name="m"),
                             speculative_config=SimpleNamespace(rejection_sample_method="synthetic",
                                                                method="draft_model", num_speculative_tokens=4))
    monkeypatch.setattr(vllm_hook, "_installed", True)
    hub = Hub()
    cap = start_capture(hub, CaptureConfig(tmp_path, ("code",)), config)
    assert hub.capture is cap and "rejection_sample_method=synthetic" in (capture_line(hub.snapshot()) or "")
    monkeypatch.setattr(vllm_hook, "_installed", False)
    config.speculative_config.rejection_sample_method = "standard"
    start_capture(hub, CaptureConfig(tmp_path, ("code",)), config)
    assert "not hooked" in (hub.snapshot().capture.stopped or "")  # type: ignore[union-attr]


def test_the_serve_plugin_says_a_bad_setting_in_one_line_and_serves_on(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from specscope.collectors import vllm_logger

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
        vllm_logger._capture_once(hub, SimpleNamespace())  # raises nothing into vLLM
        assert hub.capture is None and hub.snapshot().health.error_count == 1
        lines = [r.getMessage() for r in caplog.records if "capture" in r.getMessage()]
        assert len(lines) == 1 and why in lines[0] and "\n" not in lines[0], lines
        monkeypatch.delenv("SPECSCOPE_CAPTURE_CLASSES", raising=False)
