"""``specscope compare``: two in-process hubs behind specscope's real endpoint, fed request records (no engine)."""

from __future__ import annotations

import contextlib
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specscope.cli import main
from specscope.core.model import CostRatio, EngineInfo
from specscope.export.alerts import canary as rule
from specscope.export.endpoint import Endpoint
from specscope.read.compare import Comparison, Replica
from specscope.read.scrape import EndpointSource
from specscope.state.hub import Hub
from tests.conftest import free_port
from tests.read.tui.helpers import Clock
from tests.verdict.test_verdict import SETUP, steps, with_baseline

#: Per-request acceptance of each class on each replica: (mean, standard deviation) of a Beta.
GOOD = {"chat": (0.6, 0.15), "code": (0.3, 0.15)}
WORSE = {"chat": (0.45, 0.15), "code": (0.15, 0.1)}


def feed(hub: Hub, n: int, means: dict[str, tuple[float, float]], seed: int, start: int = 0) -> None:
    """``n`` finished requests, 70% chat and 30% code, 40 draft tokens each, acceptance drawn per request."""
    rng = random.Random(seed)
    for i in range(start, start + n):
        cls = "chat" if rng.random() < 0.7 else "code"
        mean, sd = means[cls]
        k = mean * (1 - mean) / sd**2 - 1
        acc = rng.betavariate(mean * k, (1 - mean) * k)
        hub.requests.record(f"req-{i}", prompt_tokens=20, generation_tokens=40, num_spec_tokens=4, spec_steps=10,
                            draft_tokens=40, accepted_tokens=round(40 * acc), traffic_class=cls)


def replica_hub(draft: str, model: str = "tiny-target") -> Hub:
    hub = Hub()
    hub.set_engine(EngineInfo(model=model, draft_model=draft, method="draft_model", num_speculative_tokens=4))
    return hub


