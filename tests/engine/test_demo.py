"""`specscope demo --headless`: the README's main job, on the real engine, from scenario to alert."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specscope.demo import SCENARIOS
from specscope.fleet import Target
from specscope.tui.record import Player, ReplaySource
from tests.conftest import user_env

pytestmark = pytest.mark.engine


def test_headless_demo_fires_what_each_scenario_is_about(engines: Any, tmp_path: Path) -> None:
    engines.close()  # two cores: the demo runs its own engines
    rec = tmp_path / "demo.jsonl"
    r = subprocess.run([sys.executable, "-m", "specscope.cli", "demo", "--headless", "--record", str(rec)],
                       capture_output=True, text=True, timeout=600, env=user_env())  # as a newcomer runs it
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    # The screen keeps specscope's lines; vLLM's and torch's logs go to the file the demo names at the end.
    log = Path(re.findall(r"engine log: (\S+)", out)[-1])
    assert "INFO" in log.read_text() and not re.search(r"INFO|WARNING|Loading safetensors|it/s\]", out), out
    assert len(out.splitlines()) < 150 and "INFO" not in r.stderr, r.stderr[-3000:]
    sections = dict(re.findall(r"\n== ([^\n]+)\n(.*?)(?=\n== |\ndemo finished)", out, re.S))
    fired = {name: re.search(r"alerts fired: (.*)", text).group(1) for name, text in sections.items()}  # type: ignore[union-attr]
    good, weak = SCENARIOS[2], SCENARIOS[3]
    assert "SpecscopeTokenizerMismatch" in fired["tokenizer check"]
    assert "SpecscopeWeakDraft" in fired[weak]
    # The good draft is never weak (at batch 16 it may stop paying, which the demo shows: not-paying can fire there).
    assert "SpecscopeWeakDraft" not in fired[good] and "SpecscopeAcceptanceCollapse" not in fired[good]
    assert fired["baseline (no speculation)"] == "none"
    # Two classes of traffic: the engine-wide acceptance is fine, the class the draft fails on alerts.
    classes = sections[SCENARIOS[4]]
    rules = set(fired[SCENARIOS[4]].split(", "))
    assert "SpecscopeWeakDraftForClass" in rules and "SpecscopeWeakDraft" not in rules, rules
    assert re.search(r"classes  hard [\d.]+% .* easy [\d.]+%", classes), classes
    # The good draft pays at batch 1, measured and predicted; its estimate is lower at batch 16 than at batch 1.
    # The story the README tells: about 2x at batch 1, much less at batch 16, predicted within 10% at both, and no
    # "not paying" alert on a draft that measures 1.05x or more wherever it ran.
    measured = {int(b): float(x) for b, x in re.findall(r"good draft at batch (\d+): measured ([\d.]+)x", out)}
    predicted = {int(b): float(x) for b, x in re.findall(
        r"good draft at batch (\d+): measured [\d.]+x, specscope predicted ([\d.]+)x", out)}
    # About 2x at batch 1 on a quiet machine (2.1-2.5x); 1.65x (rounds 1.98x, 1.64x, 1.65x) in a CI run on a slow day.
    assert measured[1] > 1.5 and measured[16] < 0.8 * measured[1], out
    assert all(predicted[b] == pytest.approx(measured[b], rel=0.10) for b in (1, 16)), out
    if min(measured.values()) >= 1.05:
        assert "SpecscopeSpeculationNotPaying" not in fired[good], out
    by_batch = dict(re.findall(r"(\d+): ([\d.]+)x", re.search(r"by batch size (.*?);", sections[
        good]).group(1)))  # type: ignore[union-attr]
    assert float(by_batch["1"]) > 1.2 and float(by_batch["1"]) > float(by_batch["16"])
    # The recording it made replays into the same final numbers.
    player = Player(rec)
    assert set(player.targets) == set(sections)
    target = Target(ReplaySource(player, weak))
    player.advance(1e9)
    target.poll()
    assert target.snapshot is not None and target.snapshot.lifetime.spec is not None
    assert target.snapshot.lifetime.spec.acceptance_rate < 0.3  # type: ignore[operator]
