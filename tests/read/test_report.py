"""`specscope report` and the command-line use of baselines, on recordings made from real hubs (no engine)."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from specscope.core.model import CostRatio, EngineInfo, EngineSetup, StepProfile, StepTime
from specscope.read.tui.record import Recorder
from specscope.state.hub import Hub, StepStats
from specscope.verdict import save_profile
from tests.conftest import free_port
from tests.test_cli import specscope

SETUP = EngineSetup(model="/m/deep01-target", architecture="LlamaForCausalLM layers=12 hidden=512", dtype="float32",
                    device="cpu", engine_version="0.32.0", max_num_seqs=16)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def recorded_engine(path: Path, weak: bool = False) -> None:
    """A minute of a speculative engine at batch 1 then 8, recorded every second as `specscope top --record` does."""
    clock = Clock()
    hub = Hub(clock=clock, window_s=60)
    hub.set_engine(EngineInfo(model="/m/deep01-target", draft_model="/m/deep01-draft", method="draft_model",
                              num_speculative_tokens=4, setup=SETUP))
    hub.set_cost_ratio(CostRatio(0.13, "estimated from parameters per token", 40_000_000, 5_000_000))
    rec = Recorder(path)
    accepted = [1, 0, 0, 0] if weak else [3, 4, 2, 4]
    step = {1: 0.03 if weak else 0.02, 8: 0.056}  # a speculative step's time by batch size
    for second in range(60):
        batch = 1 if second < 30 else 8
        clock.t += 0.5
        hub.record_step(StepStats(running=batch, waiting=0, prompt_tokens=20 * batch, generation_tokens=batch,
                                  batch=batch, prefill=True, first_tokens=batch, first_token_s=0.02 * batch))
        for i in range(20):
            clock.t += step[batch]
            a = accepted[i % 4]
            hub.record_step(StepStats(running=batch, waiting=0, generation_tokens=batch * (a + 1), batch=batch,
                                      decode_s=step[batch], num_spec_tokens=4, drafts=batch,
                                      draft_tokens=4 * batch, accepted=a * batch,
                                      accepted_per_pos=[batch if j < a else 0 for j in range(4)],
                                      draft_tokens_per_pos=[batch] * 4, rejections=batch if a < 4 else 0))
        hub.record_step(StepStats(running=0, waiting=0, finished=batch, batch=batch))
        hub.requests.record_positions([accepted[j % 4] for j in range(20)], [4] * 20)
        rec.write("deep01", hub.snapshot())
    rec.close()


def baseline(tmp_path: Path, setup: EngineSetup = SETUP) -> Path:
    path = tmp_path / "base.json"
    save_profile(StepProfile((StepTime(1, 50, 0.011), StepTime(8, 50, 0.016)), "calibrated", setup), path)
    return path


def pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_report_from_a_recording_has_every_plot_and_the_k_table(tmp_path: Path) -> None:
    rec = tmp_path / "run.jsonl"
    recorded_engine(rec)
    out = tmp_path / "report.html"
    r = specscope("report", str(rec), "-o", str(out), "--baseline", str(baseline(tmp_path)), "--figures",
                  str(tmp_path / "figs"))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    images = pngs(page)
    assert len(images) == 4 and all(p.startswith(b"\x89PNG") for p in images)
    assert "<script" not in page and 'src="http' not in page and "<link" not in page  # nothing is fetched
    for title in ("Acceptance over time", "Acceptance by draft position", "Acceptance by output position",
                  "Expected speedup by K"):
        assert f'alt="{title}"' in page
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == [
        "deep01-acceptance.png", "deep01-output.png", "deep01-positions.png", "deep01-speedup.png"]
    assert "K table" in page and "num_speculative_tokens_per_batch_size" in page
    assert "measured at batch 8" in page  # the baseline made c measured


def test_report_says_what_it_cannot_draw(tmp_path: Path) -> None:
    rec = tmp_path / "run.jsonl"
    recorded_engine(rec)
    out = tmp_path / "report.html"
    assert specscope("report", str(rec), "-o", str(out)).returncode == 0
    page = out.read_text()
    assert "K table: needs a baseline" in page  # no baseline: no measured K table, said in words
    assert len(pngs(page)) == 4


def test_report_from_the_truth_benchmark(tmp_path: Path) -> None:
    doc = {"benchmark": "truth", "workload": "w", "goal": "g",
           "summary": {"cells": 2, "cells_within_10pct": 2, "max_abs_error": 0.04, "verdict_cells": 2,
                       "verdicts_right": 2, "recommended_k": [
                           {"pair": "deep01", "batch": 1, "recommended": 4, "best_measured": 4,
                            "throughput_vs_best": 1.0}]},
           "pairs": {"deep01": {"target": "deep01-target", "draft": "deep01-draft", "cells": {
               "2": {"1": {"measured": 1.7, "predicted": 1.75}, "16": {"measured": 1.1, "predicted": 1.08}},
               "4": {"1": {"measured": 1.9, "predicted": 1.85}, "16": {"measured": 1.05, "predicted": 1.1}}}}}}
    src = tmp_path / "truth.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "truth.html"
    r = specscope("report", str(src), "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert len(pngs(page)) == 1 and "+3%" in page and "-3%" in page and "Recommended K" in page


def test_bad_input_is_one_line_and_exit_2_and_a_down_endpoint_exit_1(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello\nworld\n")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    rec = tmp_path / "run.jsonl"
    recorded_engine(rec)
    for args, words in (
        ([str(tmp_path / "missing.jsonl")], "cannot read"),
        ([str(garbage)], "not a specscope recording"),
        ([str(binary)], "not a specscope recording"),
        ([str(rec), "--baseline", str(tmp_path / "none.json")], "cannot read baseline"),
        ([str(rec), "--duration", "-1"], "--duration"),
        ([str(rec), "-o", str(tmp_path / "no" / "such" / "dir.html")], "cannot write"),
    ):
        r = specscope("report", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr and "Traceback" not in r.stderr
    r = specscope("report", f"http://127.0.0.1:{free_port()}", "--duration", "0")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_baseline_of_another_setup_is_refused_on_the_command_line(tmp_path: Path) -> None:
    rec = tmp_path / "run.jsonl"
    recorded_engine(rec)
    other = baseline(tmp_path, dataclasses.replace(SETUP, dtype="bfloat16"))
    for args in (["report", str(rec), "-o", str(tmp_path / "r.html"), "--baseline", str(other)],
                 ["top", "--replay", str(rec), "--once", "--baseline", str(other)]):
        r = specscope(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "baseline refused" in r.stderr and "dtype bfloat16 vs float32" in r.stderr
    # The right one is used: `top --once` prints the K table and vLLM's schedule.
    r = specscope("top", "--replay", str(rec), "--once", "--baseline", str(baseline(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert "best K" in r.stdout and "num_speculative_tokens_per_batch_size" in r.stdout


def test_report_polls_a_live_endpoint(tmp_path: Path) -> None:
    rec = tmp_path / "run.jsonl"
    recorded_engine(rec, weak=True)
    lines = rec.read_text().splitlines()
    served = iter(json.loads(line)["snapshot"] for line in lines[-5:])
    last: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server calls do_<METHOD>
            nonlocal last
            last = next(served, last)
            body = json.dumps(last).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        out = tmp_path / "live.html"
        r = specscope("report", f"http://127.0.0.1:{server.server_address[1]}", "-o", str(out), "--duration", "2",
                      "--interval", "0.5")
        assert r.returncode == 0, r.stderr
        page = out.read_text()
        assert 'alt="Acceptance over time"' in page
        assert "acceptance 6.2%" in page  # the weak draft accepts 1 of 16 draft tokens
    finally:
        server.shutdown()


@pytest.mark.parametrize("weak", [False, True])
def test_report_verdict_matches_the_estimate(tmp_path: Path, weak: bool) -> None:
    from specscope.read.report import load

    rec = tmp_path / "run.jsonl"
    recorded_engine(rec, weak=weak)
    rep = load(str(rec), baseline=StepProfile((StepTime(1, 50, 0.011), StepTime(8, 50, 0.016)), "b", SETUP))
    from specscope.verdict import by_batch_size

    verdicts = by_batch_size(rep.engines[0].snapshot)
    assert [e.batch_size for e in verdicts] == [1, 8]
    if weak:  # one token in four accepted at position 0 only; K=1 gains 1.25 tokens for 1.4 steps' cost
        assert all(e.best_k == 0 and not e.pays for e in verdicts)
    else:
        assert verdicts[0].pays and verdicts[0].best_k > 0


def test_report_shows_acceptance_by_traffic_class_worst_first() -> None:
    from specscope.read.report import EngineReport, Report, render
    from tests.core.test_classes import record
    from tests.read.tui.helpers import feed
    from tests.read.tui.test_app import class_hub

    hub = class_hub()
    hub.set_cost_ratio(CostRatio(0.13, "estimated from parameters per token", 40_000_000, 5_000_000))
    page, figures = render(Report("classes", "hub", [EngineReport("engine", hub.snapshot())]))
    section = page.split("<h3>Acceptance by traffic class</h3>", 1)[1].split("<h3>", 1)[0]
    assert section.startswith('<img alt="Acceptance by traffic class"') and "engine-classes" in figures
    assert section.index("<td>code</td>") < section.index("<td>prompt:&lt;256</td>") < section.index("<td>chat</td>")
    code = section.split("<td>code</td>", 1)[1].split("</tr>", 1)[0]
    assert "<td>25.0%</td>" in code and "<td>2.00</td>" in code and code.endswith("x</td>")  # its own speedup
    assert "counted as other" not in section
    clock = Clock()
    folding = Hub(clock=clock, max_classes=2)
    feed(folding, clock, 1, 3)  # speculative steps, and a request of its prompt-length bucket (one of the 2)
    for i, name in enumerate(["a", "b", "c"]):
        record(folding, f"r{i}", name, (1, 1))
    page, _ = render(Report("classes", "hub", [EngineReport("engine", folding.snapshot())]))
    assert "2 more class names were counted as other" in page and "<td>other</td>" in page


def test_report_says_n_a_without_traffic_classes(tmp_path: Path) -> None:
    from specscope.read.report import load, render

    rec = tmp_path / "run.jsonl"
    recorded_engine(rec)  # steps only: no finished requests, so no classes
    page, figures = render(load(str(rec)))
    section = page.split("<h3>Acceptance by traffic class</h3>", 1)[1]
    assert section.startswith('<p class="na">n/a: no finished requests with a traffic class')
    assert not any(k.endswith("-classes") for k in figures)