@pytest.fixture
def served() -> Iterator[tuple[Hub, Hub, str, str]]:
    """The incumbent's hub and the candidate's, each behind its endpoint on 127.0.0.1."""
    a, b = replica_hub("draft-v1"), replica_hub("draft-v2")
    ea, eb = Endpoint(a.snapshot, port=0), Endpoint(b.snapshot, port=0)
    yield a, b, ea.url, eb.url
    ea.close()
    eb.close()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_once_prints_the_table_the_decision_and_the_alert(served: tuple[Hub, Hub, str, str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a, b, url_a, url_b = served
    feed(a, 600, GOOD, 1)
    feed(b, 600, WORSE, 2)
    code, out, err = run(capsys, url_a, url_b, "--once")
    assert code == 1 and not err  # SpecscopeCanaryWorse fires: exit 1
    lines = out.splitlines()
    assert "target tiny-target" in lines[0]
    assert f"incumbent {url_a} (draft draft-v1, K=4)" in out and f"candidate {url_b} (draft draft-v2, K=4)" in out
    row = next(line for line in lines if line.startswith("all traffic"))
    assert row.split()[-1] == "worse" and "600/600" in row
    assert any(line.startswith("chat") for line in lines) and any(line.startswith("code") for line in lines)
    assert "all traffic at α=2.50%, each of the first 4 classes at α=0.62%" in out
    assert "incumbent n/a (no estimate measured against a baseline" in out  # each replica's own, absent here
    assert f"alert {rule.ALERT} FIRING" in out and "(all traffic)" in out


def test_once_json_follows_the_documented_schema(served: tuple[Hub, Hub, str, str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    a, b, url_a, url_b = served
    feed(a, 500, GOOD, 3)
    feed(b, 500, GOOD, 4)  # the same draft quality: nothing to decide
    code, out, _ = run(capsys, url_a, url_b, "--once", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"time", "target", "alpha", "method", "overall_alpha", "class_alpha", "incumbent",
                        "candidate", "decision", "rows", "alert", "notes"}
    assert doc["target"] == "tiny-target" and doc["alpha"] == 0.05 and doc["decision"] == "not yet known"
    assert set(doc["incumbent"]) == {"url", "draft_model", "method", "k", "requests", "missed", "error", "speedup"}
    assert doc["incumbent"]["requests"] == doc["candidate"]["requests"] == 500
    overall, *classes = doc["rows"]
    assert overall["class"] is None and overall["share"] == 1.0 and overall["alpha"] == 0.025
    assert {c["class"] for c in classes} == {"chat", "code"} and all(c["alpha"] == 0.00625 for c in classes)
    for r in doc["rows"]:
        assert set(r) == {"class", "share", "incumbent", "candidate", "alpha", "difference", "interval", "decision",
                          "crossed"}
        lo, hi = r["interval"]
        assert lo <= r["difference"] <= hi and lo < 0 < hi
        assert set(r["incumbent"]) == {"requests", "mean", "sd", "interval"}
    assert doc["alert"] == {"name": rule.ALERT, "firing": False, "min_class_share": 0.1, "classes": []}


def test_each_replica_shows_its_own_speedup_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    hubs = []
    for i, accepted in enumerate((3, 1)):  # of 4 draft tokens a step
        hub = Hub(clock=clock, window_s=3600)
        hub.set_engine(EngineInfo(model="/m/target", draft_model=f"d{i}", num_speculative_tokens=4,
                                  method="draft_model", setup=SETUP))
        hub.set_cost_ratio(CostRatio(0.25, "estimated from parameters per token", 100, 25))
        steps(hub, clock, 1, 0.008, 60, accepted=accepted, prefill_s=0.004)
        with_baseline(hub, tmp_path)
        feed(hub, 50, GOOD, i)
        hubs.append(hub)
    endpoints = [Endpoint(h.snapshot, port=0) for h in hubs]
    try:
        code, out, _ = run(capsys, endpoints[0].url, endpoints[1].url, "--once")
        _, doc, _ = run(capsys, endpoints[0].url, endpoints[1].url, "--once", "--json")
    finally:
        for e in endpoints:
            e.close()
    assert code == 0
    text = out[out.index("speedup for this traffic, each replica's own estimate (not a comparison)"):]
    assert text.count("x [") == 2
    speedups = [json.loads(doc)[r]["speedup"] for r in ("incumbent", "candidate")]
    assert all(s is not None and s["interval"][0] <= s["speedup"] <= s["interval"][1] for s in speedups)
    assert speedups[0]["speedup"] > speedups[1]["speedup"]  # 3 of 4 accepted against 1 of 4


def test_bad_input_is_one_line_and_exit_2(served: tuple[Hub, Hub, str, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    _, _, url_a, url_b = served
    other = replica_hub("draft-v2", model="another-target")
    e = Endpoint(other.snapshot, port=0)
    closed = f"http://127.0.0.1:{free_port()}"
    try:
        cases = [
            ([closed, url_b, "--once"], f"incumbent {closed} cannot be read"),
            ([url_a, closed], f"candidate {closed} cannot be read"),
            ([url_a, e.url, "--once"], "the replicas serve different targets (incumbent tiny-target, candidate "
                                       "another-target)"),
            ([url_a, url_a + "/", "--once"], "the incumbent and the candidate are the same endpoint"),
            ([url_a, url_b, "--once", "--fresh"], "--once reads what the endpoints hold now"),
            ([url_a, url_b, "--alpha", "1.5"], "--alpha is a probability between 0 and 1"),
            ([url_a, "http://[::1"], "replica 'http://[::1' is not a URL"),
        ]
        for args, message in cases:
            code, out, err = run(capsys, *args)
            assert code == 2 and not out, args
            assert len(err.strip().splitlines()) == 1 and err.startswith("specscope: error: "), err
            assert message in err, err
    finally:
        e.close()


def test_live_view_counts_each_request_once_decides_and_serves_the_gauges(
        served: tuple[Hub, Hub, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refreshing every 0.1 s while requests finish: counts grow without double counting, the decision comes when
    the evidence does, the alert goes to the JSON-lines notifier, the gauges say the same to Prometheus."""
    a, b, url_a, url_b = served
    feed(a, 20, GOOD, 5)
    feed(b, 20, WORSE, 6)
    port = free_port()
    alerts = tmp_path / "alerts.jsonl"
    result: dict[str, int] = {}
    args = ["compare", url_a, url_b, "--json", "--interval", "0.1", "--until-decided", "--duration", "60",
            "--metrics-port", str(port), "--alerts-jsonl", str(alerts)]
    thread = threading.Thread(target=lambda: result.setdefault("code", main(args)))
    thread.start()
    scraped = ""
    for i in range(30):  # 600 more requests each, 20 at a time
        feed(a, 20, GOOD, 100 + i, start=20 + 20 * i)
        feed(b, 20, WORSE, 200 + i, start=20 + 20 * i)
        time.sleep(0.05)
        if not scraped:
            with contextlib.suppress(httpx.HTTPError):
                scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    thread.join(60)
    assert not thread.is_alive() and result["code"] == 1  # decided worse: the alert fires
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    counts = [d["incumbent"]["requests"] for d in docs]
    assert counts == sorted(counts) and counts[-1] <= 620 and docs[0]["decision"] == "not yet known"
    assert docs[-1]["decision"] == "worse" and docs[-1]["alert"]["firing"]
    assert all(d["incumbent"]["missed"] == 0 for d in docs)
    fired = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert fired[0]["rule"] == rule.ALERT and fired[0]["state"] == "firing"
    assert fired[0]["labels"] == {"candidate": url_b, "incumbent": url_a}
    # Scraped while it ran: not yet known, or worse already where the machine was slow to answer.
    assert re.search(rf'{rule.DECISION}{{candidate="{url_b}",incumbent="{url_a}",traffic_class=""}} (0\.0|-1\.0)\n',
                     scraped), scraped
    assert f'{rule.REQUESTS}{{candidate="{url_b}",incumbent="{url_a}",replica="incumbent"}}' in scraped


def test_the_gauges_and_the_alert_after_a_decision(served: tuple[Hub, Hub, str, str]) -> None:
    a, b, url_a, url_b = served
    feed(a, 800, GOOD, 7)
    feed(b, 800, WORSE, 8)
    c = Comparison((Replica("incumbent", EndpointSource(url_a)), Replica("candidate", EndpointSource(url_b))))
    assert c.start() is None
    labels, readings = c.readings()
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(rule.CanaryCollector(c.readings))
    text = generate_latest(registry).decode()
    assert labels == {"incumbent": url_a, "candidate": url_b}
    lab = f'candidate="{url_b}",incumbent="{url_a}"'
    assert f'{rule.DECISION}{{{lab},traffic_class=""}} -1.0' in text
    assert f'{rule.DECISION}{{{lab},traffic_class="chat"}} -1.0' in text
    assert f'{rule.SHARE}{{{lab},traffic_class="chat"}}' in text
    assert f'{rule.DIFFERENCE}{{bound="high",{lab},traffic_class=""}}' in text
    assert [r.traffic_class for r in readings if rule.fires(r)] == [None, "chat", "code"]
    # More requests, counted once each; a poll with nothing new changes nothing.
    feed(a, 10, GOOD, 9, start=800)
    assert c.refresh() is None and c.refresh() is None
    assert c.counted == [810, 800]


def test_a_changed_draft_restarts_the_comparison(served: tuple[Hub, Hub, str, str]) -> None:
    a, b, url_a, url_b = served
    feed(a, 800, GOOD, 10)
    feed(b, 800, WORSE, 11)
    c = Comparison((Replica("incumbent", EndpointSource(url_a)), Replica("candidate", EndpointSource(url_b))))
    assert c.start() is None and c.firing
    b.set_engine(EngineInfo(model="tiny-target", draft_model="draft-v3", method="draft_model",
                            num_speculative_tokens=4))
    feed(b, 5, GOOD, 12, start=800)
    assert c.refresh() is None
    assert "the candidate's engine changed (draft draft-v2 K=4 -> draft draft-v3 K=4)" in c.notes[0]
    assert c.rows[0].decision == "not yet known" and not c.firing  # resolved: a fresh comparison
    assert c.counted == [0, 5]
