"""A server scaled as in production: ``vllm serve --data-parallel-size 2``, which starts two engines and, by
vLLM's default, two API-server processes (``--api-server-count 2``), each getting a share of the requests.

Each engine has its own counters, gauges and KV cache (vLLM's ``engine`` label); specscope's numbers are the
server's, engine by engine, equal to vLLM's own per-engine counters, from whichever API-server process answers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, spec_config, start_prometheus
from tests.e2e.test_server import launch, server_command, stop, wait_up

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def fleet(tiny: Any, engines: Any, tmp_path_factory: Any) -> Iterator[tuple[tuple[str, int, Path], str]]:
    """``((url, specscope's port, log), other url)``: the data-parallel server with specscope, and the fleet's
    second member, a plain single-engine vLLM without specscope; started together, so that their starts overlap."""
    engines.close()
    port, prom, other_port = free_port(), free_port(), free_port()
    root = tmp_path_factory.mktemp("scaled")
    # No SPECSCOPE_SHARE_DIR: the share directory is named by vllm serve (specscope's general plugin) and
    # inherited by its API-server processes, as in production; none a test process named may leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSCOPE_")} | {
        "VLLM_PLUGINS": "specscope", "SPECSCOPE_PROMETHEUS_PORT": str(prom)}
    # A small token budget: the long prompts below are prefilled in chunks, beside other requests' decode steps.
    cmd = server_command(str(tiny["target"]), spec_config(tiny, "noise2"), port, "--data-parallel-size", "2",
                         "--max-num-batched-tokens", "128", "--max-num-seqs", "16")
    other_cmd = server_command(str(tiny["target"]), spec_config(tiny, "noise10"), other_port)
    proc = launch(cmd, env, root / "server.log")
    other = launch(other_cmd, {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"} | {"VLLM_PLUGINS": ""},
                   root / "other.log")
    try:
        wait_up(proc, cmd, root / "server.log")
        wait_up(other, other_cmd, root / "other.log")
        yield (f"http://127.0.0.1:{port}", prom, root / "server.log"), f"http://127.0.0.1:{other_port}"
    finally:
        stop(proc)
        stop(other)


@pytest.fixture(scope="module")
def scaled(fleet: tuple[tuple[str, int, Path], str]) -> tuple[str, int, Path]:
    """The data-parallel server: ``(url, specscope's Prometheus port, its log)``."""
    return fleet[0]


def per_engine(page: str) -> dict[str, dict[str, float]]:
    """vLLM's spec-decode counters by engine label."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name.startswith("vllm:spec_decode") and "engine" in s.labels:
                key = s.name + (f"[{s.labels['position']}]" if "position" in s.labels else "")
                row = out.setdefault(s.labels["engine"], {})
                row[key] = row.get(key, 0.0) + s.value
    return out


def test_each_engine_equals_vllms_own_counters(scaled: tuple[str, int, Path], tmp_path: Path) -> None:
    url, prom, log_path = scaled
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "max_tokens": 24, "temperature": 0, "ignore_eos": True}

    def complete(i: int) -> str:
        # Every fourth prompt is long (~300 tokens): three chunks, the first two ending no prefill.
        prompt = " ".join(f"river stone {100 * i + j} garden" for j in range(25 if i % 4 == 1 else 1))
        r = httpx.post(f"{url}/v1/completions", json={**body, "prompt": prompt}, timeout=180)
        r.raise_for_status()
        return str(r.json()["id"])

    with ThreadPoolExecutor(8) as pool:  # concurrent: both engines get work
        ids = list(pool.map(complete, range(16)))
    import time

    time.sleep(3)  # the engines' last steps reach the stat logger
    vllm = per_engine(httpx.get(f"{url}/metrics", timeout=10).text)
    assert set(vllm) == {"0", "1"} and all(v["vllm:spec_decode_num_drafts_total"] > 0 for v in vllm.values())
    for _ in range(6):  # new connections: the kernel hands them to either API-server process
        snap = httpx.get(f"{url}/specscope/snapshot", timeout=10).json()
        assert snap["processes"] == 2  # each process answers with both processes' numbers
        assert snap["engine"]["data_parallel_size"] == 2  # where vLLM drops a per-batch-size schedule
        engines = {str(e["index"]): e["lifetime"]["spec"] for e in snap["engines"]}
        for index, counts in vllm.items():
            assert engines[index]["drafts"] == counts["vllm:spec_decode_num_drafts_total"], index
            assert engines[index]["draft_tokens"] == counts["vllm:spec_decode_num_draft_tokens_total"], index
            assert engines[index]["accepted"] == counts["vllm:spec_decode_num_accepted_tokens_total"], index
            per_pos = [counts[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] for i in range(4)]
            assert engines[index]["accepted_per_pos"] == per_pos, index
        records = {r["request_id"] for r in snap["requests"]}
        assert records == {f"{i}-0" for i in ids}  # every request once
        # Each engine's target forward, timed in its worker and read by one process, once. A step's requests are
        # split between the two processes, and its stats go to one of them: read from the engine-wide counts, each
        # pure decode step is at the batch size whose forward it ran (one forward each, at least as many), and none
        # that ran a prompt chunk is taken for one (5 or more an engine here; 1 to 3 before they were read so).
        # The forward is part of the step: over the engine's steps, not per batch size, where two or three steps
        # and forwards, not all the same ones, are averaged on a loaded machine (a CI run: 9.3 ms forwards beside
        # 7.7 ms steps at one batch size, 4.8 ms beside 26.8 ms at the next).
        for e in snap["engines"]:
            rows = e["lifetime"]["step_times"]["times"]
            timed = [t for t in rows if t["forwards"] and t["steps"]]
            assert sum(t["steps"] for t in rows) >= 5 and all(t["forwards"] >= t["steps"] for t in rows) and all(
                t["forward_s"] > 0 and t["batch_size"] <= t["forward_tokens"] <= 5 * t["batch_size"]
                for t in timed) and sum(t["steps"] * t["forward_s"] for t in timed) < sum(
                t["steps"] * t["mean_s"] for t in timed), [
                (t["batch_size"], t["steps"], round(1e3 * t["mean_s"], 2), t["forwards"],
                 round(1e3 * t["forward_s"], 2), t["forward_tokens"]) for t in rows]

        assert snap["kv"]["block_usage"] is None or 0 <= snap["kv"]["block_usage"] <= 1
    # The Prometheus port (served by one of the processes): the whole server's numbers, one series per engine,
    # and every request once.
    from specscope.export.catalogue import exported_name

    samples = [s for fam in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{prom}/metrics",
                                                                      timeout=10).text) for s in fam.samples]
    ours = {s.labels.get("engine"): s.value for s in samples if s.name == "specscope_spec_decode_draft_tokens_total"}
    assert ours == {i: v["vllm:spec_decode_num_draft_tokens_total"] for i, v in vllm.items()}
    duration = exported_name("gen_ai.server.request.duration")
    assert sum(s.value for s in samples if s.name == f"{duration}_count") == len(ids)
    # What sharing cannot do is said once, by one process, through the directory vllm serve named: private, and
    # under a name nobody could have guessed.
    log = log_path.read_text()
    assert log.count("2 API-server processes share their numbers") == 1
    share = Path(re.search(r"share their numbers through (\S+?);", log).group(1))  # type: ignore[union-attr]
    assert re.fullmatch(rf"specscope-{os.geteuid()}-[0-9a-f]{{32}}", share.name), share
    assert share.is_dir() and stat.S_IMODE(share.stat().st_mode) == 0o700
    forwards = sorted((share / "forward").iterdir())
    assert [f.name for f in forwards] == ["0.forward.json", "1.forward.json"]
    assert stat.S_IMODE((share / "forward").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in forwards)
    # The unmodified-vLLM source reads the engines apart, and averages their KV usage instead of adding it.
    from specscope.read.scrape import vllm_source

    vsnap = vllm_source(url).fetch()
    assert [e.index for e in vsnap.engines] == [0, 1]
    assert [e.lifetime.spec.draft_tokens for e in vsnap.engines] == [  # type: ignore[union-attr]
        vllm[i]["vllm:spec_decode_num_draft_tokens_total"] for i in ("0", "1")]
    assert vsnap.kv.block_usage is None or vsnap.kv.block_usage <= 1.0
    json.dumps(snap)  # a valid document end to end


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus not installed")
def test_prometheus_fleet_reads_each_engine_as_vllm_counts_it(fleet: tuple[tuple[str, int, Path], str],
                                                              tmp_path: Path) -> None:
    """`top --prometheus`: a real Prometheus scraping two real vLLM servers (the data-parallel one, and a plain
    single-engine vLLM without specscope) and the first one's specscope endpoint. Every replica's engines equal
    that server's own per-engine counters (read after the scrape that Prometheus holds); specscope's replica
    equals them too, and adds what only specscope knows."""
    import time

    from specscope.read.prometheus_source import PrometheusFleet

    (url, specscope_port, _), other_url = fleet
    model = httpx.get(f"{other_url}/v1/models", timeout=10).json()["data"][0]["id"]
    r = httpx.post(f"{other_url}/v1/completions", timeout=120, json={
        "model": model, "prompt": ["river stone", "garden light"], "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    hosts = {"vllm": url.removeprefix("http://"), "other": other_url.removeprefix("http://"),
             "specscope": f"127.0.0.1:{specscope_port}"}
    prom, proc = start_prometheus(hosts, tmp_path)
    try:
        time.sleep(2.5)  # idle servers: counters no longer move, the stored scrape equals the page
        sources = {s.name.split("/")[0]: s for s in PrometheusFleet(prom).sources()}
        assert set(sources) == set(hosts)
        for job, server in (("vllm", url), ("other", other_url)):
            snap = sources[job].fetch()
            vllm = per_engine(httpx.get(f"{server}/metrics", timeout=10).text)
            assert [str(e.index) for e in snap.engines] == sorted(vllm), job
            for e in snap.engines:
                counts = vllm[str(e.index)]
                assert e.lifetime.spec is not None
                assert e.lifetime.spec.drafts == counts["vllm:spec_decode_num_drafts_total"] > 0, job
                assert e.lifetime.spec.accepted == counts["vllm:spec_decode_num_accepted_tokens_total"], job
        assert [e.index for e in sources["vllm"].fetch().engines] == [0, 1]
        ours = sources["specscope"].fetch()
        vllm = per_engine(httpx.get(f"{url}/metrics", timeout=10).text)
        assert [e.index for e in ours.engines] == [0, 1]
        for e in ours.engines:
            assert e.lifetime.spec is not None
            assert e.lifetime.spec.drafts == vllm[str(e.index)]["vllm:spec_decode_num_drafts_total"]
        assert ours.engine.draft_model and ours.engine.method == "draft_model"
        assert ours.tokenizer is not None and ours.tokenizer.verdict in ("identical", "compatible")
    finally:
        proc.terminate()
        proc.wait(30)
