"""A dashboard fed from the fixed recording of a real demo run (tests/fixtures/demo-recording.jsonl.gz)."""

from __future__ import annotations

import pytest

from specscope.export.alerts.rules import Thresholds
from specscope.read.fleet import Target
from specscope.read.tui.app import TopApp
from specscope.read.tui.record import Player, ReplaySource
from tests.conftest import FIXTURES

RECORDING = FIXTURES / "demo-recording.jsonl.gz"
#: The demo's alert settings (short waits), so the recording's alerts come alive.
DEMO = Thresholds(weak_draft_min_draft_tokens=100, weak_draft_for_s=3, keep_firing_for_s=600,
                  fragmentation_for_s=5, kv_pressure_for_s=5, collapse_for_s=5, divergence_for_s=5, window_s=10)


def replay_app(seconds: float, only: str | None = None) -> TopApp:
    """The dashboard over the recording, played ``seconds`` in (one poll per recorded snapshot up to there)."""
    player = Player(RECORDING)
    names = [n for n in player.targets if only is None or n == only]
    targets = [Target(ReplaySource(player, n), DEMO) for n in names]
    app = TopApp(targets, interval=0, window_s=10.0, player=player, thresholds=DEMO)
    end = player.position + seconds
    while not player.finished and player.position < end:
        player.step()
        app.poll_now()
    player.paused = True
    return app


@pytest.fixture
def anyio_backend() -> str:
    """Pilot tests run on asyncio (Textual's loop)."""
    return "asyncio"

